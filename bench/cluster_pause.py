#!/usr/bin/env python3
"""Pauses of an elastic job across three hosts, host-loss detection and coordinator failover.

Runs inside tests/netns/cluster.sh, which makes three hosts in network namespaces, each
with an etcd member and a vflow-agent (two cpu slots), and sets CLUSTER_PREFIX,
CLUSTER_URLS and CLUSTER_ETCD:

  tests/netns/cluster.sh build OUT run /usr/bin/python3 bench/cluster_pause.py --build build

Every event runs on a fresh job submitted on the first host (vflow-train's built-in
ConvNet job on Fashion-MNIST, one intra-op thread per worker, a metrics record per step,
resources.timeout_s = 10, so leases live 4 s) whose workers the agents place across the
hosts:

  scale-out 2 -> 3, scale-in 3 -> 2, failure (SIGKILL of 1 of 3 workers): the pause the
      surviving workers see, measured as bench/elastic_pause.py does;
  coordinator failover: SIGKILL of the submitting process, the job's coordinator: the time
      until an agent holds the coordinator's claim, and the pause the workers see;
  host loss: the link of the host running a worker is cut (its etcd member, agent and
      worker are gone for the others): the time until that worker's lease is gone in etcd
      (detection), and the pause, which includes Gloo's timeout for the silent peer.

Usage: bench/cluster_pause.py [--build build] [--repeats 3]
"""
import argparse
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elastic_pause import COMMON, pause_around, records, wait_for  # noqa: E402

PREFIX = os.environ.get("CLUSTER_PREFIX", "")
URLS = os.environ.get("CLUSTER_URLS", "").split()
ETCD = os.environ.get("CLUSTER_ETCD", "")
NAMES = itertools.count(1)


def on(host, *command, **kwargs):
    """Runs `command` on host `host` (0, 1, 2)."""
    return ["ip", "netns", "exec", f"{PREFIX}-h{host}", *command]


def etcd_get(key):
    """The value of `key` (empty when absent), read through host 0's etcd member."""
    endpoints = URLS[0][len("etcd://"):]
    out = subprocess.run(on(0, "etcdctl", "--endpoints", endpoints, "get", key,
                            "--print-value-only"),
                         capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})
    return out.stdout.strip()


class ClusterJob:
    def __init__(self, build, workdir, workers):
        self.build = build
        self.name = f"pause-{next(NAMES)}"
        self.metrics = os.path.join(workdir, "m.jsonl")
        self.log = open(os.path.join(workdir, f"{self.name}.log"), "w")
        self.proc = subprocess.Popen(
            on(0, os.path.join(build, "vflow-train"), *COMMON,
               "--set", "resources.timeout_s=10",
               "--set", f"output.logging.metrics={self.metrics}",
               "--workers", str(workers), "--control", URLS[0], "--job", self.name),
            stdout=self.log, stderr=subprocess.STDOUT)

    def ctl(self, command, *args):
        return subprocess.run(on(0, os.path.join(self.build, "vflow-ctl"), "--timeout", "5",
                                 "--control", URLS[0], command, *args),
                              capture_output=True, text=True)

    def status(self):
        return self.ctl("status", self.name).stdout

    def steps(self):
        return len(records(self.metrics))

    def members(self):
        """(member, pid) of each rank."""
        return [(l.split()[3], int(l.split()[5])) for l in self.status().splitlines()
                if l.startswith("rank ")]

    def host_of(self, member):
        """The host (0, 1, 2) whose agent runs `member`."""
        agents = self.ctl("agents").stdout
        host = None
        for line in agents.splitlines():
            if " host " in line:
                host = int(line.split()[0][1:])  # agents are named h0, h1, h2
            elif line.strip().endswith(f"job {self.name} {member}"):
                return host
        raise RuntimeError(f"no agent runs worker {member}:\n{agents}")

    def end(self):
        """Stops the job and waits until its keys are gone (its last coordinator's work)."""
        self.ctl("stop", self.name)
        wait_for(lambda: self.ctl("status", self.name).returncode == 7, timeout=120,
                 what=f"job {self.name} to end")
        if self.proc.poll() is None:
            self.proc.wait(timeout=60)


