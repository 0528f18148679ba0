#!/usr/bin/env bash
# The GPU check (docs/gpu.md, "Running the GPU check"). A GPU machine is lent for one
# command of at most 10 minutes, sends back only files written under one folder, and
# has no internet: so the check is one bounded command that writes every log there.
#
#   scripts/gpu-check.sh fetch [DEPS]        where Debian 12's mirror is reachable: the
#                                            .deb files the GPU machine lacks, into DEPS
#                                            (default .gpu-deps, about 2 MB)
#   scripts/gpu-check.sh run DEPS OUT        on the GPU machine: unpack DEPS into a fresh
#                                            directory, configure against PyTorch's
#                                            LibTorch and NCCL, build, run the [cuda]
#                                            tests, the GPU benchmark, the CPU unit tests
#   scripts/gpu-check.sh rehearse DEPS OUT   on a CPU machine: every step of `run`, with the
#                                            CPU's tests and a one-step CPU benchmark
#
# OUT receives six files: summary.txt (each stage's status and seconds), setup.log
# (unpacking, what was found, configure), build.log, cuda-tests.log, bench.log and
# unit-tests.log. Each stage runs under a hard time limit (seconds, env to change):
#   VFLOW_GPU_SETUP_S=120  VFLOW_GPU_BUILD_S=240  VFLOW_GPU_CUDA_S=120  VFLOW_GPU_BENCH_S=140
# cut where needed so that the later stages keep a minimum (cuda 60, bench 45, unit tests
# 20) and the whole check ends within VFLOW_GPU_TOTAL_S=530 s; the unit tests get what
# remains. So the logs come back even when a stage fails or runs out of time.
# VFLOW_GPU_QUICK=1: a re-check of the GPU path after a change, in about half the time:
# no vflow_tests build and no CPU unit tests (their stage says so in the summary). A stage's
# output goes to its log file only, never through a pipe that could cut it; the screen
# gets the summary and the end of each failed stage's log.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${1:-}"
# What the GPU machine lacks: yaml-cpp, fmt, spdlog, CLI11, Catch2 (2.x), Gloo's headers,
# zlib's headers. The [cuda] tests and the benchmark use synthetic data: no Fashion-MNIST.
PACKAGES=(libyaml-cpp-dev libyaml-cpp0.7 libfmt-dev libfmt9 libspdlog-dev libspdlog1.10
          libcli11-dev catch2 libgloo-dev zlib1g-dev)

usage() {
  echo "usage: $0 fetch [DEPS] | run DEPS OUT | rehearse DEPS OUT" >&2
  exit 2
}

if [[ "$MODE" == fetch ]]; then
  set -e
  DEPS="$(realpath -m "${2:-$ROOT/.gpu-deps}")"
  mkdir -p "$DEPS"
  (cd "$DEPS" && apt-get download "${PACKAGES[@]}")
  ls -l "$DEPS"
  du -sh "$DEPS"
  exit 0
