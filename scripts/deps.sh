#!/bin/sh
# Installs the Debian packages GMLake needs to build and test, when missing.
set -e
PKGS="build-essential pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler libnng-dev check libsubunit-dev zlib1g-dev systemd python3 python3-prometheus-client procps"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "deps: installing$missing"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# The CUDA backend compiles against the driver API header; it is loaded with dlopen at run time.
if [ ! -f /usr/local/cuda/include/cuda.h ] && [ ! -f "${CUDA_INC:-/nonexistent}/cuda.h" ]; then
  echo "deps: /usr/local/cuda/include/cuda.h is missing: install CUDA's headers, or set CUDA_INC" >&2
  exit 1
fi
