#!/usr/bin/env bash
# Ahead-of-time build of gsplat 1.5.3's CUDA extension for the GPU machine
# (CPython 3.12, torch 2.11.0+cu130, CUDA 13.0, sm_90), made on a machine WITHOUT a GPU.
#
# Why: gsplat builds its kernels by JIT at import time (minutes, racing when several ranks
# import at once, silently `_C = None` without a toolkit). The GPU machine is lent for
# 30 minutes; building here first means it only loads a .so (distsplat/render/gsplat_ext.py,
# env DISTSPLAT_GSPLAT_EXT=$PWD/.gsplat_ext).
#
# Steps: download the torch wheel (only its headers and libraries are unpacked) and gsplat's
# sources into a cache outside the repo, compile every gsplat .cu/.cpp and ext.cpp (JOBS at
# once, one core each) with gsplat's JIT flags, link one module, strip it. Outputs:
#   .gsplat_ext/gsplat_cuda.cpython-312-x86_64-linux-gnu.so + build_info.json  (git-ignored)
#   benchmarks/results/gsplat_compile_sm90.json  (per-file outcome; committed)
#
# Environment (defaults): DISTSPLAT_CACHE ($HOME/.cache/distsplat), TORCH_VERSION (2.11.0),
# GSPLAT_VERSION (1.5.3), ARCH (90), CUDA_HOME (/usr/local/cuda),
# PY312 (a CPython 3.12 prefix, for its headers: that of the `python3.12` on PATH, e.g.
# `pyenv prefix 3.12.1`), OUT_DIR (<repo>/.gsplat_ext), JOBS (nproc: files compiled at once; one
# at a time took 48 min on 2 cores, gsplat_compile_sm90.json), RPATH (none: colon-separated
# folders written into the module's RUNPATH, e.g. where the GPU machine's torch/lib lies, for a
# load without `import torch` first; distsplat imports torch first and needs none).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DISTSPLAT_CACHE:-$HOME/.cache/distsplat}"
TORCH_VERSION="${TORCH_VERSION:-2.11.0}"
GSPLAT_VERSION="${GSPLAT_VERSION:-1.5.3}"
ARCH="${ARCH:-90}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
py312_prefix() { command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import sys; print(sys.base_prefix)' 2>/dev/null || true; }
PY312="${PY312:-$(py312_prefix)}"
OUT_DIR="${OUT_DIR:-$REPO_ROOT/.gsplat_ext}"
PY_INCLUDE="$PY312/include/python3.12"
PY=python3

die() { echo "build_gsplat_ext.sh: $*" >&2; exit 1; }

[ -x "$CUDA_HOME/bin/nvcc" ] || die "no nvcc at $CUDA_HOME/bin/nvcc; set CUDA_HOME to a CUDA 13 toolkit"
[ -f "$PY_INCLUDE/Python.h" ] || die "no Python 3.12 headers at '$PY_INCLUDE': set PY312 to a CPython 3.12 prefix (e.g. PY312=\$(pyenv prefix 3.12.1)), or put python3.12 on PATH"
command -v unzip >/dev/null || die "unzip not found (apt-get install unzip)"

mkdir -p "$CACHE/wheels"
# One build at a time (gpu_prepare.sh may start one while another runs).
exec 9>"$CACHE/build.lock"
flock -n 9 || die "another build holds $CACHE/build.lock; wait for it"
# The platform tags of a CPython 3.12 manylinux x86_64 machine (the GPU machine's).
PIP_DL=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$CACHE/wheels")

# 1. torch: the +cuXXX wheel (PyPI's default Linux build). Only headers, libraries and
#    version.py are unpacked (~1 GB), once.
TORCH_WHL=$(ls "$CACHE"/wheels/torch-"$TORCH_VERSION"-cp312-cp312-manylinux*_x86_64.whl 2>/dev/null | head -1 || true)
if [ -z "$TORCH_WHL" ]; then
    echo "== downloading torch==$TORCH_VERSION (cp312, ~530 MB) into $CACHE/wheels"
    "${PIP_DL[@]}" "torch==$TORCH_VERSION"
    TORCH_WHL=$(ls "$CACHE"/wheels/torch-"$TORCH_VERSION"-cp312-cp312-manylinux*_x86_64.whl | head -1)
fi
TORCH_ROOT="$CACHE/torch-$TORCH_VERSION-cp312"
if [ ! -f "$TORCH_ROOT/.unpacked" ]; then
    echo "== unpacking torch/include, torch/lib from $(basename "$TORCH_WHL")"
    rm -rf "$TORCH_ROOT"; mkdir -p "$TORCH_ROOT"
    nice -n 10 unzip -q -o "$TORCH_WHL" 'torch/include/*' 'torch/lib/*' 'torch/version.py' -d "$TORCH_ROOT"
    touch "$TORCH_ROOT/.unpacked"
fi
grep -q "cuda: Optional\[str\] = '" "$TORCH_ROOT/torch/version.py" \
    || die "$TORCH_WHL is a CPU-only torch (torch/version.py has no CUDA version); its headers lack c10/cuda"
[ -f "$TORCH_ROOT/torch/include/c10/cuda/impl/cuda_cmake_macros.h" ] || die "$TORCH_WHL has no c10/cuda headers"

# 2. gsplat's sources: its PyPI wheel is pure Python + CUDA sources (built by JIT).
GSPLAT_WHL=$(ls "$CACHE"/wheels/gsplat-"$GSPLAT_VERSION"-py3-none-any.whl 2>/dev/null | head -1 || true)
if [ -z "$GSPLAT_WHL" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$CACHE/wheels" "gsplat==$GSPLAT_VERSION" \
        || die "could not download gsplat==$GSPLAT_VERSION"
    GSPLAT_WHL=$(ls "$CACHE"/wheels/gsplat-"$GSPLAT_VERSION"-py3-none-any.whl | head -1)
fi
GSPLAT_SRC="$CACHE/gsplat-$GSPLAT_VERSION-src"
if [ ! -f "$GSPLAT_SRC/.unpacked" ]; then
    rm -rf "$GSPLAT_SRC"; mkdir -p "$GSPLAT_SRC"
    unzip -q -o "$GSPLAT_WHL" 'gsplat/*' -d "$GSPLAT_SRC"
    touch "$GSPLAT_SRC/.unpacked"
fi

# 3. compile (JOBS at once, niced: the build machine is shared), link, strip, record.
cd "$REPO_ROOT"
exec nice -n 10 "$PY" "$REPO_ROOT/scripts/build_gsplat_ext.py" \
    --torch-root "$TORCH_ROOT" --torch-wheel "$(basename "$TORCH_WHL")" \
    --gsplat-src "$GSPLAT_SRC" --gsplat-origin "$(basename "$GSPLAT_WHL")" \
    --build-dir "$CACHE/build-gsplat-$GSPLAT_VERSION-torch$TORCH_VERSION-sm$ARCH" \
    --out "$OUT_DIR" --results "$REPO_ROOT/benchmarks/results/gsplat_compile_sm$ARCH.json" \
    --python-include "$PY_INCLUDE" --cuda-home "$CUDA_HOME" --arch "$ARCH" \
    --command "scripts/build_gsplat_ext.sh${*:+ $*}" --repo "$REPO_ROOT" --jobs "${JOBS:-$(nproc)}" \
    ${RPATH:+--rpath "$RPATH"}
