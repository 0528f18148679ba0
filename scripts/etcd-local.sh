#!/usr/bin/env bash
# A local etcd cluster for trying vflow's cluster control plane and for its tests:
# Debian's etcd-server on loopback (or on the addresses given), in a directory of its own.
#
#   scripts/etcd-local.sh start DIR [--members N] [--hosts IP,IP,...] [--netns NS,NS,...]
#                                   [--tls] [--auth PASSWORD]
#       starts N members (default 1) and prints their client endpoints on one line,
#       comma-separated (etcd://H:P,... or, with --tls, etcds://H:P,...). --hosts gives each
#       member's address (default 127.0.0.1 for all); --netns runs each member in that
#       network namespace (a test's hosts, where its address is); --tls makes a CA, server and client
#       certificates in DIR/pki (openssl) and serves https only; --auth enables etcd's
#       authentication with a root user of that password.
#   scripts/etcd-local.sh job-user DIR JOB USER PASSWORD
#       (with --auth) a user that may read and write only the keys of vflow job JOB
#       (the prefix /vflow/jobs/JOB/), and nothing of any other job; it may read the node
#       agents' records (/vflow/agents/), to place the job's workers on their slots.
#   scripts/etcd-local.sh agent-user DIR USER PASSWORD
#       (with --auth) a user for node agents: they follow and coordinate every job, so it
#       may read and write all of /vflow/.
#   scripts/etcd-local.sh stop DIR [MEMBER]
#       stops every member (or member MEMBER, 0-based) with SIGTERM, then SIGKILL.
#   scripts/etcd-local.sh restart DIR MEMBER
#       starts a stopped member again with its data.
#   scripts/etcd-local.sh freeze|thaw DIR MEMBER
#       stops member MEMBER answering (SIGSTOP) and lets it go on (SIGCONT): its sockets
#       stay open and accept, as a member on a hung machine or behind a cut link looks.
#
# Every member compacts its history (keeping 5 minutes) and has a 512 MiB space quota, so
# that a long job cannot fill it; vflow removes a finished job's keys itself.
set -euo pipefail

