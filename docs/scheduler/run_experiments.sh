#!/usr/bin/env bash
# Reproduces the tables and plots of docs/scheduler.md.
# Usage: docs/scheduler/run_experiments.sh PATH/TO/vflow-sched
set -euo pipefail
BIN=${1:?usage: run_experiments.sh PATH/TO/vflow-sched}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# (a) Paper-style: 20 jobs, one 8-GPU host, 10 seeds per arrival rate, max_workers = demand (f1)
# and max_workers = 2 x demand (f2).
for f in 1 2; do
  for rate in 6 12 18 24; do
    for seed in $(seq 1 10); do
      "$BIN" simulate --workload paper --jobs 20 --rate "$rate/h" --devices 8 \
        --throughput "$ROOT/data/scheduler/paper_throughput.tsv" --policy all \
        --max-workers-factor "$f" --seed "$seed" --out "$OUT/paper/f$f/r$rate/s$seed" \
        >/dev/null 2>&1
    done
  done
done

# (b) Gavel-shape workload on 36 V100 + 36 P100 + 36 K80, JCT over jobs 4000-4999.
for rate in 1 1.5 2; do
  "$BIN" simulate --workload synthetic --jobs 6000 --rate "$rate/h" \
    --cluster v100:36,p100:36,k80:36 --throughput "$ROOT/data/scheduler/gavel_throughput.tsv" \
    --policy all --measure 4000:5000 --seed 1 --out "$OUT/gavel/r$rate" >/dev/null 2>&1
done

# (c) The marginal policy against the non-elastic ones: the Gavel shape over 10 seeds, and
# Philly-style traces (docs/scheduler/philly_traces.py: 30 jobs on 8 devices, 100 on 16, 300
# on 64, offered loads 0.5 to 4, 10 seeds each) with the fallback throughput curve.
BASELINES=(marginal fifo priority srtf las gavel)
for rate in 1 1.5 2; do
  for seed in $(seq 1 10); do
    "$BIN" simulate --workload synthetic --jobs 6000 --rate "$rate/h" \
      --cluster v100:36,p100:36,k80:36 --throughput "$ROOT/data/scheduler/gavel_throughput.tsv" \
      --policy "${BASELINES[@]}" --measure 4000:5000 --seed "$seed" \
      --out "$OUT/gavel-seeds/r$rate/s$seed" >/dev/null 2>&1
  done
done
/usr/bin/python3 "$ROOT/docs/scheduler/philly_traces.py" "$OUT/philly-traces"
for trace in "$OUT"/philly-traces/*.csv; do
  name=$(basename "$trace" .csv)          # philly-J30-D8-L0.5-s1
  setting=${name#philly-}; setting=${setting%-s*}
  devices=${setting#*-D}; devices=${devices%%-*}
  "$BIN" simulate --philly "$trace" --devices "$devices" --policy "${BASELINES[@]}" \
    --out "$OUT/philly/$setting/${name##*-}" >/dev/null 2>&1
done

/usr/bin/python3 "$ROOT/docs/scheduler/plot.py" "$OUT" "$ROOT/docs/scheduler"
