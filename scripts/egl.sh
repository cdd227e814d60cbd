#!/usr/bin/env bash
# Makes sure an EGL driver that renders offscreen without a GPU is installed:
# Debian's libglvnd EGL loader and Mesa's EGL and software (llvmpipe) driver.
# Episode videos (`control eval --video`, `[video] every`) draw with MuJoCo's
# OpenGL renderer on it; with a GPU driver present, that one serves instead.
# Run by `make deps`. Idempotent: nothing happens when the three are there.
set -euo pipefail
# Debian 12's current builds; the archive's current ones serve as well.
PKGS=(libegl1=1.6.0-1 libegl-mesa0=22.3.6-1+deb12u2 libgl1-mesa-dri=22.3.6-1+deb12u2)
names=("${PKGS[@]%%=*}")
have() { dpkg-query -W -f='${Status}\n' "${names[@]}" 2>/dev/null | grep -c '^install ok installed$' | grep -qx "${#names[@]}"; }
have && exit 0
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "deps: error: episode videos need EGL with Mesa's software driver; install it, e.g. 'apt-get install ${names[*]}'" >&2
  exit 1
fi
echo "deps: installing Debian's EGL loader and Mesa's software driver (${names[*]})"
apt-get update -qq
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null 2>&1 \
  || apt-get install -y -qq --no-install-recommends "${names[@]}" >/dev/null
have || { echo "deps: error: ${names[*]} did not install" >&2; exit 1; }
