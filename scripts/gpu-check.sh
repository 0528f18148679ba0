#!/usr/bin/env bash
# The GPU check: builds vflow on a GPU machine against the PyTorch installation's
# LibTorch (CUDA) and the NCCL found there, runs the [cuda] tests, the CPU unit tests
# (PyTorch's LibTorch 2.x) and the GPU benchmark. Meant to finish in under 8
# minutes on a 16-core machine.
#
# The GPU machine has no internet and no Debian packages; the few libraries vflow needs
# besides PyTorch travel with the working tree as .deb files, unpacked into a private
# prefix (never into /):
#
#   scripts/gpu-check.sh fetch [DIR]   # where Debian 12's mirror is reachable: downloads
#                                      # the .deb files into DIR (default .gpu-deps)
#   scripts/gpu-check.sh run [DIR]     # on the GPU machine: unpack, build, test, measure
#
# `run` writes build-gpu/ and its logs to ${VFLOW_GPU_LOGS:-build-gpu/logs}.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${1:-run}"
DEPS="$(cd "$ROOT" && realpath -m "${2:-.gpu-deps}")"
# What the GPU machine lacks: yaml-cpp, fmt, spdlog, CLI11, Catch2 (2.x), Gloo's headers.
# And Fashion-MNIST (31 MB) for the tests that train on it.
PACKAGES=(libyaml-cpp-dev libyaml-cpp0.7 libfmt-dev libfmt9 libspdlog-dev libspdlog1.10
          libcli11-dev catch2 libgloo-dev zlib1g-dev dataset-fashion-mnist)

say() { printf '\n== %s (%ss)\n' "$*" "$SECONDS"; }

if [[ "$MODE" == fetch ]]; then
  mkdir -p "$DEPS"
  (cd "$DEPS" && apt-get download "${PACKAGES[@]}")
  ls -l "$DEPS"
  exit 0
fi
[[ "$MODE" == run ]] || { echo "usage: $0 fetch|run [DIR]" >&2; exit 2; }

LOGS="${VFLOW_GPU_LOGS:-$ROOT/build-gpu/logs}"
mkdir -p "$LOGS"
PREFIX=/tmp/vflow-gpu-prefix
say "unpacking $(ls "$DEPS"/*.deb | wc -l) packages into $PREFIX"
rm -rf "$PREFIX" && mkdir -p "$PREFIX"
for deb in "$DEPS"/*.deb; do dpkg-deb -x "$deb" "$PREFIX"; done
# zlib1g-dev's libz.so points at Debian's absolute path: point it at this system's zlib.
LIBZ="$(ldconfig -p | awk '/libz\.so\.1 /{print $NF; exit}')"
[[ -n "$LIBZ" ]] && ln -sf "$LIBZ" "$PREFIX/usr/lib/x86_64-linux-gnu/libz.so"
export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Jobs and tests read Fashion-MNIST from Debian's path: a link to the unpacked copy.
if [[ ! -e /usr/share/datasets/fashion-mnist && -d "$PREFIX/usr/share/datasets/fashion-mnist" ]]; then
  mkdir -p /usr/share/datasets
  ln -s "$PREFIX/usr/share/datasets/fashion-mnist" /usr/share/datasets/fashion-mnist
fi

say "finding PyTorch, CUDA and NCCL"
PY="${PYTHON:-python3}"
TORCH_DIR="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())' | tee "$LOGS/versions.txt"
SITE="$(dirname "$TORCH_DIR")"
NCCL_H="$(find "$SITE/nvidia" -name nccl.h 2>/dev/null | head -1 || true)"
NCCL_ROOT="${NCCL_H:+$(dirname "$(dirname "$NCCL_H")")}"
NCCL_ROOT="${NCCL_ROOT:-/usr/local/cuda}"
# CUDA's runtime headers and library (vflow's NCCL backend) and the toolkit that
# LibTorch's CMake config asks for: CUDA_HOME if set, else where nvcc is, else
# /usr/local/cuda, else PyTorch's pip packages (headers and runtime, no nvcc).
if [[ -z "${CUDA_HOME:-}" ]]; then
  NVCC="$(command -v nvcc || true)"
  if [[ -n "$NVCC" ]]; then
    CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$NVCC")")")"
  elif [[ -f /usr/local/cuda/include/cuda_runtime_api.h ]]; then
    CUDA_HOME=/usr/local/cuda
  else
    CUDART_H="$(find "$SITE/nvidia" -name cuda_runtime_api.h 2>/dev/null | head -1 || true)"
    CUDA_HOME="${CUDART_H:+$(dirname "$(dirname "$CUDART_H")")}"
    CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
  fi
fi
echo "NCCL from $NCCL_ROOT, CUDA runtime from $CUDA_HOME" | tee -a "$LOGS/versions.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOGS/versions.txt"

say "configuring"
GLOO_ARGS=()
if [[ -f "$TORCH_DIR/include/gloo/algorithm.h" ]]; then
  GLOO_ARGS=(-DGLOO_INCLUDE_DIR="$TORCH_DIR/include")  # the Gloo that LibTorch was built with
fi
export PATH="$CUDA_HOME/bin:$PATH"
cmake -S "$ROOT" -B "$ROOT/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_DIR/share/cmake;$PREFIX/usr" -DCUDAToolkit_ROOT="$CUDA_HOME" \
  -DCUDA_HOME="$CUDA_HOME" -DNCCL_ROOT="$NCCL_ROOT" -DVFLOW_WITH_NCCL=ON \
  -DTORCH_CUDA_ARCH_LIST="9.0" "${GLOO_ARGS[@]}" 2>&1 | tee "$LOGS/configure.log" | tail -5

say "building"
cmake --build "$ROOT/build-gpu" -j "$(nproc)" 2>&1 | tee "$LOGS/build.log" | tail -3

say "[cuda] tests"
(cd "$ROOT/build-gpu" && ctest -L cuda --output-on-failure --timeout 300) 2>&1 |
  tee "$LOGS/cuda-tests.log" | tail -25 || true

say "CPU unit tests against this LibTorch (not the text ones: no fortunes packages there)"
"$ROOT/build-gpu/tests/vflow_tests" "[unit]~[text]" 2>&1 | tee "$LOGS/unit-tests.log" | tail -3 || true

say "GPU benchmark"
"$PY" "$ROOT/bench/gpu_compare.py" --build "$ROOT/build-gpu" ${VFLOW_GPU_BENCH_ARGS:-} 2>&1 |
  tee "$LOGS/gpu-bench.md" || true
say "done"