fi
[[ "$MODE" == run || "$MODE" == rehearse ]] || usage
[[ $# -eq 3 ]] || usage
DEPS="$(realpath -m "$2")"
OUT="$(realpath -m "$3")"
[[ -d "$DEPS" ]] || { echo "no dependency folder $DEPS (scripts/gpu-check.sh fetch)" >&2; exit 2; }
mkdir -p "$OUT" || exit 2

BUILD="${VFLOW_GPU_BUILD_DIR:-$ROOT/build-gpu}"
[[ "$MODE" == rehearse ]] && BUILD="${VFLOW_GPU_BUILD_DIR:-$ROOT/build-gpu-rehearse}"
SUMMARY="$OUT/summary.txt"
SETUP_LOG="$OUT/setup.log"
: >"$SUMMARY"
for f in setup build cuda-tests bench unit-tests; do : >"$OUT/$f.log"; done
TOTAL_S="${VFLOW_GPU_TOTAL_S:-530}"
START=$SECONDS
FAILED=0

note() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }

# The limit of a stage: its own, cut so that the stages after it keep `reserve` seconds
# before the deadline (but never below 10 s).
limit_of() {
  local own="$1" reserve="$2"
  local left=$((START + TOTAL_S - SECONDS - reserve))
  if ((left < own)); then
    own=$((left < 10 ? 10 : left))
  fi
  echo "$own"
}

# stage NAME LIMIT LOG FUNCTION: runs FUNCTION in a child bash under `timeout`, its output
# appended to LOG; records status and seconds in the summary.
stage() {
  local name="$1" limit="$2" log="$3" fn="$4"
  local begin=$SECONDS rc
  printf '\n== %s (limit %s s) %s\n' "$name" "$limit" "$(date -u +%T)" >>"$log"
  timeout --kill-after=5 "$limit" bash -c "$fn" >>"$log" 2>&1
  rc=$?
  local status="ok"
  if ((rc == 124 || rc == 137)); then
    status="TIMED OUT after ${limit} s"
  elif ((rc != 0)); then
    status="FAILED (exit $rc)"
  fi
  note "$(printf '%-11s %-28s %4s s  (log %s)' "$name" "$status" "$((SECONDS - begin))" \
    "$(basename "$log")")"
  if [[ "$status" != ok ]]; then
    FAILED=1
    echo "---- end of $(basename "$log") ----"
    tail -n 40 "$log"
    echo "----"
  fi
  return "$rc"
}

# The carried packages go to a fresh directory of their own (emptied first; at a fixed
# path, so that ccache recognises the compile commands of a second rehearsal), and the
# Python that has torch runs the benchmark too.
PREFIX="${VFLOW_GPU_PREFIX:-/tmp/vflow-gpu-deps-$(id -u)}"
rm -rf "$PREFIX" && mkdir -p "$PREFIX" || exit 2
PY=""
for candidate in ${PYTHON:-} python3 /usr/bin/python3; do
  if "$candidate" -c 'import torch' 2>/dev/null; then PY="$candidate"; break; fi
done
export ROOT MODE DEPS OUT BUILD SETUP_LOG PREFIX PY
export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- setup: unpack, find LibTorch, CUDA and NCCL, configure ------------------------------

setup() {
  set -e
  shopt -s nullglob
  local debs=("$DEPS"/*.deb)
  ((${#debs[@]} > 0)) || { echo "no .deb files in $DEPS (scripts/gpu-check.sh fetch)"; return 1; }
  echo "unpacking ${#debs[@]} packages into $PREFIX (never into /)"
  for deb in "${debs[@]}"; do dpkg-deb -x "$deb" "$PREFIX"; done
  # zlib1g-dev's libz.so points at Debian's absolute path: point it at this system's zlib.
  local libz
  libz="$(ldconfig -p | awk '/libz\.so\.1 / && !seen {print $NF; seen = 1}')"  # no early exit: SIGPIPE
  local carried_libz="$PREFIX/usr/lib/x86_64-linux-gnu/libz.so"
  if [[ -n "$libz" && -L "$carried_libz" ]]; then ln -sf "$libz" "$carried_libz"; fi

  # LibTorch: the first Python that imports torch; its share/cmake (pip's wheels), else
  # the system's (Debian's python3-torch has no C++ part: libtorch-dev's, for rehearsals).
  [[ -n "$PY" ]] || { echo "no Python with torch found (set PYTHON)"; return 1; }
  local torch_dir torch_cmake site
  torch_dir="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
  site="$(dirname "$torch_dir")"
  echo "python: $PY; torch: $torch_dir"
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "gpus", torch.cuda.device_count() if torch.cuda.is_available() else 0)'
  if [[ -d "$torch_dir/share/cmake/Torch" ]]; then
    torch_cmake="$torch_dir/share/cmake"
  elif [[ -f /usr/lib/x86_64-linux-gnu/cmake/Torch/TorchConfig.cmake ]]; then
    torch_cmake=/usr/lib/x86_64-linux-gnu/cmake
    echo "torch has no share/cmake: using the system's LibTorch in $torch_cmake"
  else
    echo "no LibTorch CMake config in $torch_dir/share/cmake nor in the system"; return 1
  fi
  echo "tools: $(cmake --version | head -1); ninja $(ninja --version 2>/dev/null);" \
    "$(c++ --version | head -1); $(nvcc --version 2>/dev/null | tail -1)"
  "$PY" -c 'import torch; print("torch C++ ABI: _GLIBCXX_USE_CXX11_ABI =",
    torch._C._GLIBCXX_USE_CXX11_ABI, "(the carried libraries need True)")'
  # Headers the torch package brings that could be taken for the carried ones: vflow's
  # own code is built against the carried fmt and spdlog (CMakeLists.txt puts them first).
  local inc="$torch_dir/include"
  for lib in fmt spdlog gloo; do
    if [[ -d "$inc/$lib" ]]; then echo "torch ships $lib headers: $inc/$lib"; else echo "torch ships no $lib headers"; fi
  done
  [[ -f "$inc/fmt/base.h" || -f "$inc/fmt/core.h" ]] &&
    grep -h -m1 -E '^#\s*define FMT_VERSION' "$inc"/fmt/base.h "$inc"/fmt/core.h 2>/dev/null | head -1
  echo "fmt headers that torch's headers include (they compile against the carried fmt 9):"
  grep -rhoE '#\s*include\s*<fmt/[a-z_]+\.h>' "$inc"/c10 "$inc"/ATen "$inc"/torch 2>/dev/null |
    sort | uniq -c || true
  # Gloo: the torch package's headers are the ones its ProcessGroupGloo was built with;
  # Debian's older ones must not shadow them.
  if [[ -f "$inc/gloo/algorithm.h" ]]; then
    rm -rf "$PREFIX/usr/include/gloo" "$PREFIX/usr/share/cmake/Gloo" "$PREFIX"/usr/lib/libgloo.so
    echo "using torch's Gloo headers; the carried ones removed"
  fi
  # PyTorch's newest headers need C++20; vflow builds as C++17 otherwise.
  local std_args=()
  if grep -rqsE 'error.*C\+\+(20|2a)' "$inc"/c10/macros/Macros.h "$inc"/c10/util/C++17.h; then
    std_args=(-DCMAKE_CXX_STANDARD=20)
    echo "torch's headers ask for C++20"
  fi
  grep -h -m1 -E '^#define FMT_VERSION' "$PREFIX"/usr/include/fmt/core.h | sed 's/^/carried: /'

  # CUDA's runtime and NCCL: CUDA_HOME if set, else where nvcc is, else /usr/local/cuda,
  # else PyTorch's pip packages; NCCL from the pip packages, else CUDA_HOME.
  local cuda_home="${CUDA_HOME:-}" nccl_h nccl_root nvcc
  if [[ -z "$cuda_home" ]]; then
    nvcc="$(command -v nvcc || true)"
    if [[ -n "$nvcc" ]]; then
      cuda_home="$(dirname "$(dirname "$(readlink -f "$nvcc")")")"
    elif [[ -f /usr/local/cuda/include/cuda_runtime_api.h ]]; then
      cuda_home=/usr/local/cuda
    else
      local cudart_h
      cudart_h="$(find "$site/nvidia" -name cuda_runtime_api.h 2>/dev/null | head -1 || true)"
      cuda_home="${cudart_h:+$(dirname "$(dirname "$cudart_h")")}"
      cuda_home="${cuda_home:-/usr/local/cuda}"
    fi
  fi
  nccl_h="$site/nvidia/nccl/include/nccl.h"
  [[ -f "$nccl_h" ]] || nccl_h="$(find "$site/nvidia" -name nccl.h 2>/dev/null | head -1 || true)"
  nccl_root="${nccl_h:+$(dirname "$(dirname "$nccl_h")")}"
  nccl_root="${nccl_root:-$cuda_home}"
  echo "CUDA runtime from $cuda_home; NCCL from $nccl_root"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv || echo "no nvidia-smi"
  local gloo_args=()
  [[ -f "$inc/gloo/algorithm.h" ]] && gloo_args=(-DGLOO_INCLUDE_DIR="$inc")
  export PATH="$cuda_home/bin:$PATH"
  # A copy of the tree can carry modification times from the future, which make ninja
  # rebuild its manifest for ever.
  find "$ROOT" -path "$BUILD" -prune -o -newermt "now" -exec touch -d '-1 min' {} + 2>/dev/null || true
  # NCCL AUTO: without it the LibTorch-only [cuda] tests and the benchmark still run; the
  # summary says loudly that the backend was not built.
  if ! cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$PREFIX/usr;$torch_cmake" -DCUDAToolkit_ROOT="$cuda_home" \
      -DCUDA_HOME="$cuda_home" -DNCCL_ROOT="$nccl_root" -DVFLOW_WITH_NCCL=AUTO \
      -DVFLOW_CUDA_TEST_TIMEOUT=60 -DTORCH_CUDA_ARCH_LIST="9.0" \
      -DPython_EXECUTABLE="$(command -v "$PY")" "${std_args[@]}" "${gloo_args[@]}"; then
    for f in "$BUILD"/CMakeFiles/CMakeConfigureLog.yaml "$BUILD"/CMakeFiles/CMakeError.log; do
      [[ -f "$f" ]] && { echo "--- end of $f"; tail -n 200 "$f"; }
    done
    return 1
  fi
}
export -f setup

# ---- build: what the later stages run, the [cuda] path first, with -k 0 so that one run
# shows every compile error ---------------------------------------------------------------

build() {
  local rc=0
  # Later stages run only what this build made: programs left by an earlier build in a
  # reused directory (a rehearsal) would run against this build's libraries.
  rm -f "$BUILD/tests/vflow_tests" "$BUILD/tests/vflow_cuda_tests" "$BUILD/vflow-train" \
        "$BUILD/vflow-ctl" "$BUILD/bench/vnode_overhead"
  cmake --build "$BUILD" -j "$(nproc)" --target vflow_cuda_tests vflow-train vflow-ctl -- -k 0 || rc=1
  cmake --build "$BUILD" -j "$(nproc)" --target vnode_overhead -- -k 0 || rc=1
  [[ "${VFLOW_GPU_QUICK:-0}" == 1 ]] ||
    cmake --build "$BUILD" -j "$(nproc)" --target vflow_tests -- -k 0 || rc=1
  return "$rc"
}
export -f build

# ---- [cuda] tests: every case in its own process; skipped ones are listed ----------------

cuda_tests() {
  cd "$BUILD" || return 1
  command -v ldd >/dev/null && ldd tests/vflow_cuda_tests | grep -E 'torch_cuda|cudart|nccl|cudnn'
  export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
  # LibTorch's CUDA tests first, then NCCL's: a hang in NCCL cannot cost the others.
  local rc=0
  ctest -L cuda -E NCCL --output-on-failure --timeout 60 --no-tests=error || rc=1
  ctest -L cuda -R NCCL --output-on-failure --timeout 60 --no-tests=error || rc=1
  [[ -f Testing/Temporary/LastTest.log ]] && { echo "--- LastTest.log"; cat Testing/Temporary/LastTest.log; }
  # On the GPU machine a [cuda] test skipped for want of a device means nothing ran.
  if [[ "$MODE" == run ]] && grep -q "SKIPPED \[cuda\]: no CUDA device" Testing/Temporary/LastTest.log; then
    echo "the [cuda] tests found no CUDA device: nothing of the GPU path ran"
    rc=1
  fi
  return "$rc"
}
export -f cuda_tests

# ---- benchmark: bench/gpu_compare.py trimmed to fit; on a CPU one step of vnode_overhead --

bench() {
  export PYTHONUNBUFFERED=1
  if [[ "$MODE" == run ]]; then
    "$PY" "$ROOT/bench/gpu_compare.py" --build "$BUILD" \
      ${VFLOW_GPU_BENCH_ARGS:---vnodes 1,16 --repeats 1 --examples 4096 --deterministic}
  else
    "$BUILD/bench/vnode_overhead" --vnodes 1,2 --examples 64 --micro-batch 32 --repeats 1 &&
      "$BUILD/bench/vnode_overhead" --vnodes 1,2 --examples 64 --micro-batch 32 --repeats 1 \
        --against deterministic
  fi
}
export -f bench

# ---- CPU unit tests against this LibTorch (no fortune packages there: not the text ones) --

unit_tests() {
  "$BUILD/tests/vflow_tests" "[unit]~[text]"
}
export -f unit_tests

note "vflow GPU check ($MODE) $(date -u '+%F %T') UTC, $(nproc) cores, commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
if stage setup "$(limit_of "${VFLOW_GPU_SETUP_S:-120}" 365)" "$SETUP_LOG" setup; then
  grep -q 'vflow: NCCL backend with' "$SETUP_LOG" ||
    { note "NCCL BACKEND NOT BUILT: CMake found no NCCL (setup.log); its tests skip"; FAILED=1; }
  stage build "$(limit_of "${VFLOW_GPU_BUILD_S:-240}" 125)" "$OUT/build.log" build
  stage cuda-tests "$(limit_of "${VFLOW_GPU_CUDA_S:-120}" 65)" "$OUT/cuda-tests.log" cuda_tests
  stage bench "$(limit_of "${VFLOW_GPU_BENCH_S:-140}" 20)" "$OUT/bench.log" bench
  if [[ "${VFLOW_GPU_QUICK:-0}" == 1 ]]; then
    note "unit-tests  skipped (VFLOW_GPU_QUICK=1)"
  else
    stage unit-tests "$(limit_of 600 0)" "$OUT/unit-tests.log" unit_tests
  fi
fi
rm -rf "$PREFIX"
note "total $((SECONDS - START)) s of ${TOTAL_S} s; logs in $OUT"
exit "$FAILED"
