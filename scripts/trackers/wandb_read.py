"""wandb_read.py PATH...: print an offline W&B run's history as JSON, without network.

PATH is a run directory (wandb/offline-run-DATE-ID), its run-ID.wandb file, or a
`wandb` directory holding several; the parts of a resumed run (one directory per
wandb.init, same id) are read in start-time order and merged. Prints
{"id": ..., "history": [{"_step": 0, "loss": ...}, ...], "files": [...], "exit_code": ...}
as strict JSON (NaN and infinities as the strings "NaN", "Infinity", "-Infinity").
wandb 0.31 has no reader of its own (the Go core writes the file; `wandb sync`
only uploads): a .wandb file is a LevelDB log (32 KiB blocks of records with a
7-byte header: crc32c, uint16 length, type FULL=1/FIRST=2/MIDDLE=3/LAST=4)
after a 7-byte ':W&B' header, whose records are wandb.proto Record messages.
"""
import glob, json, math, os, struct, sys
from wandb.proto.wandb_internal_pb2 import Record

def records(path):
    data, pos, buf = open(path, "rb").read(), 7, b""
    assert data[:4] == b":W&B", f"{path} is not a .wandb file"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # block trailer: padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 or len(chunk) < length:  # zero padding, or a torn write at the end
            break
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = Record(); rec.ParseFromString(buf); yield rec

def value(item):  # wandb 0.31 writes value_json; the typed oneof is for newer writers
    kind = item.WhichOneof("value")
    if kind is None or kind == "json":
        v = json.loads(item.json if kind else item.value_json or "null")
    else:
        v = None if kind == "none" else getattr(item, kind)
    return v if not isinstance(v, float) or math.isfinite(v) else json.dumps(v)  # "NaN", "Infinity"

found = [p for a in sys.argv[1:] for p in ([a] if a.endswith(".wandb") else glob.glob(f"{a}/**/*.wandb", recursive=True))]
paths = {os.path.realpath(p): None for p in found}  # wandb/latest-run links to the newest part
parts = [list(records(p)) for p in paths]
parts.sort(key=lambda rs: next((r.run.start_time.ToNanoseconds() for r in rs if r.HasField("run")), 0))
out = {"id": None, "history": [], "files": [], "exit_code": None}
for rs in parts:
    for r in rs:
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out["id"] = r.run.run_id
        elif kind == "history":
            out["history"].append({(it.key or "/".join(it.nested_key)): value(it) for it in r.history.item})
        elif kind == "files":
            out["files"] += [f.path for f in r.files.files]
        elif kind == "exit":
            out["exit_code"] = r.exit.exit_code
print(json.dumps(out))
