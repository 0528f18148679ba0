#!/usr/bin/env bash
# A single-machine Slurm for trying vflow's Slurm examples and for its [slurm] test:
# Debian's munge, slurmctld and slurmd, configured and run in a directory of their own
# (nothing under /etc is touched, no system service is started).
#
#   scripts/slurm-local.sh start DIR [--cpus N]
#       starts munged, slurmctld and slurmd for this host as one node with N CPUs (default
#       8: several allocations on one small machine) and waits until the node is idle.
#       Prints the slurm.conf path: export SLURM_CONF=<it> before sbatch, squeue, scancel.
#   scripts/slurm-local.sh stop DIR
#       cancels every job and stops the daemons.
set -euo pipefail

die() { echo "slurm-local: $*" >&2; exit 2; }
[[ $# -ge 2 ]] || die "usage: $0 start|stop DIR ..."
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)
shift 2

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

stop_pid() {
  local pidfile=$1
  [[ -f $pidfile ]] || return 0
  local pid
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

case $cmd in
  start)
    cpus=8
    while [[ $# -gt 0 ]]; do
      case $1 in
        --cpus) cpus=$2; shift 2 ;;
        *) die "unknown option $1" ;;
      esac
    done
    for program in munged slurmctld slurmd sbatch; do
      command -v "$program" >/dev/null ||
        die "$program is not installed (Debian: apt-get install munge slurm-wlm)"
    done
    mkdir -p "$dir/munge" "$dir/state" "$dir/spool"
    chmod 700 "$dir/munge"
    # A key for this directory's munged alone.
    if [[ ! -f $dir/munge/munge.key ]]; then
      dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
      chmod 400 "$dir/munge/munge.key"
    fi
    munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
      --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
      --seed-file="$dir/munge/munged.seed"
    node=$(hostname -s)
    cat > "$dir/slurm.conf" <<EOF
ClusterName=vflow-local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
# scancel: SIGTERM, then SIGKILL after this many seconds
KillWait=20
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF=$dir/slurm.conf
    slurmctld -f "$SLURM_CONF" -i
    slurmd -f "$SLURM_CONF"
    for _ in $(seq 1 150); do
      if sinfo -h -o %t 2>/dev/null | grep -qx idle; then
        echo "$dir/slurm.conf"
        exit 0
      fi
      sleep 0.2
    done
    tail -n 20 "$dir"/slurmctld.log "$dir"/slurmd.log >&2 || true
    die "the node did not become idle within 30 s"
    ;;
  stop)
    if [[ -f $dir/slurm.conf ]]; then
      export SLURM_CONF=$dir/slurm.conf
      scancel --full --signal=KILL --user=root 2>/dev/null || true
      # Their steps end before the daemons that watch them do.
      for _ in $(seq 1 100); do
        [[ -z $(squeue -h 2>/dev/null) ]] && break
        sleep 0.1
      done
    fi
    stop_pid "$dir/slurmd.pid"
    stop_pid "$dir/slurmctld.pid"
    stop_pid "$dir/munge/munged.pid"
    ;;
  *) die "unknown command $cmd" ;;
esac
