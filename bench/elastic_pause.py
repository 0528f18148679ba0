#!/usr/bin/env python3
"""The pause surviving workers see when an elastic job changes size, against a restart.

Runs the default ConvNet job on Fashion-MNIST (vflow-train's built-in job) with a
per-step metrics record, triggers one event per run, and measures from the records'
wall-clock times:

  pause = (time between the step records around the event) - (median step time of the
          generation after the event)

Events: scale-out (2 -> 3 workers: a joiner warms up off the critical path, then receives
the state), scale-in (3 -> 2), failure (SIGKILL of one of 3 workers: detection, regroup
and the interrupted step redone), and the restart baseline a user has without vflow's
elasticity (stop all workers with a checkpoint, start new processes that load it, continue;
what torchrun-style restarts do) for 2 -> 3 workers.

With --stores embedded,etcd every event runs on both control stores, alternating: the
store the launcher hosts (the default) and a local etcd (scripts/etcd-local.sh; the job's
generations, requests and Gloo rendezvous then go through etcd).

With --against OTHER_BUILD every run is made with both builds, alternating, and the table
gives each build's median pause and median step time (of the generation after the event)
side by side: a change to the worker's step or its regroup, measured against the build
before it.

Usage: bench/elastic_pause.py [--build build] [--repeats 3] [--stores embedded,etcd]
                              [--against OTHER_BUILD]
"""
import argparse
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

