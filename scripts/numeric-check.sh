#!/usr/bin/env bash
# Runs the numerically sensitive tests once per CPU variant this machine can imitate:
#   scripts/numeric-check.sh [CATCH_FILTER]   default "[numeric]~[slow]"; "[numeric]" adds the
#                                             7-minute default-job test
# A figure such as an accuracy or a loss depends on which vector kernels LibTorch
# (ATEN_CPU_CAPABILITY), oneDNN (ONEDNN_MAX_CPU_ISA) and OpenBLAS (OPENBLAS_CORETYPE) pick for
# the CPU, and on the intra-op thread count (VFLOW_TEST_THREADS, read by the tests). CI runs
# on one machine and sees one variant; a bound must hold in all of them (docs/testing.md).
# The variables are set here, for this check only, never in the tests or in CI. A variant
# above what this CPU has falls back to what it has (the log of each run names the kernels
# OpenBLAS chose).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${VFLOW_BUILD_DIR:-$ROOT/build}"
FILTER="${1:-[numeric]~[slow]}"
TESTS="$BUILD/tests/vflow_tests"
[[ -x "$TESTS" ]] || { echo "build first: scripts/dev.sh build" >&2; exit 2; }

# name | settings | tests left out. LibTorch takes oneDNN's bf16 kernels when the CPU itself
# has AVX-512 (it asks the CPU, not oneDNN), so a oneDNN capped below AVX-512 on such a CPU
# refuses bf16 convolutions, which no real CPU does: those variants leave the bf16 test out.
variants=(
  "this machine's own choice||"
  "AVX-512 (Intel Skylake-X and later)|ATEN_CPU_CAPABILITY=avx512 OPENBLAS_CORETYPE=SkylakeX|"
  "AVX2 (Haswell and later, AMD Zen 1-3)|ATEN_CPU_CAPABILITY=avx2 OPENBLAS_CORETYPE=Haswell|"
  "AVX (Sandy Bridge)|ATEN_CPU_CAPABILITY=default OPENBLAS_CORETYPE=Sandybridge|"
  "SSE4.1 (Nehalem)|ATEN_CPU_CAPABILITY=default OPENBLAS_CORETYPE=Nehalem|"
  "AVX2 with oneDNN at AVX2, fp32|ATEN_CPU_CAPABILITY=avx2 OPENBLAS_CORETYPE=Haswell ONEDNN_MAX_CPU_ISA=AVX2|~[bf16]"
  "SSE4.1 with oneDNN at SSE4.1, fp32|ATEN_CPU_CAPABILITY=default OPENBLAS_CORETYPE=Nehalem ONEDNN_MAX_CPU_ISA=SSE41|~[bf16]"
  "1 intra-op thread|VFLOW_TEST_THREADS=1|"
  "2 intra-op threads|VFLOW_TEST_THREADS=2|"
  "4 intra-op threads|VFLOW_TEST_THREADS=4|"
)
failed=0
results=()
for v in "${variants[@]}"; do
  IFS='|' read -r name settings leave_out <<<"$v"
  log="$BUILD/numeric-check-$(echo "$name" | tr -c 'a-zA-Z0-9' '-' | tr -s '-').log"
  echo "== $name: ${settings:-(nothing set)}" >&2
  start=$(date +%s)
  # shellcheck disable=SC2086
  env $settings OPENBLAS_VERBOSE=2 "$TESTS" "$FILTER$leave_out" -s >"$log" 2>&1
  rc=$?
  core=$(sed -n 's/^Core: //p' "$log" | head -1)
  summary=$(grep -E "^(All tests passed|test cases:)" "$log" | tail -1)
  results+=("$(printf '%-40s %-12s %4ss  %s' "$name" "${core:-?}" "$(( $(date +%s) - start ))" "$summary")")
  ((rc == 0)) || { failed=1; results[-1]+="  <- $log"; }
done
printf '\n%-40s %-12s %5s  %s\n' "variant" "OpenBLAS" "time" "result"
printf '%s\n' "${results[@]}"

# The margins: every comparison of a measured figure with a bound, over all variants, with
# the worst figure seen (Catch's -s output: "file:line: PASSED:", then "with expansion:").
/usr/bin/python3 - "$BUILD"/numeric-check-*.log <<'PY'
import re, sys
worst = {}
for path in sys.argv[1:]:
    lines = open(path, errors="replace").read().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(/\S+:\d+): (PASSED|FAILED):", line)
        if not m:
            continue
        for j in range(i + 1, min(i + 8, len(lines))):
            e = re.match(r"^\s+(-?[0-9.e+-]+) (<=|>=|<|>) (-?[0-9.e+-]+)\s*$", lines[j])
            if e:
                value, op, bound = float(e[1]), e[2], float(e[3])
                key = (m[1].split("/tests/")[-1], op, bound)
                lo, hi = worst.get(key, (value, value))
                worst[key] = (min(lo, value), max(hi, value))
                break
print("\nfigures against their bounds, over every variant (min .. max of the figure):")
for (where, op, bound), (lo, hi) in sorted(worst.items()):
    print(f"  {where:42} {lo:.6g} .. {hi:.6g} {op} {bound:g}")
PY
exit "$failed"
