#!/usr/bin/env bash
# Multi-host test: the coordinator and two workers in separate network
# namespaces, joined by veth pairs on a bridge, talking over real TCP.
#   multihost.sh VFLOW_TRAIN [job args...]
# Case 1 trains a short deterministic job and prints each host's fingerprint.
# Case 2 cuts worker 1's link mid-training; the other side must fail within the
# timeout. Namespaces and addresses exist only inside this script and are
# removed on exit.
set -u
TRAIN="$1"; shift
JOB=("$@")
P="vf$$"
NET=10.231.77
cleanup() {
  for n in c w0 w1; do ip netns pids "$P-$n" 2>/dev/null | xargs -r kill -9 2>/dev/null; done
  for n in c w0 w1; do ip netns del "$P-$n" 2>/dev/null; done
}
trap cleanup EXIT

if ! ip netns add "$P-c" 2>/dev/null; then
  echo "NETNS-UNAVAILABLE: cannot create network namespaces here (needs root and iproute2)"
  exit 3
fi
set -e
ip netns add "$P-w0"
ip netns add "$P-w1"
ip -n "$P-c" link set lo up
ip -n "$P-c" link add br0 type bridge
ip -n "$P-c" link set br0 up
ip -n "$P-c" addr add "$NET.1/24" dev br0
i=10
for w in w0 w1; do
  ip link add "$P-$w" netns "$P-c" type veth peer name eth0 netns "$P-$w"
  ip -n "$P-c" link set "$P-$w" master br0 up
  ip -n "$P-$w" addr add "$NET.$i/24" dev eth0
  ip -n "$P-$w" link set eth0 up
  ip -n "$P-$w" link set lo up
  i=$((i + 1))
done
set +e

run_case() {  # name, extra args...
  local name="$1"; shift
  local port=$((29400 + RANDOM % 1000))
  ip netns exec "$P-c" "$TRAIN" "${JOB[@]}" "$@" --workers 2 --coordinator "$NET.1:$port" \
    > "$TMPDIR_CASE/$name-coordinator.log" 2>&1 &
  local coordinator=$!
  sleep 0.5
  local pids=()
  for r in 0 1; do
    ip netns exec "$P-w$r" env VFLOW_RANK=$r VFLOW_WORLD_SIZE=2 VFLOW_STORE="$NET.1:$port" \
      "$TRAIN" "${JOB[@]}" "$@" > "$TMPDIR_CASE/$name-$r.log" 2>&1 &
    pids+=($!)
  done
  if [ "$name" = cut ]; then
    for _ in $(seq 300); do grep -q '"event":"step"' "$TMPDIR_CASE/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
    ip -n "$P-w1" link set eth0 down
    echo "cut: worker 1's link is down"
  fi
  for r in 0 1; do
    wait "${pids[$r]}"
    echo "$name: worker $r exit=$?"
    sed "s/^/$name: worker $r: /" "$TMPDIR_CASE/$name-$r.log" | grep -E "fingerprint|peer failure|error" | head -5
  done
  kill "$coordinator" 2>/dev/null
  wait "$coordinator"
}

TMPDIR_CASE=$(mktemp -d)
run_case train
run_case cut --set semantic.steps=1000000 --set output.logging.every_steps=1 \
  --set output.logging.metrics="$TMPDIR_CASE/metrics.jsonl" --set resources.timeout_s=3
rm -rf "$TMPDIR_CASE"
