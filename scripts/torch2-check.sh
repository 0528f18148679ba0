#!/usr/bin/env bash
# The LibTorch 2.x check on a CPU machine: builds vflow against Debian 13's LibTorch
# 2.6 in a Debian 13 chroot and runs the test suite there (Debian 12, the project's
# machine, ships LibTorch 1.13 only). Needs root, debootstrap and Debian's archive (the one
# this machine's apt sources name, or VFLOW_DEBIAN_MIRROR); the chroot stays in DIR
# (default /var/tmp/vflow-torch2) and is reused by the next run.
#
#   scripts/torch2-check.sh [ctest args...]   # e.g. -L cuda, or -R Gloo
#   VFLOW_TORCH2_DIR=DIR scripts/torch2-check.sh  # the chroot elsewhere
#
# Catch2 stays at 2.x (Debian 13 has 3.x, with another API): Debian 12's package is
# unpacked into the chroot's /opt/catch2. Where CUDA and NCCL are installed under
# /usr/local/cuda they are mounted read-only into the chroot, so the NCCL backend is
# built too. Without ctest arguments every test runs. The configure, build and
# ctest logs go to DIR/root/src/vflow/build/torch2-*.log.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$(realpath -m "${VFLOW_TORCH2_DIR:-/var/tmp/vflow-torch2}")"
CHROOT="$DIR/root"
# Debian's archive: VFLOW_DEBIAN_MIRROR, else the first one this machine's apt sources name
# (a URI ending in /debian, in sources.list or a .list or .sources file of sources.list.d).
debian_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -r $f ]] || continue
    awk '/^[[:space:]]*URIs:/ { for (i = 2; i <= NF; i++) print $i }
         /^[[:space:]]*deb[[:space:]]/ { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; break } }' "$f"
  done | awk '/^[a-z]+:\/\/.*\/debian\/?$/ && !found { print; found = 1 }'
}
MIRROR="${VFLOW_DEBIAN_MIRROR:-$(debian_mirror)}"
JOBS="${VFLOW_JOBS:-$(nproc)}"
# The same packages scripts/dev.sh installs on Debian 12, less Catch2 (see above).
PACKAGES=(build-essential cmake ninja-build pkg-config
          libtorch-dev libyaml-cpp-dev libfmt-dev libspdlog-dev libcli11-dev zlib1g-dev
          libgloo-dev libopenblas0-openmp libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev python3-pil
          openmpi-bin python3-matplotlib python3-torch iproute2 dataset-fashion-mnist
          fortunes fortunes-de fortunes-es fortunes-it fortunes-br
          libcurl4-openssl-dev nlohmann-json3-dev openssl)
# A real etcd for the [etcd] tests, where this Debian release has one (they fail without).
OPTIONAL_PACKAGES=(etcd-server etcd-client)

say() { printf '\033[1m[torch2]\033[0m %s (%ss)\n' "$*" "$SECONDS" >&2; }

[[ $(id -u) == 0 ]] || { echo "torch2-check: needs root (debootstrap, chroot)" >&2; exit 2; }
[[ -n "$MIRROR" ]] || {
  echo "torch2-check: this machine's apt sources name no Debian archive; set VFLOW_DEBIAN_MIRROR" >&2
  exit 2
}
if ! command -v debootstrap > /dev/null; then
  say "installing debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
fi

if [[ ! -x "$CHROOT/usr/bin/apt-get" ]]; then
  say "creating a Debian 13 chroot in $CHROOT"
  mkdir -p "$DIR"
  debootstrap --variant=minbase --include=ca-certificates trixie "$CHROOT" "$MIRROR" \
    > "$DIR/debootstrap.log"
fi

