#!/usr/bin/env python3
"""How much of a job's time the simulator charges for resizes, migrations and preemptions,
and how mean JCT moves when those costs grow (docs/scheduler.md, "What the pauses cost").

For each setting and each cost (restart_s, resize_pause_s), runs `vflow-sched simulate` with
marginal, srtf and priority and prints the mean JCT and the charged share: the seconds of
pause the measured jobs were charged (resizes x resize pause + (migrations + preemptions) x
restart) over their summed JCT. The share bounds what counting these costs in a policy's
objective could save directly: a policy that avoided every pause at no other loss would
save exactly that.

Usage: docs/scheduler/cost_sensitivity.py PATH/TO/vflow-sched
"""
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POLICIES = ["marginal", "srtf", "priority"]
COSTS = [(30, 0.1), (300, 10), (3000, 60)]  # (restart_s, resize_pause_s); the first is the default


def settings():
    paper = os.path.join(ROOT, "data/scheduler/paper_throughput.tsv")
    gavel = os.path.join(ROOT, "data/scheduler/gavel_throughput.tsv")
    yield ("paper-style, 12 jobs/h, seeds 1-10", None,
           [["--workload", "paper", "--jobs", "20", "--rate", "12/h", "--devices", "8",
             "--throughput", paper, "--seed", str(s)] for s in range(1, 11)])
    yield ("Gavel shape, 1.5 jobs/h, seeds 1-3", (4000, 5000),
           [["--workload", "synthetic", "--jobs", "6000", "--rate", "1.5/h",
             "--cluster", "v100:36,p100:36,k80:36", "--throughput", gavel,
             "--measure", "4000:5000", "--seed", str(s)] for s in range(1, 4)])


def run(binary, args, out):
    subprocess.run([binary, "simulate", *args, "--policy", *POLICIES, "--out", out],
                   check=True, capture_output=True, text=True)
    means = {e["policy"]: e["jct"]["mean_s"] for e in json.load(open(os.path.join(out, "summary.json")))}
    return means


def charged(out, policy, window, restart, pause):
    paused = jct = 0.0
    with open(os.path.join(out, f"jobs_{policy}.csv")) as f:
        for row in csv.DictReader(f):
            if window and not window[0] <= int(row["id"]) < window[1]:
                continue
            paused += int(row["resizes"]) * pause + (int(row["migrations"]) +
                                                     int(row["preemptions"])) * restart
            jct += float(row["jct_s"])
    return paused, jct


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        print("| setting | restart_s / resize pause | policy | mean JCT | charged share |")
        print("|---|---|---|---|---|")
        for name, window, runs in settings():
            for restart, pause in COSTS:
                means = {p: [] for p in POLICIES}
                sums = {p: [0.0, 0.0] for p in POLICIES}
                for k, args in enumerate(runs):
                    out = os.path.join(tmp, f"{len(name)}-{restart}-{k}")
                    cost = ["--restart", str(restart), "--resize-pause", str(pause)]
                    for p, m in run(binary, args + cost, out).items():
                        means[p].append(m)
                        paused, jct = charged(out, p, window, restart, pause)
                        sums[p][0] += paused
                        sums[p][1] += jct
                for p in POLICIES:
                    print(f"| {name} | {restart} / {pause} | {p} | {statistics.mean(means[p]):.0f} s | "
                          f"{100 * sums[p][0] / sums[p][1]:.2f}% |", flush=True)


if __name__ == "__main__":
    main()
