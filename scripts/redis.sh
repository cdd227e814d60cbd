#!/usr/bin/env bash
# Makes sure Debian's redis-server (≥ 7.0: `XADD key <ms>-*` and exclusive
# XRANGE) is installed; the experience-queue tests start their own on a free
# loopback port. Run by `make deps`. Idempotent: nothing happens when a
# suitable redis-server is on the PATH.
set -euo pipefail
PIN="5:7.0.15-1~deb12u7"   # Debian 12's current build; any 7.x or newer works
have() { command -v redis-server >/dev/null && redis-server --version | grep -Eq 'v=([7-9]|[1-9][0-9])\.'; }
have && exit 0
# The pinned build when the archive still has it, else Debian's current one.
bash "$(dirname "$0")/apt_install.sh" "redis-server >= 7.0, which the experience-queue tests start" "redis-server=$PIN"
# Debian's package starts a system service on 6379; the tests use their own.
if command -v service >/dev/null; then service redis-server stop >/dev/null 2>&1 || true; fi
have || { echo "deps: error: redis-server ≥ 7.0 did not install" >&2; exit 1; }
redis-server --version
