#!/usr/bin/env bash
# The GPU check's mechanics on this machine, fast (scripts/gpu-check.sh rehearse): a
# fresh build directory, a dependency folder holding one package made here, and a build
# limit of 1 s, so that the build stage runs out of time on purpose. What a first GPU run
# depends on: every stage runs and is reported with its status and seconds, a stage that
# fails or times out does not stop the later ones, the six logs land in the output folder
# and nowhere else, and the whole run stays inside its limits. (A full rehearsal, which
# builds for real, is in docs/gpu.md; on 2 cores it takes longer than the test command
# should.)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; echo "--- screen"; cat "$TMP/screen.txt" 2>/dev/null || true; exit 1; }

mkdir -p "$TMP/pkg/DEBIAN" "$TMP/pkg/usr/include/vflow-gpu-check-test" "$TMP/deps"
printf 'Package: vflow-gpu-check-test\nVersion: 1\nArchitecture: all\nMaintainer: vflow\nDescription: test\n' \
  >"$TMP/pkg/DEBIAN/control"
echo '#define VFLOW_GPU_CHECK_TEST 1' >"$TMP/pkg/usr/include/vflow-gpu-check-test/marker.h"
dpkg-deb --build "$TMP/pkg" "$TMP/deps/vflow-gpu-check-test.deb" >/dev/null

start=$SECONDS
rc=0
VFLOW_GPU_PREFIX="$TMP/prefix" VFLOW_GPU_BUILD_DIR="$TMP/build" VFLOW_GPU_BUILD_S=1 VFLOW_GPU_CUDA_S=30 VFLOW_GPU_BENCH_S=30 \
  VFLOW_GPU_TOTAL_S=600 "$ROOT/scripts/gpu-check.sh" rehearse "$TMP/deps" "$TMP/out" \
  >"$TMP/screen.txt" 2>&1 || rc=$?
elapsed=$((SECONDS - start))
((rc == 1)) || fail "exit code $rc, expected 1 (the build stage had 1 s)"
((elapsed < 200)) || fail "took $elapsed s, more than its limits allow"

files=$(cd "$TMP/out" && ls | sort | tr '\n' ' ')
[[ "$files" == "bench.log build.log cuda-tests.log setup.log summary.txt unit-tests.log " ]] ||
  fail "output folder holds: $files"
summary="$TMP/out/summary.txt"
grep -qE '^setup +ok ' "$summary" || fail "setup did not succeed"
grep -q 'unpacking 1 packages' "$TMP/out/setup.log" || fail "the package was not unpacked"
grep -qE '^build +TIMED OUT after 1 s' "$summary" || fail "the build's time-out is not reported"
for s in cuda-tests bench unit-tests; do
  grep -qE "^$s +(ok|FAILED|TIMED OUT)" "$summary" || fail "stage $s did not run after the build"
done
grep -qE "^total [0-9]+ s of 600 s" "$summary" || fail "no total in the summary"
grep -q 'TIMED OUT' "$TMP/screen.txt" || fail "the screen does not show the time-out"
grep -q "into $TMP/prefix (never into /)" "$TMP/out/setup.log" || fail "unpacked elsewhere"
[[ ! -e "$TMP/prefix" ]] || fail "the unpacked packages were left in $TMP/prefix"
echo "gpu-check stages: ok (${elapsed} s)"
cat "$summary"
