#!/usr/bin/env python3
"""Fetch, verify and unpack the pinned third-party artefacts listed in deps.toml.

Run by `make deps`; `make build-gpu` runs it with `--manifest deps-gpu.toml`. Idempotent: a wheel whose extracted files and stamp are in
place is skipped without touching the network. Every wheel is checked against
its pinned sha256 before anything is extracted; a mismatch deletes the download
and fails. Nothing else in r2vpo downloads anything.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEPS = ROOT / ".deps"
WHEELS = DEPS / "wheels"


def die(msg: str) -> "None":
    print(f"deps: error: {msg}", file=sys.stderr)
    sys.exit(1)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def stamp_path(w: dict) -> Path:
    return DEPS / f".stamp-{w['name']}-{w['version']}-{w['sha256'][:16]}"


def expected_outputs(w: dict) -> bool:
    stamp = stamp_path(w)
    if not stamp.exists():
        return False
    for rel in stamp.read_text().splitlines():
        if rel and not (DEPS / rel).exists():
            return False
    return True


def download(w: dict) -> Path:
    WHEELS.mkdir(parents=True, exist_ok=True)
    target = WHEELS / w["file"]
    if target.exists() and sha256(target) == w["sha256"]:
        return target
    if shutil.which(sys.executable) is None:
        die("python3 not found")
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True)
    if probe.returncode != 0:
        die(f"pip is not available for {sys.executable} ({probe.stderr.strip()}); install it, e.g. `apt-get install python3-pip`")
    spec = f"{w['name']}=={w['version']}"
    print(f"deps: downloading {spec} from PyPI ...", flush=True)
    with tempfile.TemporaryDirectory(dir=WHEELS) as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
            "--only-binary=:all:", "--python-version", "3.11",
            *[a for p in w.get("platforms", ["manylinux_2_28_x86_64"]) for a in ("--platform", p)],
            "-d", tmp, spec,
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-6:])
            die(f"could not download {spec} (is the network to PyPI up?):\n{tail}")
        got = Path(tmp) / w["file"]
        if not got.exists():
            die(f"pip fetched {os.listdir(tmp)} for {spec}, expected {w['file']}; the pin in deps.toml is out of date")
        digest = sha256(got)
        if digest != w["sha256"]:
            die(f"checksum mismatch for {w['file']}: got {digest}, deps.toml pins {w['sha256']}")
        os.replace(got, target)
    return target


def extract(w: dict, wheel: Path) -> None:
    dest = DEPS / w["dest"]
    dest.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.infolist() if not m.is_dir()
                   and any(fnmatch.fnmatch(m.filename, pat) for pat in w["extract"])]
        if not members:
            die(f"{wheel.name}: no member matches {w['extract']}")
        for m in members:
            if w.get("flatten"):
                rel = Path(m.filename).name
            else:
                rel = m.filename.removeprefix(w.get("strip_prefix", ""))
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            with zf.open(m) as src, tmp.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            # Keep the wheel's executable bits (nvcc, ptxas, cicc).
            mode = (m.external_attr >> 16) & 0o777
            if mode & 0o111:
                tmp.chmod(mode | 0o700)
            os.replace(tmp, out)
            written.append(str(out.relative_to(DEPS)))
    for link, target in w.get("symlinks", {}).items():
        p = dest / link
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.exists():
            p.unlink()
        p.symlink_to(target)
        written.append(str(p.relative_to(DEPS)))
    stamp = stamp_path(w)
    tmp = stamp.with_name(stamp.name + ".tmp")
    tmp.write_text("\n".join(written) + "\n")
    os.replace(tmp, stamp)
    print(f"deps: {w['name']}=={w['version']}: {len(written)} files in .deps/{w['dest']}")


def main() -> None:
    manifest = ROOT / "deps.toml"
    if len(sys.argv) == 3 and sys.argv[1] == "--manifest":
        manifest = ROOT / sys.argv[2]
    elif len(sys.argv) != 1:
        die("usage: deps.py [--manifest FILE]")
    cfg = tomllib.loads(manifest.read_text())
    DEPS.mkdir(exist_ok=True)
    for w in cfg["wheel"]:
        if expected_outputs(w):
            continue
        extract(w, download(w))
    print(f"deps: all pinned artefacts of {manifest.name} present and verified (.deps/)")


if __name__ == "__main__":
    main()
