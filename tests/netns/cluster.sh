#!/usr/bin/env bash
# A cluster of three hosts in network namespaces made here, joined by veth pairs on a
# bridge: each host runs an etcd member and a vflow-agent, and a job submitted on the
# first spans them all. Traffic goes only between these namespaces.
#   cluster.sh BUILD_DIR OUT_DIR SCENARIO JOB_ARGS...
# SCENARIO
#   elastic  resize 2 -> 5 -> 3, SIGKILL a worker, SIGKILL the coordinator mid-step (the
#            submitter; an agent takes over), stop one etcd member, resize once more
#   hostcut  the job submitted on 3 workers, one a host, then the third host's link is cut:
#            its etcd member, agent and worker are gone for the others. No resize first: a
#            worker starting mid-job takes seconds that the job's steps would race
#   run      runs JOB_ARGS as a command on the cluster, in this namespace, with
#            CLUSTER_PREFIX (the namespaces are $CLUSTER_PREFIX-h0 .. -h2), CLUSTER_URLS
#            (each host's --control URL, its own member first) and CLUSTER_ETCD (the etcd
#            folder of scripts/etcd-local.sh) set; bench/cluster_pause.py runs so
# In elastic and hostcut the workers start their steps at least 100 ms apart while the
# disturbances run (VFLOW_STEP_PACE, a test switch) and at full speed after them, so that
# the job's steps need only cover ten a second of the disturbances' time on any machine.
# Prints what it did and each measured time ("measured: ..."); the job's output is in
# OUT_DIR (agent-H.log, submit.log, examples.log). Exit 3 when namespaces cannot be made.
set -u
BUILD=$1 OUT=$2 SCENARIO=$3
shift 3
JOB=("$@")
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
P="vc$$"
NET=10.231.78
HOSTS=(h0 h1 h2)
ETCD="$OUT/etcd"
TRAIN="$BUILD/vflow-train" AGENT="$BUILD/vflow-agent" CTL="$BUILD/vflow-ctl"

cleanup() {
  "$SRC/scripts/etcd-local.sh" stop "$ETCD" >/dev/null 2>&1
  for h in "${HOSTS[@]}" sw; do ip netns pids "$P-$h" 2>/dev/null | xargs -r kill -9 2>/dev/null; done
  for h in "${HOSTS[@]}" sw; do ip netns del "$P-$h" 2>/dev/null; done
}
trap cleanup EXIT

if ! ip netns add "$P-sw" 2>/dev/null; then
  echo "NETNS-UNAVAILABLE: cannot create network namespaces here (needs root and iproute2)"
  exit 3
fi
set -e
ip -n "$P-sw" link set lo up
ip -n "$P-sw" link add br0 type bridge
ip -n "$P-sw" link set br0 up
for i in 0 1 2; do
  h=${HOSTS[$i]}
  ip netns add "$P-$h"
  ip link add "$P-$h" netns "$P-sw" type veth peer name eth0 netns "$P-$h"
  ip -n "$P-sw" link set "$P-$h" master br0 up
  ip -n "$P-$h" addr add "$NET.$((10 + i))/24" dev eth0
  ip -n "$P-$h" link set eth0 up
  ip -n "$P-$h" link set lo up
done
set +e
on() { local h=$1; shift; ip netns exec "$P-$h" "$@"; }
now() { date +%s.%N; }
since() { echo "$1 $(now)" | awk '{printf "%.3f", $2 - $1}'; }

"$SRC/scripts/etcd-local.sh" start "$ETCD" --members 3 --hosts "$NET.10,$NET.11,$NET.12" \
  --netns "$P-h0,$P-h1,$P-h2" > "$OUT/etcd.out" 2>&1 || { cat "$OUT/etcd.out"; exit 1; }
IFS=, read -r -a ENDPOINTS <<< "$(sed 's|^etcd://||' "$ETCD/endpoints")"
# Each host lists its own member first.
url_for() {
  local i=$1 list=${ENDPOINTS[$1]}
  for j in 0 1 2; do [[ $j == "$i" ]] || list+=",${ENDPOINTS[$j]}"; done
  echo "etcd://$list"
}
echo "etcd: $(cat "$ETCD/endpoints")"
if [[ $SCENARIO != run ]]; then
  touch "$OUT/pace"
  export VFLOW_STEP_PACE="100:$OUT/pace"  # the agents' workers inherit it
fi
AGENTS=()
for i in 0 1 2; do
  # Not through `on`: $! must be the agent itself (ip netns exec executes it in place).
  ip netns exec "$P-${HOSTS[$i]}" "$AGENT" --control "$(url_for "$i")" --name "${HOSTS[$i]}" \
    --host "$NET.$((10 + i))" --slots cpu,cpu --timeout 10 --stop-grace 20 --work-dir "$OUT/work-${HOSTS[$i]}" \
    > "$OUT/agent-${HOSTS[$i]}.log" 2>&1 &
  AGENTS+=($!)
