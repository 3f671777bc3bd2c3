#!/bin/sh
# Installs the Debian packages GMLake needs to build and test, when missing.
# libslurm-dev, slurmctld, slurmd, slurm-client, munge: the SPANK plugin and tests/slurm.sh (a Slurm of its own);
# python3-kubernetes, python3-yaml: tests/k8s.py validates deploy/k8s offline against the Kubernetes models.
# scripts/deps.sh deb: those `make deb` needs instead (the Debian tools, only then: lintian is large).
set -e
PKGS="build-essential clang clang-format libclang-rt-dev pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler libnng-dev check libsubunit-dev zlib1g-dev systemd python3 python3-setuptools python3-wheel python3-pip python3-venv python3-prometheus-client procps man-db libslurm-dev slurmctld slurmd slurm-client munge python3-kubernetes python3-yaml"
[ "${1:-}" != deb ] || PKGS="build-essential dpkg-dev debhelper fakeroot lintian pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler libnng-dev zlib1g-dev"
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
