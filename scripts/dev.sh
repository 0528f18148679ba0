#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine:
#   scripts/dev.sh train [vflow-train args...]  install what is missing, build, train the default job
#   scripts/dev.sh test  [ctest args...]        install what is missing, build, check that every
#                                               source compiles with clang, run every test
#   scripts/dev.sh deps | build | consumer      the individual stages (deps PACKAGE...: those)
#   scripts/dev.sh tool TARGET...               the build's packages and those targets only
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${VFLOW_BUILD_DIR:-$ROOT/build}"
JOBS="${VFLOW_JOBS:-$(nproc)}"

# Debian packages the build and the default job need (scripts/dev.sh train).
BUILD_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libyaml-cpp-dev libfmt-dev libspdlog-dev libcli11-dev catch2 zlib1g-dev libgloo-dev
  # the image data sets' decoders: libjpeg-turbo (its TurboJPEG and libjpeg APIs) and libpng
  libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev
  # LibTorch's matrix products go through the system BLAS: OpenBLAS (built for OpenMP, as
  # LibTorch is) instead of the reference BLAS makes linear layers ~15x faster.
  libopenblas0-openmp
  dataset-fashion-mnist
  # the cluster control store's client side: etcd's JSON gateway over libcurl
  libcurl4-openssl-dev nlohmann-json3-dev
)
# And those the tests need besides (scripts/dev.sh test).
TEST_PACKAGES=(
  openmpi-bin python3-matplotlib python3-torch
  # a real etcd, with its certificates made by openssl
  etcd-server etcd-client openssl
  # a single-machine Slurm for the Slurm example's test (scripts/slurm-local.sh), and
  # PyYAML for the Kubernetes manifests' offline check
  munge slurm-wlm python3-yaml
  # text corpora: English (language model) and German, Spanish, Italian, Brazilian
  # Portuguese (language identification)
  fortunes fortunes-de fortunes-es fortunes-it fortunes-br
  # vflow-tokenize's SentencePiece (built where it is installed), and its command-line tools
  # for the round-trip test
  libsentencepiece-dev sentencepiece
  # PIL makes the image data sets' test files (scripts/make-image-data.py)
  python3-pil
  # pkill and pgrep for the node agents' tests (a minimal Debian has no procps)
  procps
)

log() { printf '\033[1m[dev]\033[0m %s\n' "$*" >&2; }

# Installs what is missing of the packages named.
deps() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    log "all packages present"
    return
  fi
  log "installing: ${missing[*]}"
  local sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Builds the targets named, or everything.
build() {
  log "building ${*:-everything} in $BUILD ($JOBS jobs)"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$BUILD/install" >/dev/null
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$BUILD" -j "$JOBS" "${targets[@]}"
}

# Installs the library and builds the example consumer against the installed package.
consumer() {
  log "installing vflow and building examples/embed against the installed package"
  cmake --install "$BUILD" >/dev/null
  cmake -S "$ROOT/examples/embed" -B "$BUILD/embed" -G Ninja -DCMAKE_PREFIX_PATH="$BUILD/install" >/dev/null
  cmake --build "$BUILD/embed" -j "$JOBS"
  local single elastic port want
  single=$("$BUILD/embed/embed_example") || { echo "$single"; log "examples/embed failed"; return 1; }
  tail -n 2 <<<"$single"
  # The same job on two worker processes, shrunk to one while it runs: same fingerprint.
  port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  log "examples/embed on 2 workers, resized to 1 while it trains"
  elastic=$("$BUILD/embed/embed_example" --workers 2 --port "$port" --resize 1 2>&1) || {
    echo "$elastic"; log "examples/embed on 2 workers failed"; return 1; }
  want=$(sed -n 's/^fingerprint //p' <<<"$single")
  if ! grep -q "is rank 0 of 1 in generation 2" <<<"$elastic"; then
    echo "$elastic"; log "examples/embed: the resize to 1 worker never took effect"; return 1
  fi
  if [[ $(grep -oE 'fingerprint [0-9a-f]{16}' <<<"$elastic" | sort -u) != "fingerprint $want" ]]; then
    echo "$elastic"
    log "examples/embed: the resized job did not end with the single run's fingerprint $want"
    return 1
  fi
  grep -m 4 -E "resize to|generation 2|fingerprint" <<<"$elastic"
}

cmd="${1:-train}"
shift || true
ALL_PACKAGES=("${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}")
case "$cmd" in
  # deps PACKAGE...: those packages instead (the other scripts' own, clang's say)
  deps) if (($#)); then deps "$@"; else deps "${ALL_PACKAGES[@]}"; fi ;;
  build) deps "${ALL_PACKAGES[@]}"; build ;;
  tool) deps "${BUILD_PACKAGES[@]}"; build "$@" ;;
  consumer) deps "${ALL_PACKAGES[@]}"; build; consumer ;;
  # Only what the default job needs: the library and vflow-train.
  train) deps "${BUILD_PACKAGES[@]}"; build vflow-train; exec "$BUILD/vflow-train" "$@" ;;
  test)
    deps "${ALL_PACKAGES[@]}"; build; consumer
    # Every source compiles with clang too (a syntax-only pass, about 2 minutes).
    VFLOW_CLANG_BUILD_DIR="$BUILD/clang" "$ROOT/scripts/clang-check.sh"
    # Two tests at a time by default: most of them wait on sockets and timeouts, and a
    # test that trains on every core claims both slots (tests/CMakeLists.txt).
    log "running the tests, ${VFLOW_TEST_JOBS:-2} at a time"
    cd "$BUILD" && ctest --output-on-failure --timeout 1200 --parallel "${VFLOW_TEST_JOBS:-2}" "$@"
    ;;
  *) echo "usage: $0 {train|test|deps|build|consumer} [args...]" >&2; exit 2 ;;
esac