done
ctl() { on h0 "$CTL" --timeout 3 --control "$(url_for 0)" "$@"; }
status() { ctl status netns-job 2>/dev/null; }
# until_true WHAT SECONDS CONDITION: polls CONDITION (a shell command) until it holds.
until_true() {
  local end=$((SECONDS + $2))
  until eval "$3"; do
    if [[ $SECONDS -ge $end ]]; then echo "TIMEOUT waiting for $1"; status; return 1; fi
    sleep 0.05
  done
}
await_agents() { until_true "3 agents" 20 '[[ $(ctl agents 2>/dev/null | grep -c " host ") == 3 ]]'; }
await_workers() { until_true "$1 workers" 60 "status | grep -qx 'workers $1'"; }
await_step() { until_true "step $1" 60 "[[ 10#0\$(status | sed -n 's/^step //p') -ge $1 ]]"; }
await_coordinator_change() {  # FROM: until another coordinates
  until_true "a coordinator other than $1" 30 \
    "c=\$(status | sed -n 's/^coordinator //p'); [[ -n \$c && \$c != none && \$c != '$1' ]]"
}
await_end() {  # until the job's keys are gone (its last coordinator removed them)
  until_true "the job to end" 300 'ctl status netns-job > /dev/null 2>&1; [[ $? == 7 ]]'
}
rank_pid() { status | sed -n "s/^rank $1 worker .* pid //p"; }
# Makes etcd member M the leader (from the current one, wherever it is).
lead() {
  local all id
  all=$(IFS=,; echo "${ENDPOINTS[*]}")
  id=$(on h0 etcdctl --endpoints="${ENDPOINTS[$1]}" endpoint status -w fields | sed -n 's/^"MemberID" : //p')
  on h0 etcdctl --endpoints="$all" move-leader "$(printf %x "$id")" 2>&1 | grep -v '^$' || true
}

await_agents
ctl agents
if [[ $SCENARIO == run ]]; then
  CLUSTER_PREFIX=$P CLUSTER_URLS="$(url_for 0) $(url_for 1) $(url_for 2)" CLUSTER_ETCD=$ETCD \
    "${JOB[@]}"
  rc=$?
  for i in 0 1 2; do kill -TERM "${AGENTS[$i]}" 2>/dev/null; done
  for i in 0 1 2; do wait "${AGENTS[$i]}"; done
  exit $rc
fi
WORKERS=2
[[ $SCENARIO == hostcut ]] && WORKERS=3
ip netns exec "$P-h0" "$TRAIN" "${JOB[@]}" --set output.logging.examples="$OUT/examples.log" --workers $WORKERS \
  --control "$(url_for 0)" --job netns-job > "$OUT/submit.log" 2>&1 &
SUBMIT=$!
await_step 20
case $SCENARIO in
  elastic)
    t=$(now); ctl resize netns-job 5; await_workers 5; echo "measured: scale-out 2 -> 5 seen in $(since "$t") s"
    t=$(now); ctl resize netns-job 3; await_workers 3; echo "measured: scale-in 5 -> 3 seen in $(since "$t") s"
    status | grep -E '^(rank|coordinator)'
    kill -KILL "$(rank_pid 1)"; echo "killed the worker of rank 1"
    await_workers 2
    coordinator=$(status | sed -n 's/^coordinator //p')
    t=$(now); kill -KILL "$SUBMIT"; echo "killed the coordinator ($coordinator) mid-step"
    await_coordinator_change "$coordinator"
    echo "measured: coordinator failover seen in $(since "$t") s"
    echo "new $(status | grep '^coordinator')"
    "$SRC/scripts/etcd-local.sh" stop "$ETCD" 2; echo "stopped etcd member 2"
    ctl resize netns-job 3; await_workers 3
    status | grep -E '^(step|rank|coordinator)'
    ;;
  hostcut)
    # The cut member leads, the hardest case: the others forward keep-alives to it until they
    # elect another, and no worker's lease may lapse meanwhile.
    lead 2
    # Cut at once: any poll first costs steps of a short job.
    t=$(now); ip -n "$P-h2" link set eth0 down; echo "cut the link of host h2"
    await_workers 2; echo "measured: host loss to a generation without it in $(since "$t") s"
    status | grep -E '^(step|rank|coordinator)'
    ;;
  *) echo "unknown scenario $SCENARIO"; exit 2 ;;
esac
rm -f "$OUT/pace"; echo "disturbances done at $(status | grep '^step'); the pace is off"
await_end
echo "job ended"
# A cut host's agent cannot reach the others to leave cleanly: it goes with its host.
[[ $SCENARIO == hostcut ]] && kill -KILL "${AGENTS[2]}"
for i in 0 1 2; do kill -TERM "${AGENTS[$i]}" 2>/dev/null; done
for i in 0 1 2; do wait "${AGENTS[$i]}"; echo "agent ${HOSTS[$i]} exit=$?"; done
wait "$SUBMIT" 2>/dev/null
exit 0
