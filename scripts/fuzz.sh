#!/usr/bin/env bash
# Fuzzes every parser of outside input (tests/fuzz) with libFuzzer, AddressSanitizer and
# UBSan:
#   scripts/fuzz.sh [SECONDS] [TARGET...]   each target for SECONDS (default 60), all by default
# Builds the targets with clang in build-fuzz/ (VFLOW_FUZZ_BUILD_DIR), starting from each
# target's committed corpus (tests/fuzz/corpus/TARGET). New inputs go to
# build-fuzz/corpus/TARGET, never into the committed corpus; an input that makes a target
# fail is kept as build-fuzz/findings/TARGET/crash-* (or timeout-*, oom-*): fix the
# parser, then commit the input under tests/fuzz/corpus/TARGET as a regression case, which
# the test command replays from then on. Prints each target's executions and findings and
# exits 1 if any target found something.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${VFLOW_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
JOBS="${VFLOW_JOBS:-$(nproc)}"
SECONDS_EACH="${1:-60}"
shift || true
[[ "$SECONDS_EACH" =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [SECONDS] [TARGET...]" >&2; exit 2; }

log() { printf '\033[1m[fuzz]\033[0m %s\n' "$*" >&2; }

# The project's packages, then clang with libFuzzer and the sanitizer runtimes.
"$ROOT/scripts/dev.sh" deps
"$ROOT/scripts/dev.sh" deps clang-14 libfuzzer-14-dev libclang-rt-14-dev

mapfile -t ALL < "$ROOT/tests/fuzz/targets.txt"
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=("${ALL[@]}")
for t in "${TARGETS[@]}"; do
  printf '%s\n' "${ALL[@]}" | grep -qx "$t" || { echo "no fuzz target '$t' (targets: ${ALL[*]})" >&2; exit 2; }
done

log "building ${#TARGETS[@]} target(s) with clang, ASan and UBSan in $BUILD"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DVFLOW_FUZZ=ON \
  -DBUILD_SHARED_LIBS=OFF -DVFLOW_WITH_NCCL=OFF -DVFLOW_BUILD_TESTS=OFF \
  -DVFLOW_BUILD_BENCH=OFF -DVFLOW_BUILD_APPS=OFF >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]/#/fuzz_}"

# LibTorch's own allocations outlive a run (caches, interned names): leaks are not checked.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
summary=()
failed=0
for t in "${TARGETS[@]}"; do
  corpus="$BUILD/corpus/$t"
  findings="$BUILD/findings/$t"
  mkdir -p "$corpus" "$findings"
  out="$BUILD/fuzz-$t.log"
  log "$t: ${SECONDS_EACH} s (log: $out)"
  rc=0
  # -timeout: an input that takes 10 s is a hang; -rss_limit_mb: one that needs 2 GiB is a
  # finding (a header that announces more than the file holds).
  "$BUILD/tests/fuzz/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$findings/" "$corpus" "$ROOT/tests/fuzz/corpus/$t" \
    >"$out" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -1)
  found=$(find "$findings" -type f | wc -l)
  inputs=$(find "$corpus" -type f | wc -l)
  line=$(printf '%-16s %10s executions  %5s corpus inputs  %s finding(s)' "$t" "${execs:-?}" "$inputs" "$found")
  if ((rc != 0 || found > 0)); then
    failed=1
    line+="  <- see $out and $findings"
  fi
  summary+=("$line")
done
printf '\n%s\n' "fuzz summary (${SECONDS_EACH} s each):"
printf '%s\n' "${summary[@]}"
exit "$failed"