# The chroot's root is a mount of its own (ip netns exec remounts /), private so that
# nothing mounted in it propagates, with /proc, /dev, /sys (cgroups, for CPU quotas)
# and, read-only, /usr/local/cuda.
# cleanup() also takes down what an interrupted run or a test inside left mounted; made
# private first, so that no unmount reaches the host's /dev or /sys.
cleanup() {
  mountpoint -q "$CHROOT" || return 0
  mount --make-rprivate "$CHROOT" || true
  umount -R -l "$CHROOT" || true
}
trap cleanup EXIT
cleanup
mount --bind "$CHROOT" "$CHROOT"
mount --make-private "$CHROOT"
mount -t proc proc "$CHROOT/proc"
for m in dev sys; do
  mount --rbind "/$m" "$CHROOT/$m"
  mount --make-rslave "$CHROOT/$m"
done
if [[ -d /usr/local/cuda/include ]]; then
  mkdir -p "$CHROOT/usr/local/cuda"
  mount --bind /usr/local/cuda "$CHROOT/usr/local/cuda"
  mount -o remount,bind,ro "$CHROOT/usr/local/cuda"
fi
cp /etc/resolv.conf "$CHROOT/etc/resolv.conf" 2> /dev/null || true

say "installing ${#PACKAGES[@]} packages in the chroot"
chroot "$CHROOT" bash -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends ${PACKAGES[*]}" > "$DIR/packages.log"
chroot "$CHROOT" dpkg-query -W libtorch-dev >&2
chroot "$CHROOT" bash -c "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  --no-install-recommends ${OPTIONAL_PACKAGES[*]}" >> "$DIR/packages.log" 2>&1 ||
  say "no ${OPTIONAL_PACKAGES[*]} in this release: the [etcd] tests will fail"

if [[ ! -f "$CHROOT/opt/catch2/usr/include/catch2/catch.hpp" ]]; then
  say "unpacking Debian 12's Catch2 2.x into /opt/catch2"
  tmp="$(mktemp -d)"
  (cd "$tmp" && apt-get download catch2 > /dev/null)
  mkdir -p "$CHROOT/opt/catch2"
  dpkg -x "$tmp"/catch2_*.deb "$CHROOT/opt/catch2"
  rm -rf "$tmp"
  [[ -f "$CHROOT/opt/catch2/usr/include/catch2/catch.hpp" ]] ||
    { echo "torch2-check: this host's catch2 package is not Catch2 2.x" >&2; exit 2; }
fi

# Only the files that differ are copied, and they get the time of the copy: a file copied
# with its own (older) time could look older than the objects an earlier run built, and
# the build would keep those stale objects.
say "copying the working tree (changed files only)"
SRC=/src/vflow
mkdir -p "$CHROOT$SRC"
LIST="$(mktemp)"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard) > "$LIST"
copied=0
while IFS= read -r -d '' f; do
  [[ -f "$ROOT/$f" ]] || continue
  if ! cmp -s "$ROOT/$f" "$CHROOT$SRC/$f"; then
    mkdir -p "$(dirname "$CHROOT$SRC/$f")"
    cp --preserve=mode "$ROOT/$f" "$CHROOT$SRC/$f"
    copied=$((copied + 1))
  fi
done < "$LIST"
# Files the tree no longer has go from the copy too (the build directory stays).
(cd "$CHROOT$SRC" && find . -path ./build -prune -o -type f -print0) |
  while IFS= read -r -d '' f; do
    grep -qzxF -- "${f#./}" "$LIST" || rm -f "$CHROOT$SRC/$f"
  done
rm -f "$LIST"
say "copied $copied changed files"

say "building against LibTorch 2.x"
chroot "$CHROOT" bash -c "cd $SRC && mkdir -p build && cmake -S . -B build -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=/opt/catch2/usr -DVFLOW_WITH_NCCL=AUTO \
  > build/torch2-configure.log 2>&1 || { cat build/torch2-configure.log; exit 1; }
  cmake --build build -j $JOBS > build/torch2-build.log 2>&1 \
  || { grep -B2 -A12 -m5 'error' build/torch2-build.log; exit 1; }"

say "running the tests"
set +e
chroot "$CHROOT" bash -c "cd $SRC/build && ctest -j $JOBS --timeout 900 --output-on-failure ${*@Q} \
  > torch2-ctest.log 2>&1"
rc=$?
set -e
tail -n 25 "$CHROOT$SRC/build/torch2-ctest.log"
say "ctest exit status $rc"
exit "$rc"