die() { echo "etcd-local: $*" >&2; exit 2; }
[[ $# -ge 2 ]] || die "usage: $0 start|job-user|agent-user|stop|restart|freeze|thaw DIR ..."
cmd=$1
dir=$2
shift 2

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The namespace member M runs in, if any.
netns_of() { [[ -f "$dir/netns" ]] && cut -d, -f"$(($1 + 1))" "$dir/netns" || true; }

in_netns() {  # NS COMMAND...: runs COMMAND in network namespace NS ("" : here)
  local ns=$1
  shift
  if [[ -n $ns ]]; then ip netns exec "$ns" "$@"; else "$@"; fi
}

ctl() {
  # etcdctl against the members (from the first member's namespace), as root when auth is on.
  local args=(--endpoints "$(cat "$dir/endpoints.https")")
  if [[ -f "$dir/pki/ca.pem" ]]; then
    args+=(--cacert "$dir/pki/ca.pem" --cert "$dir/pki/client.pem" --key "$dir/pki/client-key.pem")
  fi
  if [[ -f "$dir/root-password" ]]; then args+=(--user "root:$(cat "$dir/root-password")"); fi
  ETCDCTL_API=3 in_netns "$(netns_of 0)" etcdctl "${args[@]}" "$@"
}

make_pki() {
  local pki=$dir/pki hosts=$1
  mkdir -p "$pki"
  chmod 700 "$pki"
  local san="IP:127.0.0.1"
  for h in ${hosts//,/ }; do [[ $h == 127.0.0.1 ]] || san+=",IP:$h"; done
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=vflow test CA" \
    -keyout "$pki/ca-key.pem" -out "$pki/ca.pem" 2>/dev/null
  for who in server client; do
    openssl req -newkey rsa:2048 -nodes -subj "$( [[ $who == server ]] && echo /CN=vflow-etcd-server || echo /O=vflow-client )" \
      -keyout "$pki/$who-key.pem" -out "$pki/$who.csr" 2>/dev/null
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" > "$pki/$who.ext"
    openssl x509 -req -in "$pki/$who.csr" -CA "$pki/ca.pem" -CAkey "$pki/ca-key.pem" \
      -CAcreateserial -days 2 -extfile "$pki/$who.ext" -out "$pki/$who.pem" 2>/dev/null
  done
  chmod 600 "$pki"/*-key.pem
}

start_member() {
  local m=$1
  # shellcheck disable=SC1090
  source "$dir/member$m.env"
  local scheme=http tls=()
  if [[ -f "$dir/pki/ca.pem" ]]; then
    scheme=https
    tls=(--cert-file "$dir/pki/server.pem" --key-file "$dir/pki/server-key.pem"
         --trusted-ca-file "$dir/pki/ca.pem" --client-cert-auth
         --peer-cert-file "$dir/pki/server.pem" --peer-key-file "$dir/pki/server-key.pem"
         --peer-trusted-ca-file "$dir/pki/ca.pem" --peer-client-cert-auth)
  fi
  local ns run=()
  ns=$(netns_of "$m")
  [[ -n $ns ]] && run=(ip netns exec "$ns")
  # A simple command, not a function: $! is then the member itself (ip netns exec runs it
  # in place), which stop, freeze and thaw signal.
  "${run[@]}" etcd --name "m$m" --data-dir "$dir/m$m" \
    --listen-client-urls "$scheme://$HOST:$CLIENT" --advertise-client-urls "$scheme://$HOST:$CLIENT" \
    --listen-peer-urls "$scheme://$HOST:$PEER" --initial-advertise-peer-urls "$scheme://$HOST:$PEER" \
    --initial-cluster "$(cat "$dir/initial-cluster")" --initial-cluster-state new \
    --initial-cluster-token "vflow-$(basename "$dir")" \
    --auto-compaction-mode periodic --auto-compaction-retention 5m \
    --quota-backend-bytes $((512 * 1024 * 1024)) "${tls[@]}" \
    >> "$dir/m$m.log" 2>&1 &
  echo $! > "$dir/m$m.pid"
}

wait_healthy() {
  for _ in $(seq 1 100); do
    if ctl endpoint health >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  tail -n 20 "$dir"/m*.log >&2 || true
  die "etcd at $(cat "$dir/endpoints.https") did not become healthy within 10 s"
}

case $cmd in
  start)
    members=1 hosts="" tls=0 auth="" netns=""
    while [[ $# -gt 0 ]]; do
      case $1 in
        --members) members=$2; shift 2 ;;
        --hosts) hosts=$2; shift 2 ;;
        --netns) netns=$2; shift 2 ;;
        --tls) tls=1; shift ;;
        --auth) auth=$2; shift 2 ;;
        *) die "unknown option $1" ;;
      esac
    done
    command -v etcd >/dev/null || die "etcd is not installed (Debian: apt-get install etcd-server etcd-client)"
    mkdir -p "$dir"
    IFS=, read -r -a host_list <<< "${hosts:-127.0.0.1}"
    [[ ${#host_list[@]} -eq 1 || ${#host_list[@]} -eq $members ]] ||
      die "--hosts names ${#host_list[@]} addresses for $members members"
    [[ $tls == 1 ]] && make_pki "${hosts:-127.0.0.1}"
    if [[ -n $netns ]]; then echo "$netns" > "$dir/netns"; else rm -f "$dir/netns"; fi
    scheme=http vflow_scheme=etcd
    [[ $tls == 1 ]] && scheme=https vflow_scheme=etcds
    initial="" urls="" endpoints=""
    for ((m = 0; m < members; m++)); do
      host=${host_list[0]}
      [[ ${#host_list[@]} -gt 1 ]] && host=${host_list[$m]}
      client=$(free_port) peer=$(free_port)
      printf 'HOST=%s\nCLIENT=%s\nPEER=%s\n' "$host" "$client" "$peer" > "$dir/member$m.env"
      initial+="${initial:+,}m$m=$scheme://$host:$peer"
      urls+="${urls:+,}$scheme://$host:$client"
      endpoints+="${endpoints:+,}$host:$client"
    done
    echo "$initial" > "$dir/initial-cluster"
    echo "$urls" > "$dir/endpoints.https"
    for ((m = 0; m < members; m++)); do start_member "$m"; done
    wait_healthy
    if [[ -n $auth ]]; then
      ctl user add "root:$auth" >/dev/null
      ctl user grant-role root root >/dev/null
      ctl auth enable >/dev/null
      echo "$auth" > "$dir/root-password"
      chmod 600 "$dir/root-password"
    fi
    echo "$vflow_scheme://$endpoints" | tee "$dir/endpoints"
    ;;
  job-user)
    [[ $# -eq 3 ]] || die "usage: $0 job-user DIR JOB USER PASSWORD"
    job=$1 user=$2 password=$3
    role="vflow-job-$job"
    ctl role add "$role" >/dev/null
    # The job's keys: [/vflow/jobs/JOB/, /vflow/jobs/JOB0) (the prefix's end).
    ctl role grant-permission "$role" --prefix=true readwrite "/vflow/jobs/$job/" >/dev/null
    ctl role grant-permission "$role" --prefix=true read "/vflow/agents/" >/dev/null
    ctl role grant-permission "$role" --prefix=true read "/vflow/store/alive/agent/" >/dev/null
    ctl user add "$user:$password" >/dev/null
    ctl user grant-role "$user" "$role" >/dev/null
    ;;
  agent-user)
    [[ $# -eq 2 ]] || die "usage: $0 agent-user DIR USER PASSWORD"
    user=$1 password=$2
    ctl role add vflow-agents >/dev/null 2>&1 || true
    ctl role grant-permission vflow-agents --prefix=true readwrite "/vflow/" >/dev/null
    ctl user add "$user:$password" >/dev/null
    ctl user grant-role "$user" vflow-agents >/dev/null
    ;;
  stop)
    for pidfile in "$dir"/m*.pid; do
      [[ -f $pidfile ]] || continue
      m=${pidfile##*/m}; m=${m%.pid}
      [[ $# -ge 1 && $1 != "$m" ]] && continue
      pid=$(cat "$pidfile")
      kill "$pid" 2>/dev/null || true
      kill -CONT "$pid" 2>/dev/null || true  # a frozen member stops too
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$pidfile"
    done
    ;;
  restart)
    [[ $# -eq 1 ]] || die "usage: $0 restart DIR MEMBER"
    start_member "$1"
    ;;
  freeze|thaw)
    [[ $# -eq 1 && -f "$dir/m$1.pid" ]] || die "usage: $0 $cmd DIR MEMBER (a running member)"
    kill "-$([[ $cmd == freeze ]] && echo STOP || echo CONT)" "$(cat "$dir/m$1.pid")"
    ;;
  *) die "unknown command $cmd" ;;
esac
