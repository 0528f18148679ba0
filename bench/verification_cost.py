#!/usr/bin/python3
"""The cost of cross-checks (resources.verify_every_steps, docs/verification.md).

The default job (ConvNet on Fashion-MNIST, B 256 as 8 vnodes), deterministic, trains on
K workers (--workers, default 2: 4 vnodes each) with cross-checks off and every N steps
for each N of --every (default 1,10,100), the configurations' order rotating from repeat
to repeat so that the machine's drift affects all alike. The table gives each
configuration's median examples/s over the timed steps (the first WARMUP steps of every
run left out) with the min-max over repeats, and its ratio to the run without checks in
the same repeat (median, min-max). At N = 1 every step has one check, so its cost is one
check's; at N the expected cost is that divided by N.

Runs differ by several percent on a shared machine, more than a check every 100 steps
costs, so a second table measures the cost inside each run: the median time of the
checked steps (step % N == 0) against the median of the others in the same run, and the
cost at N that gives, (checked - other) / (N x other), with the min-max over repeats.

    bench/verification_cost.py [--build build] [--workers 2] [--every 1,10,100]
                               [--steps 200] [--repeats 5] [--threads 1]
"""
import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vflow_runs  # noqa: E402
WARMUP = 3


def run(args, every):
    """Examples/s of the run, and (checked, other) median step seconds where every > 1."""
    steps = vflow_runs.timed_steps(
        args.build, ["--workers", str(args.workers), "--set", "semantic.deterministic=true",
                     "--set", f"resources.verify_every_steps={every}"],
        args.steps, WARMUP, args.threads)
    split = None
    if every > 1:
        # The records count steps from 1: record r is step r - 1.
        checked = [1 / r["examples_per_second"] for r in steps if (r["step"] - 1) % every == 0]
        other = [1 / r["examples_per_second"] for r in steps if (r["step"] - 1) % every != 0]
        if checked and other:
            split = (statistics.median(checked), statistics.median(other))
    return vflow_runs.summary(steps)["examples_per_second"], split


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--every", default="1,10,100")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    args = parser.parse_args()
    configs = [0] + [int(n) for n in args.every.split(",")]
    speed = {c: [] for c in configs}
    ratio = {c: [] for c in configs}
    inside = {c: [] for c in configs}  # per run: the cost at N from its own steps
    for r in range(args.repeats):
        shift = r % len(configs)
        for c in configs[shift:] + configs[:shift]:
            eps, split = run(args, c)
            speed[c].append(eps)
            if split:
                inside[c].append((split[0] - split[1]) / (c * split[1]))
        for c in configs:
            ratio[c].append(speed[c][-1] / speed[0][-1])
        print(f"repeat {r + 1}: " + ", ".join(
            f"{'off' if c == 0 else 'N=' + str(c)} {speed[c][-1]:.0f}" for c in configs),
            flush=True)
    print(f"\nDefault job, deterministic, {args.workers} workers, {args.threads} thread(s) each, "
          f"{args.steps} timed steps; median (min-max) of {args.repeats} repeats\n")
    print("| verify_every_steps | examples/s | ratio to off | cost |")
    print("|---|---|---|---|")
    for c in configs:
        s, q = speed[c], ratio[c]
        cost = 1 - statistics.median(q)
        print(f"| {'0 (off)' if c == 0 else c} | {statistics.median(s):.0f} "
              f"({min(s):.0f}-{max(s):.0f}) | {statistics.median(q):.3f} "
              f"({min(q):.3f}-{max(q):.3f}) | {100 * cost:.1f} % |")
    print("\n| verify_every_steps | cost inside the runs: (checked - other) / (N x other) |")
    print("|---|---|")
    for c in configs:
        if inside[c]:
            q = inside[c]
            print(f"| {c} | {100 * statistics.median(q):.2f} % ({100 * min(q):.2f}-"
                  f"{100 * max(q):.2f} %) |")


if __name__ == "__main__":
    main()
