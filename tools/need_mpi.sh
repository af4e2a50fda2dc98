#!/usr/bin/env bash
# Makes sure OpenMPI (mpicc and mpirun) is installed: as root, installs it with apt-get;
# otherwise says exactly what to install. Called by the Makefile before building an MPI
# program.
set -eu
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then exit 0; fi
packages="openmpi-bin libopenmpi-dev"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "OpenMPI is missing: installing $packages with apt-get" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages >/dev/null
    command -v mpicc >/dev/null 2>&1 || { echo "installing $packages did not provide mpicc" >&2; exit 1; }
    exit 0
fi
echo "OpenMPI is missing. On Debian or Ubuntu: sudo apt-get install -y $packages" >&2
exit 1
