#!/usr/bin/env python3
"""Philly-style synthetic traces for docs/scheduler.md, in vflow-sched's Philly CSV format
(timestamp,duration,num_gpus).

    philly_traces.py OUT_DIR

Writes OUT_DIR/philly-J{jobs}-D{devices}-L{load}-s{seed}.csv for every setting below. A trace
of J jobs on D devices: Poisson arrivals, demands 1/2/4/8 GPUs with probabilities
0.55/0.20/0.15/0.10 (most Philly jobs use one GPU), run times log-uniform between 20 minutes
and 4 hours at that demand. The mean inter-arrival gap makes the offered load L: the mean
device-seconds a job asks for (about 12,480) over D devices times the gap. Everything comes
from Python's random.Random(seed), so a seed gives the same trace everywhere.
"""
import math
import os
import random
import sys

DEMANDS = [(1, 0.55), (2, 0.20), (4, 0.15), (8, 0.10)]
SHORTEST, LONGEST = 20 * 60, 4 * 3600
SETTINGS = [  # (jobs, devices)
    (30, 8),
    (100, 16),
    (300, 64),
]
LOADS = [0.5, 1, 2, 4]
SEEDS = range(1, 11)


def mean_device_seconds():
    mean_duration = (LONGEST - SHORTEST) / math.log(LONGEST / SHORTEST)
    return mean_duration * sum(d * p for d, p in DEMANDS)


def trace(jobs, devices, load, seed):
    rng = random.Random(seed)
    gap = mean_device_seconds() / (devices * load)
    t = 0.0
    rows = []
    for _ in range(jobs):
        u, demand = rng.random(), DEMANDS[-1][0]
        for d, p in DEMANDS:
            if u < p:
                demand = d
                break
            u -= p
        duration = math.exp(rng.uniform(math.log(SHORTEST), math.log(LONGEST)))
        rows.append((round(t, 1), round(duration, 1), demand))
        t += rng.expovariate(1 / gap)
    return rows


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for jobs, devices in SETTINGS:
        for load in LOADS:
            for seed in SEEDS:
                path = os.path.join(out, f"philly-J{jobs}-D{devices}-L{load}-s{seed}.csv")
                with open(path, "w") as f:
                    f.write("timestamp,duration,num_gpus\n")
                    for row in trace(jobs, devices, load, seed):
                        f.write("%s,%s,%d\n" % row)


if __name__ == "__main__":
    main()
