#!/usr/bin/env python3
"""The step time of an elastic job whose steps are short, on each control store.

A job of two workers on this machine (vflow-train --workers 2; the MLP on Fashion-MNIST,
global batch 64 as 2 vnodes, one thread each: steps of about 2 ms) trains 400 steps; the
figure is the median gap between its step records after the first 50. Anything a worker
does against the job's store inside a step shows here: on etcd a round trip costs about
as much as a step of this job. With a second build directory the builds run alternately,
so that a change to the worker's step is measured against the build before it.

Usage: bench/elastic_step.py [--repeats 7] [--stores embedded,etcd] BUILD [OTHER_BUILD]
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = [
    "--set", "semantic.model.name=mlp", "--set", "semantic.model.options={}",
    "--set", "semantic.global_batch=64", "--set", "semantic.virtual_nodes=2",
    "--set", "semantic.steps=400", "--set", "semantic.epochs=null",
    "--set", "resources.threads=1", "--set", "output.logging.progress=off",
    "--set", "output.logging.every_steps=1", "--set", "output.evaluation.enabled=false",
]
SKIP = 50  # start-up and the first steps' allocations
NAMES = itertools.count(1)


def median_step(build, control):
    with tempfile.TemporaryDirectory() as d:
        metrics = os.path.join(d, "m.jsonl")
        where = ["--control", control, "--job", f"step-{next(NAMES)}", "--local"] if control else []
        run = subprocess.run([os.path.join(build, "vflow-train"), *JOB,
                              "--set", f"output.logging.metrics={metrics}", "--workers", "2",
                              *where], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"{build}: vflow-train exited {run.returncode}:\n{run.stderr[-2000:]}")
        with open(metrics) as f:
            times = [r["time"] for r in map(json.loads, f) if r.get("event") == "step"]
        return statistics.median(b - a for a, b in zip(times[SKIP:], times[SKIP + 1:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--stores", default="embedded,etcd")
    ap.add_argument("builds", nargs="+")
    a = ap.parse_args()
    etcd_dir = None
    control = {"embedded": None}
    if "etcd" in a.stores.split(","):
        etcd_dir = tempfile.mkdtemp(prefix="vflow-etcd-")
        control["etcd"] = subprocess.run([os.path.join(ROOT, "scripts", "etcd-local.sh"), "start",
                                          etcd_dir], check=True, capture_output=True,
                                         text=True).stdout.strip()
    steps = {}
    try:
        for store in a.stores.split(","):
            for k in range(a.repeats):
                for b in a.builds:  # alternating, so that drift hits each alike
                    s = median_step(b, control[store])
                    steps.setdefault((store, b), []).append(s)
                    print(f"{store}, {b} #{k + 1}: {1e3 * s:.2f} ms", file=sys.stderr, flush=True)
    finally:
        if etcd_dir:
            subprocess.run([os.path.join(ROOT, "scripts", "etcd-local.sh"), "stop", etcd_dir])
            subprocess.run(["rm", "-rf", etcd_dir])
    print("| store | build | median step (ms) (min-max of the runs' medians) |")
    print("|---|---|---|")
    for (store, b), v in steps.items():
        print(f"| {store} | {b} | {1e3 * statistics.median(v):.2f} "
              f"({1e3 * min(v):.2f}-{1e3 * max(v):.2f}) |")


if __name__ == "__main__":
    main()
