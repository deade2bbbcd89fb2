#!/usr/bin/env bash
# Installs what petrel's build and tests need, from Debian packages. Idempotent.
# Usage: scripts/setup.sh   (as root, or with sudo available)
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev libpcre2-dev libcpp-httplib-dev libhwy-dev libsentencepiece-dev
  libxxhash-dev libopenblas-dev liblapacke-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  python3 python3-venv
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
