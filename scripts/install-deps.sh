#!/usr/bin/env bash
# Installs what tierfs needs on a Debian machine: FUSE 3 (fusermount3, /dev/fuse tools), fio for
# the benchmarks, sqlite3 for inspecting metadata, acl (setfacl/getfacl, for the ACL tests),
# faketime (libfaketime: the skewed-clock session test runs a daemon with its clock 60 s fast),
# mpich (mpirun: the real IOR and mdtest run under MPI when installed; tested with `cat`),
# rsync (a workload of scripts/bench-small.sh),
# and a Rust toolchain if none is present.
set -euo pipefail
need=()
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
command -v fio >/dev/null 2>&1 || need+=(fio)
command -v sqlite3 >/dev/null 2>&1 || need+=(sqlite3)
command -v setfacl >/dev/null 2>&1 || need+=(acl)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v faketime >/dev/null 2>&1 || need+=(faketime)
command -v mpirun >/dev/null 2>&1 || need+=(mpich)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
command -v cc >/dev/null 2>&1 || need+=(build-essential)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "installing Rust with rustup"
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi
[ -e /dev/fuse ] || { echo "error: /dev/fuse is missing (load the fuse module)"; exit 1; }
