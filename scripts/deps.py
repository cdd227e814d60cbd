#!/usr/bin/env python3
"""Fetch, verify and unpack the pinned third-party artefacts listed in deps.toml.

Run by `make deps`; `make build-gpu` runs it with `--manifest deps-gpu.toml`. Idempotent: a wheel whose extracted files and stamp are in
place is skipped without touching the network. Every wheel is checked against
its pinned sha256 before anything is extracted; a mismatch deletes the download
and fails. Nothing else in r2vpo downloads anything.

Besides PyPI wheels (`[[wheel]]`), a manifest may list Debian packages
(`[[deb]]`), fetched with `apt-get download` at the pinned version (apt
checks the archive's signature; the pinned sha256 is checked here too) and
unpacked with `dpkg-deb`, never installed: the system is left as it was.
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


def fetch_pinned(w: dict, what: str, where: str, fetch) -> Path:
    """The archive `w` pins, from the cache in `.deps/wheels` when its
    sha256 matches, else fetched by `fetch(tmpdir)` (a CompletedProcess)
    from `where` and checked before it enters the cache."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    target = WHEELS / w["file"]
    if target.exists() and sha256(target) == w["sha256"]:
        return target
    print(f"deps: downloading {what} from {where} ...", flush=True)
    with tempfile.TemporaryDirectory(dir=WHEELS) as tmp:
        r = fetch(tmp)
        if r.returncode != 0:
            tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-6:])
            die(f"could not download {what} (is the network to {where} up?):\n{tail}")
        got = Path(tmp) / w["file"]
        if not got.exists():
            die(f"{where} gave {os.listdir(tmp)} for {what}, expected {w['file']}; the pin is out of date")
        digest = sha256(got)
        if digest != w["sha256"]:
            die(f"checksum mismatch for {w['file']}: got {digest}, the manifest pins {w['sha256']}")
        os.replace(got, target)
    return target


def download(w: dict) -> Path:
    if shutil.which(sys.executable) is None:
        die("python3 not found")

    def fetch(tmp: str) -> subprocess.CompletedProcess:
        probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True)
        if probe.returncode != 0:
            die(f"pip is not available for {sys.executable} ({probe.stderr.strip()}); install it, e.g. `apt-get install python3-pip`")
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
            "--only-binary=:all:", "--python-version", "3.11",
            *[a for p in w.get("platforms", ["manylinux_2_28_x86_64"]) for a in ("--platform", p)],
            "-d", tmp, f"{w['name']}=={w['version']}",
        ]
        return subprocess.run(cmd, capture_output=True, text=True)

    return fetch_pinned(w, f"{w['name']}=={w['version']}", "PyPI", fetch)


def download_deb(d: dict) -> Path:
    spec = f"{d['name']}={d['version']}"

    def fetch(tmp: str) -> subprocess.CompletedProcess:
        if shutil.which("apt-get") is None:
            die(f"{d['name']} comes from Debian's archive and apt-get is not available")
        r = subprocess.run(["apt-get", "download", spec], cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            # A fresh machine's package lists may be empty or stale.
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True)
            r = subprocess.run(["apt-get", "download", spec], cwd=tmp, capture_output=True, text=True)
        return r

    return fetch_pinned(d, spec, "the Debian archive", fetch)


def members_of(w: dict, archive: Path):
    """(name, open-for-reading, mode) of each member `w` extracts from a
    wheel (zip) or a Debian package (unpacked by dpkg-deb first)."""
    if archive.suffix == ".deb":
        unpacked = Path(tempfile.mkdtemp(dir=WHEELS))
        r = subprocess.run(["dpkg-deb", "-x", str(archive), str(unpacked)], capture_output=True, text=True)
        if r.returncode != 0:
            die(f"dpkg-deb could not unpack {archive.name}: {r.stderr.strip()}")
        try:
            for f in sorted(p for p in unpacked.rglob("*") if p.is_file() and not p.is_symlink()):
                name = str(f.relative_to(unpacked))
                if any(fnmatch.fnmatch(name, pat) for pat in w["extract"]):
                    yield name, f.open("rb"), f.stat().st_mode & 0o777
        finally:
            shutil.rmtree(unpacked)
        return
    with zipfile.ZipFile(archive) as zf:
        for m in zf.infolist():
            if not m.is_dir() and any(fnmatch.fnmatch(m.filename, pat) for pat in w["extract"]):
                yield m.filename, zf.open(m), (m.external_attr >> 16) & 0o777


def extract(w: dict, archive: Path) -> None:
    dest = DEPS / w["dest"]
    dest.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for name, src, mode in members_of(w, archive):
        if w.get("flatten"):
            rel = Path(name).name
        else:
            rel = name.removeprefix(w.get("strip_prefix", ""))
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        with src, tmp.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        # Keep the archive's executable bits (nvcc, ptxas, cicc).
        if mode & 0o111:
            tmp.chmod(mode | 0o700)
        os.replace(tmp, out)
        written.append(str(out.relative_to(DEPS)))
    if not written:
        die(f"{archive.name}: no member matches {w['extract']}")
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
    for w in cfg.get("wheel", []):
        if expected_outputs(w):
            continue
        extract(w, download(w))
    for d in cfg.get("deb", []):
        if expected_outputs(d):
            continue
        extract(d, download_deb(d))
    print(f"deps: all pinned artefacts of {manifest.name} present and verified (.deps/)")


if __name__ == "__main__":
    main()
