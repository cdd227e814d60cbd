"""Weight pushes to `r2vpo serve`, a LoRA adapter (PEFT folder) against the
same policy merged into a full Hugging Face folder: bytes on disk and the
server's time to take each (POST /update_weights_from_disk until it
answers), alternated push by push so a drift in the machine's speed moves
both alike. Prints a Markdown table and writes it as JSON.

    python3 scripts/lora/push_bench.py --bin target/release/r2vpo \
        --base .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --adapter RUN/model --full MERGED --pushes 5 --out runs/bench/push.json

ADAPTER is what `llm train` exports with [model.lora]; FULL is `r2vpo llm
merge` of it. The server starts on a free loopback port and is stopped by
PID. Standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/r2vpo")
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--full", required=True)
    ap.add_argument("--pushes", type=int, default=5)
    ap.add_argument("--out", default="runs/bench/push.json")
    a = ap.parse_args()
    server = subprocess.Popen([a.bin, "serve", "--model", a.base, "--host", "127.0.0.1", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = None
        for line in server.stdout:
            if "http://127.0.0.1:" in line:
                url = "http://127.0.0.1:" + line.split("http://127.0.0.1:")[1].split()[0].rstrip("/")
                break
        if url is None:
            sys.exit("push_bench: the server printed no address")

        def push(path, version):
            body = json.dumps({"model_path": os.path.abspath(path), "weight_version": version}).encode()
            req = urllib.request.Request(url + "/update_weights_from_disk", data=body,
                                         headers={"Content-Type": "application/json"})
            t0 = time.perf_counter()
            with urllib.request.urlopen(req, timeout=600) as r:
                reply = json.load(r)
            dt = time.perf_counter() - t0
            if not reply.get("success"):
                sys.exit(f"push_bench: {path} refused: {reply}")
            return dt

        push(a.full, "warm-full")
        push(a.adapter, "warm-adapter")
        times = {"adapter": [], "full": []}
        for i in range(a.pushes):
            times["adapter"].append(push(a.adapter, f"a{i}"))
            times["full"].append(push(a.full, f"f{i}"))
    finally:
        server.terminate()
        server.wait(timeout=30)
    ratios = [x / y for x, y in zip(times["adapter"], times["full"])]
    res = {
        "base": a.base,
        "adapter_bytes": folder_bytes(a.adapter),
        "full_bytes": folder_bytes(a.full),
        "adapter_s": statistics.median(times["adapter"]),
        "full_s": statistics.median(times["full"]),
        "times_s": times,
        "ratio_s": statistics.median(ratios),
        "ratio_min_max": [min(ratios), max(ratios)],
    }
    print(f"weight pushes to r2vpo serve ({a.base}), median of {a.pushes}, alternated")
    print("| push | bytes | seconds |\n|---|---|---|")
    print(f"| adapter (PEFT) | {res['adapter_bytes']:,} | {res['adapter_s']:.3f} |")
    print(f"| full (merged) | {res['full_bytes']:,} | {res['full_s']:.3f} |")
    print(f"| adapter / full | {res['adapter_bytes'] / res['full_bytes']:.4f} | {res['ratio_s']:.3f} "
          f"(pairs {min(ratios):.3f}-{max(ratios):.3f}) |")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".tmp", "w") as f:
        json.dump(res, f, indent=2)
    os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
