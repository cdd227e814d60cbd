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
have() { [[ $(dpkg-query -W -f='${Status}\n' "${names[@]}" 2>/dev/null | grep -c '^install ok installed$') == "${#names[@]}" ]]; }
have && exit 0
bash "$(dirname "$0")/apt_install.sh" "EGL with Mesa's software driver, for episode videos" "${PKGS[@]}"
have || { echo "deps: error: ${names[*]} did not install" >&2; exit 1; }
