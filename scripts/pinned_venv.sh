#!/usr/bin/env bash
# pinned_venv.sh WHAT VENV REQUIREMENTS MIN_PYTHON EXACT CHECK
#
# Installs the pinned, hash-checked REQUIREMENTS into the git-ignored VENV
# (`pip --no-deps --require-hashes`), then runs the Python code CHECK in it,
# whose stdout lines starting with `deps:` are printed. Needs Python >=
# MIN_PYTHON (e.g. 3.10), exactly that minor version when EXACT is `exact`
# (wheels pinned for one CPython). Idempotent: returns at once when the venv
# holds exactly these requirements (a stamp of their hash). Shared by the
# differential tests' venvs (scripts/*/venv.sh), which `make deps` runs.
# With BASE_VENV set, the new venv also sees that venv's site-packages (a
# .pth file), so a venv of a few pure-Python packages can share the torch of
# another instead of downloading its own 3 GB.
set -euo pipefail
what=$1 VENV=$2 REQ=$3 min=$4 exact=$5 check=$6
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
need="Python >= $min"
[ "$exact" = exact ] && need="Python $min"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "deps: $PYTHON not found; $what needs $need (set PYTHON=...)" >&2
  exit 1
fi
if ! "$PYTHON" -c "import sys; v = sys.version_info[:2]; m = tuple(map(int, '$min'.split('.'))); \
sys.exit(not (v == m if '$exact' == 'exact' else v >= m))"; then
  echo "deps: $what needs $need, $PYTHON is $("$PYTHON" -V 2>&1)" >&2
  exit 1
fi
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [[ -x $VENV/bin/python && -f $VENV/.requirements && $(cat "$VENV/.requirements") == "$want" ]]; then
  exit 0
fi
echo "deps: installing the pinned $what into $VENV"
rm -rf "$VENV"
if ! "$PYTHON" -m venv "$VENV"; then
  echo "deps: '$PYTHON -m venv' failed (on Debian: apt-get install python3-venv)" >&2
  exit 1
fi
if [ -n "${BASE_VENV:-}" ]; then
  base_site=$("$BASE_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || {
    echo "deps: $what needs $BASE_VENV first (make deps builds it)" >&2
    rm -rf "$VENV"
    exit 1
  }
  own_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base_site" > "$own_site/base-venv.pth"
fi
if ! "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes -r "$REQ"; then
  echo "deps: pip could not install $REQ into $VENV (is PyPI reachable? a hash mismatch means a changed file)" >&2
  rm -rf "$VENV"
  exit 1
fi
if ! out=$("$VENV/bin/python" -c "$check" 2>&1); then
  echo "deps: the $what in $VENV does not import: $out" >&2
  rm -rf "$VENV"
  exit 1
fi
grep '^deps:' <<<"$out" || true
echo "$want" > "$VENV/.requirements"
