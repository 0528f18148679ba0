#!/bin/bash
# The determinism benchmark measures the real deterministic mode: its deterministic trainer
# (bench/vnode_overhead --against deterministic, beside a default one in each process) ends
# with the same fingerprint on one worker process as on two over one communicator, as
# deterministic mode promises, and the same on every rank and in every measurement (the
# benchmark itself fails otherwise).
#   bench_determinism.sh VNODE_OVERHEAD
set -euo pipefail
bench=${1:?usage: bench_determinism.sh VNODE_OVERHEAD}
args=(--against deterministic --vnodes 2 --micro-batch 16 --examples 64 --repeats 2)

fingerprint_of() {
  local out
  out=$("$bench" "${args[@]}" --workers "$1") || { echo "$out"; echo "FAIL: --workers $1" >&2; exit 1; }
  echo "$out" >&2
  sed -n 's/^deterministic fingerprint V=2: \([0-9a-f]\{16\}\)$/\1/p' <<<"$out"
}

one=$(fingerprint_of 1)
two=$(fingerprint_of 2)
[[ -n $one ]] || { echo "FAIL: no deterministic fingerprint printed on one worker" >&2; exit 1; }
if [[ $one != "$two" ]]; then
  echo "FAIL: the deterministic trainer ended with $one on one worker, '$two' on two" >&2
  exit 1
fi
echo "PASS: the deterministic trainer ended with $one on one and on two workers"
