#!/usr/bin/env bash
# Jobs spanning device types: marginal-span against marginal (each job on one type) on the
# Gavel-shape workload and cluster, 10 seeds per setting, for three cross-type overheads.
# Prints the table of docs/scheduler.md, "Jobs spanning device types".
# Usage: docs/scheduler/span_experiment.sh PATH/TO/vflow-sched
set -euo pipefail
BIN=${1:?usage: span_experiment.sh PATH/TO/vflow-sched}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
OVERHEADS=(0 0.1 0.3)
for f in 1 2; do
  for rate in 1 1.5 2; do
    echo "max workers ${f}x demand, $rate jobs/h" >&2
    for seed in $(seq 1 10); do
      common=(simulate --workload synthetic --jobs 6000 --rate "$rate/h"
        --cluster v100:36,p100:36,k80:36 --throughput "$ROOT/data/scheduler/gavel_throughput.tsv"
        --measure 4000:5000 --seed "$seed" --max-workers-factor "$f")
      "$BIN" "${common[@]}" --policy marginal --out "$OUT/f$f/r$rate/s$seed/single" >/dev/null
      for o in "${OVERHEADS[@]}"; do
        "$BIN" "${common[@]}" --policy marginal-span --span-overhead "$o" \
          --out "$OUT/f$f/r$rate/s$seed/o$o" >/dev/null
      done
    done
  done
done
/usr/bin/python3 - "$OUT" "${OVERHEADS[@]}" <<'PY'
import json, os, sys
out, overheads = sys.argv[1], sys.argv[2:]
def summary(path):
    with open(os.path.join(path, "summary.json")) as f:
        return json.load(f)[0]
print("| max workers | jobs/h | marginal, mean JCT (s) | " +
      " | ".join(f"marginal-span, overhead {o}: mean JCT, change (worst seed), jobs spanned"
                 for o in overheads) + " |")
print("|---|---|---|" + "---|" * len(overheads))
for f in ("1", "2"):
    for rate in ("1", "1.5", "2"):
        base = f"{out}/f{f}/r{rate}"
        seeds = sorted(os.listdir(base))
        single = [summary(f"{base}/{s}/single")["jct"]["mean_s"] for s in seeds]
        row = [f"{'demand' if f == '1' else f + 'x demand'}", rate,
               f"{sum(single) / len(single):.0f}"]
        for o in overheads:
            runs = [summary(f"{base}/{s}/o{o}") for s in seeds]
            jct = [r["jct"]["mean_s"] for r in runs]
            worst = max(j / b - 1 for j, b in zip(jct, single))
            change = sum(jct) / sum(single) - 1
            spanned = sum(r["spanned_jobs"] for r in runs) / len(runs)
            row.append(f"{sum(jct) / len(jct):.0f}, {100 * change:+.1f}% ({100 * worst:+.1f}%), "
                       f"{spanned:.0f}")
        print("| " + " | ".join(row) + " |")
PY