def new_generation_after(job, event, workers):
    """The pause around the first step of `workers` workers after `event`."""
    wait_for(lambda: any(r["workers"] == workers and r["time"] > event
                         for r in records(job.metrics)[-25:]), what=f"{workers} workers")
    start_of_new = [r for r in records(job.metrics)
                    if r["workers"] == workers and r["time"] > event][0]["time"]
    wait_for(lambda: len([r for r in records(job.metrics) if r["time"] > start_of_new]) >= 20,
             what="20 steps after the event")
    recs = records(job.metrics)
    times = [r["time"] for r in recs]
    return pause_around(recs, times[times.index(start_of_new) - 1] + 1e-9)[0]


def run_resize(build, frm, to, kill=False):
    with tempfile.TemporaryDirectory() as d:
        job = ClusterJob(build, d, frm)
        wait_for(lambda: job.steps() >= 10, what="10 steps")
        event = time.time()
        if kill:
            os.kill(job.members()[-1][1], signal.SIGKILL)
        else:
            job.ctl("resize", job.name, str(to))
        pause = new_generation_after(job, event, to)
        job.end()
        return {"pause": pause}


def run_failover(build):
    with tempfile.TemporaryDirectory() as d:
        job = ClusterJob(build, d, 3)
        wait_for(lambda: job.steps() >= 10, what="10 steps")
        claim = f"/vflow/jobs/{job.name}/store/claim/coordinator"
        assert etcd_get(claim).startswith("submitter"), etcd_get(claim)
        event = time.time()
        job.proc.send_signal(signal.SIGKILL)
        holder = wait_for(lambda: (lambda h: h if h.startswith("agent") else None)(etcd_get(claim)),
                          timeout=60, what="an agent to take the claim")
        failover = time.time() - event
        wait_for(lambda: len([r for r in records(job.metrics) if r["time"] > event]) >= 20,
                 what="20 steps after the failover")
        recs = records(job.metrics)
        pause = pause_around(recs, event)[0]
        print(f"  {holder} took over after {failover:.3f} s", file=sys.stderr, flush=True)
        job.end()
        return {"failover": failover, "pause": pause}


def run_host_loss(build):
    with tempfile.TemporaryDirectory() as d:
        job = ClusterJob(build, d, 3)
        wait_for(lambda: job.steps() >= 10 and len(job.members()) == 3, what="10 steps")
        member, _ = job.members()[-1]
        host = job.host_of(member)
        lease = f"/vflow/jobs/{job.name}/store/alive/worker/{member}"
        assert etcd_get(lease), "the worker has no lease"
        event = time.time()
        subprocess.run(["ip", "-n", f"{PREFIX}-h{host}", "link", "set", "eth0", "down"],
                       check=True)
        # Read through host 0: the cut host is never it (it runs the submitter's first worker).
        wait_for(lambda: not etcd_get(lease), timeout=60, what="the lease to expire")
        detected = time.time() - event
        pause = new_generation_after(job, event, 2)
        subprocess.run(["ip", "-n", f"{PREFIX}-h{host}", "link", "set", "eth0", "up"], check=True)
        job.end()
        # The host is back: its agent renews its lease and its stranded worker ends.
        wait_for(lambda: job.ctl("agents").stdout.count(" free") == 6, timeout=120,
                 what="every slot free again")
        return {"detection": detected, "pause": pause}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if not PREFIX or len(URLS) != 3:
        ap.error("run me through tests/netns/cluster.sh BUILD OUT run ... (see the docstring)")
    build = os.path.abspath(a.build)
    scenarios = [
        ("scale-out 2 -> 3", lambda: run_resize(build, 2, 3)),
        ("scale-in 3 -> 2", lambda: run_resize(build, 3, 2)),
        ("failure: SIGKILL 1 of 3", lambda: run_resize(build, 3, 2, kill=True)),
        ("coordinator SIGKILLed", lambda: run_failover(build)),
        ("host loss (link cut)", lambda: run_host_loss(build)),
    ]
    results = {name: {} for name, _ in scenarios}
    for k in range(a.repeats):
        for name, fn in scenarios:
            figures = fn()
            print(f"{name} #{k + 1}: " + ", ".join(f"{f} {v:.3f} s" for f, v in figures.items()),
                  file=sys.stderr, flush=True)
            for f, v in figures.items():
                results[name].setdefault(f, []).append(v)
    print("| event | figure | median (s) | min-max (s) |")
    print("|---|---|---|---|")
    for name, figures in results.items():
        for f, values in figures.items():
            print(f"| {name} | {f} | {statistics.median(values):.3f} | "
                  f"{min(values):.3f}-{max(values):.3f} |")


if __name__ == "__main__":
    main()
