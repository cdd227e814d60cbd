"""W&B sidecar for the Rust trainer: JSON lines on stdin drive `wandb`.

W&B's only client is the `wandb` Python package (its Go core is internal), so
the trainer spawns this with .deps/venv-trackers' python and writes one JSON
object a line:
  {"op":"init","project":P,"name":N,"id":ID|null,"dir":D,"config":{...},"resume":bool,"mode":M|null,
   "init_timeout":SECONDS?}  (online, wandb retries an unreachable server for init_timeout, 90 s default)
      -> prints {"ok":true,"id":RUN_ID,"dir":RUN_DIR}, or {"ok":false,"error":...} and exits 1
  {"op":"log","step":S,"metrics":{"name":number,...}}      (no reply)
  {"op":"config","config":{...}}  update the run's config (no reply)
  {"op":"file","path":F,"name":REL?}  attach a copy of F as it is now, as REL (default: F's
      file name) under the run's files (RUN_DIR/files; offline, uploaded by `wandb sync`)
  {"op":"finish","exit_code":C}  -> prints {"ok":true} and exits 0
EOF on stdin (the trainer died) finishes the run with exit code 1. Only these
replies go to stdout; wandb's own output and every warning go to stderr (fd 1
is pointed at fd 2, so wandb-core, which inherits it, cannot write there
either). SIGINT is ignored: a Ctrl-C in the trainer's terminal reaches this
process group too, and the run must still be finished by the trainer's
`finish` or by EOF. A bad line is reported on stderr and skipped: tracking
must never stop training.
"""
import json, os, shutil, signal, sys

signal.signal(signal.SIGINT, signal.SIG_IGN)
reply = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
os.environ.setdefault("WANDB_SILENT", "true")
import wandb  # noqa: E402  (after the redirection: wandb starts its core process at init)

def send(obj):
    reply.write(json.dumps(obj) + "\n")
    reply.flush()

run = None
for line in sys.stdin:
    try:
        msg = json.loads(line)
        op = msg["op"]
        if op == "init":
            timeout = {"init_timeout": msg["init_timeout"]} if msg.get("init_timeout") else {}
            try:
                run = wandb.init(project=msg["project"], name=msg.get("name"), id=msg.get("id"),
                                 dir=msg.get("dir"), config=msg.get("config") or {},
                                 resume="allow" if msg.get("resume") else None, mode=msg.get("mode"),
                                 settings=wandb.Settings(console="off", silent=True, x_save_requirements=False,
                                                         x_stats_pid=os.getppid(), **timeout))
            except BaseException as e:  # wandb raises CommError, UsageError, TimeoutError, ...
                send({"ok": False, "error": f"{type(e).__name__}: {e}"})
                sys.exit(1)
            send({"ok": True, "id": run.id, "dir": os.path.dirname(run.dir)})
        elif op == "log":
            run.log(msg["metrics"], step=msg["step"])
        elif op == "config":
            run.config.update(msg["config"], allow_val_change=True)
        elif op == "file":  # a copy, as the file is now: run.save alone links to the source
            dest = os.path.join(run.dir, msg.get("name") or os.path.basename(msg["path"]))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(msg["path"], dest)
            run.save(dest, base_path=run.dir, policy="now")
        elif op == "finish":
            run.finish(exit_code=msg.get("exit_code", 0))
            send({"ok": True})
            sys.exit(0)
        else:
            raise ValueError(f"unknown op {op!r}")
    except Exception as e:
        print(f"wandb_sidecar: skipped {line.strip()[:200]!r}: {type(e).__name__}: {e}", file=sys.stderr)
if run is not None:
    run.finish(exit_code=1)
