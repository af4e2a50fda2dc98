#!/usr/bin/env bash
# tools/need.sh WHAT PACKAGE...: makes sure WHAT (a command, or a file path starting with /)
# exists. If not: as root with apt-get, installs the Debian PACKAGEs; otherwise says
# exactly what to install and fails. The Makefile calls it before building anything that
# needs OpenMPI (the MPI programs) or OpenBLAS (the benchmark only).
#
#   tools/need.sh mpicc openmpi-bin libopenmpi-dev
set -eu
what=$1
shift
have() { if [ "${what#/}" != "$what" ]; then [ -e "$what" ]; else command -v "$what" >/dev/null 2>&1; fi; }
have && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "$what is missing: installing $* with apt-get" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
    have || { echo "installing $* did not provide $what" >&2; exit 1; }
    exit 0
fi
echo "$what is missing. On Debian or Ubuntu: sudo apt-get install -y $*" >&2
exit 1
