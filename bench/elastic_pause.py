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

Usage: bench/elastic_pause.py [--build build] [--repeats 3]
"""
import argparse
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


class Job:
    def __init__(self, build, workdir, workers, extra=()):
        self.build = build
        self.port = free_port()
        self.metrics = os.path.join(workdir, "m.jsonl")
        self.ckpt = os.path.join(workdir, "ck")
        self.args = [os.path.join(build, "vflow-train"), *COMMON,
                     "--set", f"output.logging.metrics={self.metrics}",
                     "--set", f"output.checkpoint.dir={self.ckpt}", *extra]
        self.log = open(os.path.join(workdir, "log.txt"), "a")
        self.start(workers)

    def start(self, workers, extra=()):
        self.proc = subprocess.Popen(
            [*self.args, *extra, "--workers", str(workers), "--port", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT)

    def ctl(self, command, *args):
        return subprocess.run([os.path.join(self.build, "vflow-ctl"), command,
                               f"127.0.0.1:{self.port}", *args],
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


def run_resize(build, frm, to, kill=False):
    with tempfile.TemporaryDirectory() as d:
        job = Job(build, d, frm)
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


def run_restart(build, frm, to):
    with tempfile.TemporaryDirectory() as d:
        job = Job(build, d, frm)
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
    a = ap.parse_args()
    scenarios = [
        ("scale-out 2 -> 3", lambda: run_resize(a.build, 2, 3)),
        ("scale-in 3 -> 2", lambda: run_resize(a.build, 3, 2)),
        ("failure: SIGKILL 1 of 3", lambda: run_resize(a.build, 3, 2, kill=True)),
        ("restart baseline 2 -> 3", lambda: run_restart(a.build, 2, 3)),
    ]
    results = {}
    for name, fn in scenarios:
        pauses = []
        for k in range(a.repeats):
            pause, gap, step = fn()
            print(f"{name} #{k + 1}: pause {pause:.3f} s (step around the event {gap:.3f} s, "
                  f"median step after it {step:.3f} s)", file=sys.stderr, flush=True)
            pauses.append(pause)
        results[name] = statistics.median(pauses)
    base = results["restart baseline 2 -> 3"]
    print("| event | median pause (s) | restart baseline / pause |")
    print("|---|---|---|")
    for name, p in results.items():
        ratio = "" if name.startswith("restart") else f"{base / p:.0f}x" if p > 0 else "inf"
        print(f"| {name} | {p:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
