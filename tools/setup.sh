#!/usr/bin/env bash
# Sets up a fresh machine for te-flydsl-plugin: the LLVM 22 linker and tools gfx950 compiles and ISA
# checks need (Debian's lld-22 / llvm-22; skipped where ROCm or LLVM >= 18 is present already),
# PyTorch (kept if one is installed), this project with its test extras, in editable mode, and AMD's
# amd-aiter wheel, whose prebuilt gfx950 code objects the emulator tests run as a third-party oracle
# (tests/emulator/test_aiter_oracle.py; installed without its dependencies and never imported).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

have_llvm() {
  for v in 22 21 20 19 18; do
    [ -x "/usr/lib/llvm-$v/bin/ld.lld" ] && [ -x "/usr/lib/llvm-$v/bin/llvm-objdump" ] && return 0
  done
  [ -x "${ROCM_PATH:-/opt/rocm}/llvm/bin/ld.lld" ]
}

if ! have_llvm; then
  echo "setup: installing lld-22 and llvm-22 (gfx950 linker, objdump, readelf)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq lld-22 llvm-22 >/dev/null
fi

# `import torch` runs every installed torch.backends entry point, this project's included; a stale
# install of it (its files gone, its metadata left) would then fail the import and this very install.
# Building or replacing the plugin never needs its start-up hook, so the whole setup runs without it.
export TORCH_DEVICE_BACKEND_AUTOLOAD=0

if ! python3 -c "import torch" 2>/dev/null; then
  echo "setup: installing torch 2.13.0"
  python3 -m pip install -q "torch==2.13.0"
fi

# Without build isolation, so setup.py builds the compiled decision path (host/_hotpath.cpp) against the
# torch installed above, as TE itself is built; setuptools is the one build dependency it then needs here.
echo "setup: installing te-flydsl-plugin[test] (compiling its decision path against this torch, ~1 min)"
python3 -m pip install -q "setuptools>=68"
python3 -m pip install -q --no-build-isolation -e ".[test]"

# Pinned: the tests know these code objects' kernel-argument structs (aiter's launchers of this version).
AITER_VERSION="0.1.7.post2.dev18"
echo "setup: installing amd-aiter==$AITER_VERSION (--no-deps: only its gfx950 code objects are used)"
python3 -m pip install -q --no-deps "amd-aiter==$AITER_VERSION"
