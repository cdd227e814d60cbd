#!/usr/bin/env python3
"""Check that vendor/candle-core is crates.io's candle-core plus exactly vendor/candle-core.patch.

    vendor_check.py fetch   download the pinned .crate into .deps/crates/ (run by `make deps`)
    vendor_check.py check   rebuild the tree from the .crate and the patch, compare byte for byte
                            with vendor/candle-core (run by `make test`); offline
    vendor_check.py diff    rewrite vendor/candle-core.patch from the vendored tree (after an
                            edit to vendor/candle-core, or when upgrading: see PATCHES.md)

The expected tree is the published crate, minus the parts a path dependency
does not need (DROPPED), with the patch applied by `git apply`. PATCHES.md,
the why of the change, is the only file of the vendored tree outside that.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME, VERSION = "candle-core", "0.11.1"
# crates.io's checksum of the published file (its sparse index, `cksum`);
# the same value cargo checks.
SHA256 = "d11c8be87cfbaef9ebb62fb3f850d1fc8e00cc1d11d393fdbe55a4d5c2cdb325"
URL = f"https://static.crates.io/crates/{NAME}/{NAME}-{VERSION}.crate"
CRATE = ROOT / ".deps" / "crates" / f"{NAME}-{VERSION}.crate"
VENDOR = ROOT / "vendor" / NAME
PATCH = ROOT / "vendor" / f"{NAME}.patch"
# Published files a path dependency never reads: examples, tests and benches
# (46 k lines; the vendored Cargo.toml's diff drops their targets), the
# crate's lock file and cargo's packaging metadata.
DROPPED = ["examples", "tests", "benches", "Cargo.lock", "Cargo.toml.orig", ".cargo_vcs_info.json"]
OURS = {"PATCHES.md"}


def die(msg: str) -> None:
    print(f"vendor-check: error: {msg}", file=sys.stderr)
    sys.exit(1)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch() -> None:
    if CRATE.exists() and sha256(CRATE) == SHA256:
        return
    CRATE.parent.mkdir(parents=True, exist_ok=True)
    tmp = CRATE.with_suffix(".tmp")
    try:
        with urllib.request.urlopen(URL, timeout=60) as r, tmp.open("wb") as f:
            shutil.copyfileobj(r, f)
    except OSError as e:
        die(f"download of {URL} failed: {e}")
    got = sha256(tmp)
    if got != SHA256:
        tmp.unlink()
        die(f"{URL}: sha256 {got}, expected {SHA256}")
    os.replace(tmp, CRATE)
    print(f"deps: {NAME} {VERSION} (.crate, to check vendor/{NAME}) in .deps/crates")


def published(into: Path) -> Path:
    """The published crate's tree, without DROPPED, under `into`."""
    if not CRATE.exists():
        die(f"{CRATE.relative_to(ROOT)} is missing: run `make deps` (or `{sys.argv[0]} fetch`)")
    if sha256(CRATE) != SHA256:
        die(f"{CRATE.relative_to(ROOT)} does not have the pinned sha256 {SHA256}; delete it and run `make deps`")
    with tarfile.open(CRATE) as tar:
        # The "data" filter (no links out, no absolute paths) where this
        # Python has it (3.11.4+); the file's checksum was verified above.
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(into, **kw)
    tree = into / f"{NAME}-{VERSION}"
    for rel in DROPPED:
        p = tree / rel
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    return tree


def files(tree: Path) -> dict[str, bytes]:
    out = {}
    for p in sorted(tree.rglob("*")):
        if p.is_file():
            rel = p.relative_to(tree).as_posix()
            if rel not in OURS:
                out[rel] = p.read_bytes()
    return out


def check() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tree = published(Path(tmp))
        r = subprocess.run(["git", "apply", "--whitespace=nowarn", "-p1", str(PATCH)], cwd=tree, capture_output=True, text=True)
        if r.returncode != 0:
            die(f"{PATCH.relative_to(ROOT)} does not apply to {NAME} {VERSION}: {r.stderr.strip()}")
        want, have = files(tree), files(VENDOR)
    bad = [f"  differs: {k}" for k in sorted(want.keys() & have.keys()) if want[k] != have[k]]
    bad += [f"  missing from vendor/{NAME}: {k}" for k in sorted(want.keys() - have.keys())]
    bad += [f"  not in the crate or the patch: {k}" for k in sorted(have.keys() - want.keys())]
    if bad:
        die(
            f"vendor/{NAME} is not {NAME} {VERSION} from crates.io plus {PATCH.relative_to(ROOT)}:\n"
            + "\n".join(bad)
            + f"\nIf the vendored change is intended, run `python3 scripts/vendor_check.py diff` and commit the patch."
        )
    print(f"vendor-check: vendor/{NAME} is crates.io's {NAME} {VERSION} plus {PATCH.relative_to(ROOT)} ({len(have)} files)")


def diff() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = published(Path(tmp))
        os.rename(base, Path(tmp) / "a")
        shutil.copytree(VENDOR, Path(tmp) / "b", ignore=lambda d, names: [n for n in names if n in OURS and Path(d) == VENDOR])
        r = subprocess.run(["diff", "-ruN", "a", "b"], cwd=tmp, capture_output=True)
        if r.returncode not in (0, 1):
            die(f"diff failed: {r.stderr.decode().strip()}")
    # File headers without diff's timestamps, which are the checkouts' mtimes.
    out = b"".join(
        l.split(b"\t")[0] + b"\n" if l.startswith((b"--- a/", b"+++ b/")) else l for l in r.stdout.splitlines(keepends=True)
    )
    PATCH.write_bytes(out)
    lines = out.count(b"\n")
    print(f"vendor-check: wrote {PATCH.relative_to(ROOT)} ({lines} lines)")


if __name__ == "__main__":
    commands = {"fetch": fetch, "check": check, "diff": diff}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        die(f"usage: vendor_check.py {{{'|'.join(commands)}}}")
    commands[sys.argv[1]]()
