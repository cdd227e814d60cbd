#!/usr/bin/env bash
# apt_install.sh WHAT NAME=VERSION...
#
# Installs Debian packages for `make deps`: the pinned builds while the
# archive still has them, else its current ones. Needs root and apt-get;
# without them it names the packages to install and fails. Callers
# (scripts/redis.sh, scripts/egl.sh) check first whether what they need is
# already there.
set -euo pipefail
what=$1
shift
pins=("$@")
names=("${pins[@]%%=*}")
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "deps: error: $what is needed; install it, e.g. 'apt-get install ${names[*]}'" >&2
  exit 1
fi
echo "deps: installing Debian's ${names[*]} ($what)"
apt-get update -qq
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${pins[@]}" >/dev/null 2>&1 \
  || apt-get install -y -qq --no-install-recommends "${names[@]}" >/dev/null
