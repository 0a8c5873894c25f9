#!/usr/bin/env bash
# Install Debian packages the tests need, only those missing, never starting a service.
#
#   scripts/debian_packages.sh PACKAGE...
#
# Exit codes: 0 all installed, 3 some are missing and this is not root (nothing to do here),
# 1 apt-get failed. Used by scripts/build_image.py and tests/e2e/cluster/cluster_build.py.
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "missing Debian packages: ${missing[*]} (run as root, or: apt-get install ${missing[*]})" >&2
  exit 3
fi
echo "installing Debian packages: ${missing[*]}" >&2
# A package's postinst must not start a daemon on this machine (the tests run their own).
guard=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && guard=1
fi
trap '[ -n "$guard" ] && rm -f /usr/sbin/policy-rc.d' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