COMMON = [
    "--set", "semantic.steps=100000", "--set", "semantic.epochs=null",
    "--set", "resources.threads=1", "--set", "output.logging.progress=off",
    "--set", "output.logging.every_steps=1", "--set", "output.evaluation.enabled=false",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def records(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if r.get("event") == "step":
                out.append(r)
    return out


def wait_for(predicate, timeout=600, what="condition"):
    start = time.time()
    while time.time() - start < timeout:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB_NAMES = itertools.count(1)


class Etcd:
    """A local etcd for the runs on the cluster control store."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="vflow-etcd-")
        self.url = subprocess.run([os.path.join(ROOT, "scripts", "etcd-local.sh"), "start",
                                   self.dir], check=True, capture_output=True,
                                  text=True).stdout.strip()

    def close(self):
        subprocess.run([os.path.join(ROOT, "scripts", "etcd-local.sh"), "stop", self.dir])
        subprocess.run(["rm", "-rf", self.dir])


class Job:
    def __init__(self, build, workdir, workers, extra=(), control=None):
        self.build = build
        self.port = free_port()
        self.control = control  # an etcd URL, or None: the launcher hosts the store
        self.name = f"pause-{next(JOB_NAMES)}"
        self.metrics = os.path.join(workdir, "m.jsonl")
        self.ckpt = os.path.join(workdir, "ck")
        self.args = [os.path.join(build, "vflow-train"), *COMMON,
                     "--set", f"output.logging.metrics={self.metrics}",
                     "--set", f"output.checkpoint.dir={self.ckpt}", *extra]
        self.log = open(os.path.join(workdir, "log.txt"), "a")
        self.start(workers)

    def start(self, workers, extra=()):
        self.proc = subprocess.Popen(
            [*self.args, *extra, "--workers", str(workers), *self.where()],
            stdout=self.log, stderr=subprocess.STDOUT)

    def where(self):
        if self.control:  # its workers on this machine (--local), as with the embedded store
            return ["--control", self.control, "--job", self.name, "--local"]
        return ["--port", str(self.port)]

    def ctl(self, command, *args):
        control = ["--control", self.control] if self.control else []
        address = self.name if self.control else f"127.0.0.1:{self.port}"
        return subprocess.run([os.path.join(self.build, "vflow-ctl"), *control, command,
                               address, *args],
                              capture_output=True, text=True).stdout

    def steps(self):
        return len(records(self.metrics))

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=300)


def pause_around(recs, event_time):
    """Gap of the step records spanning event_time minus the new generation's median step."""
    times = [r["time"] for r in recs]
    after = next(i for i, t in enumerate(times) if t > event_time)
    gap = times[after] - times[after - 1]
    later = [b - a for a, b in zip(times[after:], times[after + 1:])][:20]
    return gap - statistics.median(later), gap, statistics.median(later)


def run_resize(build, frm, to, kill=False, control=None):
    with tempfile.TemporaryDirectory() as d:
        job = Job(build, d, frm, control=control)
        wait_for(lambda: job.steps() >= 10, what="10 steps")
        if kill:
            status = job.ctl("status")
            pid = int([l for l in status.splitlines() if l.startswith(f"rank {frm - 1} ")][0]
                      .split()[-1])
            event = time.time()
            os.kill(pid, signal.SIGKILL)
        else:
            event = time.time()
            job.ctl("resize", str(to))
        wait_for(lambda: any(r["workers"] == to and r["time"] > event
                             for r in records(job.metrics)[-25:]), what=f"{to} workers")
        # The joiner warms up off the critical path: measure at the step it joins.
        joined = [r for r in records(job.metrics) if r["workers"] == to and r["time"] > event]
        start_of_new = joined[0]["time"]
        wait_for(lambda: len([r for r in records(job.metrics) if r["time"] > start_of_new]) >= 20,
                 what="20 steps after the event")
        job.stop()
        recs = records(job.metrics)
        # The step whose record is the first of the new generation spans the change.
        times = [r["time"] for r in recs]
        i = times.index(start_of_new)
        return pause_around(recs, times[i - 1] + 1e-9)


def run_restart(build, frm, to, control=None):
    with tempfile.TemporaryDirectory() as d:
        job = Job(build, d, frm, control=control)
        wait_for(lambda: job.steps() >= 10, what="10 steps")
        event = time.time()
        job.stop()  # all workers stop after the same step; rank 0 writes a checkpoint
        last = records(job.metrics)[-1]["time"]
        job.start(to, ["--resume", "latest"])
        wait_for(lambda: len([r for r in records(job.metrics) if r["time"] > event]) >= 20,
                 what="20 steps after the restart")
        job.stop()
        return pause_around(records(job.metrics), last + 1e-9)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--against", default=None,
                    help="a second build directory (or install's bin) to run alternately")
    ap.add_argument("--stores", default="embedded",
                    help="comma-separated control stores to compare: embedded, etcd")
    a = ap.parse_args()
    stores = a.stores.split(",")
    if any(st not in ("embedded", "etcd") for st in stores):
        ap.error("--stores takes embedded and etcd")
    etcd = Etcd() if "etcd" in stores else None
    control = {"embedded": None, "etcd": etcd.url if etcd else None}
    builds = [a.build] + ([a.against] if a.against else [])
    scenarios = [
        ("scale-out 2 -> 3", lambda b, c: run_resize(b, 2, 3, control=c)),
        ("scale-in 3 -> 2", lambda b, c: run_resize(b, 3, 2, control=c)),
        ("failure: SIGKILL 1 of 3", lambda b, c: run_resize(b, 3, 2, kill=True, control=c)),
        ("restart baseline 2 -> 3", lambda b, c: run_restart(b, 2, 3, control=c)),
    ]
    # Each (store, build) pair is a variant; a repeat runs every variant once, alternating,
    # so that drift hits each alike.
    variants = [(st, b) for st in stores for b in builds]
    results = {}
    try:
        for name, fn in scenarios:
            pauses = {v: [] for v in variants}
            steps = {v: [] for v in variants}
            for k in range(a.repeats):
                for st, b in variants:
                    pause, gap, step = fn(b, control[st])
                    shown = st if len(builds) == 1 else f"{st}, {b}"
                    print(f"{name} ({shown}) #{k + 1}: pause {pause:.3f} s (step around the "
                          f"event {gap:.3f} s, median step after it {step:.3f} s)",
                          file=sys.stderr, flush=True)
                    pauses[(st, b)].append(pause)
                    steps[(st, b)].append(step)
            results[name] = {v: (statistics.median(pauses[v]), min(pauses[v]), max(pauses[v]),
                                 statistics.median(steps[v])) for v in variants}
    finally:
        if etcd:
            etcd.close()
    if len(builds) == 1:
        base = results["restart baseline 2 -> 3"]
        print("| event | " + " | ".join(f"{st}: median pause (s) (min-max) | restart / pause"
                                         for st in stores) + " |")
        print("|---|" + "---|---|" * len(stores))
        for name, by_variant in results.items():
            cells = []
            for st in stores:
                p, lo, hi, _ = by_variant[(st, a.build)]
                b0 = base[(st, a.build)][0]
                ratio = "" if name.startswith("restart") else f"{b0 / p:.0f}x" if p > 0 else "inf"
                cells += [f"{p:.3f} ({lo:.3f}-{hi:.3f})", ratio]
            print(f"| {name} | " + " | ".join(cells) + " |")
        return
    print(f"| event | store | pause (s), {a.build} (min-max) | pause (s), {a.against} (min-max) "
          f"| median step (s), {a.build} | median step (s), {a.against} |")
    print("|---|---|---|---|---|---|")
    for name, by_variant in results.items():
        for st in stores:
            mine, theirs = by_variant[(st, a.build)], by_variant[(st, a.against)]
            print(f"| {name} | {st} | {mine[0]:.3f} ({mine[1]:.3f}-{mine[2]:.3f}) "
                  f"| {theirs[0]:.3f} ({theirs[1]:.3f}-{theirs[2]:.3f}) "
                  f"| {mine[3]:.4f} | {theirs[3]:.4f} |")

if __name__ == "__main__":
    main()
