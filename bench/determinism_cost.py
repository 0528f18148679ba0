#!/usr/bin/python3
"""The cost of semantic.deterministic: true, model by model, on 1 and 2 workers.

Each model trains for a few steps with `vflow-train --workers K`, once in the
default mode and once deterministic, the mode that runs first alternating from
repeat to repeat so that the machine's drift affects both alike; the table gives
the median examples/s of each mode over the timed steps (the first WARMUP steps
of every run are left out) and their ratio, with the min-max over repeats, and a
second table each mode's step phases. One intra-op thread per worker (--threads).

Models (--models, default all), at the sizes of docs/workloads.md:

    convnet   the default job (ConvNet [32, 64] + batch norm, B 256 as 8 vnodes)
    mlp-wide  MLP 784-2048-2048-10 (5.8 M parameters), 32 examples per vnode, one
              vnode per worker
    resnet18  examples/jobs/resnet18-fashion.yaml (B 256 as 8 vnodes)
    bert      examples/jobs/langid-bert.yaml
    lm        examples/jobs/fortunes-lm.yaml (transformer-lm)

    bench/determinism_cost.py [--build build] [--models convnet,mlp-wide]
                              [--workers 1,2] [--steps 12] [--repeats 5] [--threads 1]
"""
import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vflow_runs  # noqa: E402
WARMUP = 3

MODELS = {
    "convnet": [],
    "mlp-wide": ["--set", "semantic.model={name: mlp, options: {hidden: [2048, 2048], dropout: 0}}",
                 "--set", "semantic.optimizer={name: sgd, lr: 0.01, momentum: 0.9}"],
    "resnet18": [os.path.join(ROOT, "examples/jobs/resnet18-fashion.yaml")],
    "bert": [os.path.join(ROOT, "examples/jobs/langid-bert.yaml")],
    "lm": [os.path.join(ROOT, "examples/jobs/fortunes-lm.yaml")],
}


def run(args, model, workers, deterministic):
    extra = list(MODELS[model])
    if model == "mlp-wide":  # one vnode of 32 examples per worker
        extra += ["--set", f"semantic.global_batch={32 * workers}",
                  "--set", f"semantic.virtual_nodes={workers}"]
    steps = vflow_runs.timed_steps(
        args.build, [*extra, "--workers", str(workers),
                     "--set", f"semantic.deterministic={'true' if deterministic else 'false'}"],
        args.steps, WARMUP, args.threads)
    return vflow_runs.summary(steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    args = parser.parse_args()
    models = args.models.split(",")
    for m in models:
        if m not in MODELS:
            parser.error(f"unknown model {m}; choices: {', '.join(MODELS)}")
    rows, phases = [], []
    for model in models:
        for workers in (int(w) for w in args.workers.split(",")):
            default, exact = [], []
            for r in range(args.repeats):
                # Which mode runs first alternates (ABBA), so that a drift of the machine's
                # speed within a repeat does not favour either.
                for deterministic in ((False, True) if r % 2 == 0 else (True, False)):
                    (exact if deterministic else default).append(
                        run(args, model, workers, deterministic))
                print(f"{model} K={workers} repeat {r + 1}: default "
                      f"{default[-1]['examples_per_second']:.0f}, deterministic "
                      f"{exact[-1]['examples_per_second']:.0f} examples/s", flush=True)
            d = [x["examples_per_second"] for x in default]
            e = [x["examples_per_second"] for x in exact]
            ratio = statistics.median(e) / statistics.median(d)
            # Each repeat's two runs follow each other: their ratio leaves out most of the
            # drift between repeats (not the spread between processes).
            paired = [x / y for x, y in zip(e, d)]
            rows.append(f"| {model} | {workers} | {statistics.median(d):.0f} ({min(d):.0f}-{max(d):.0f}) | "
                        f"{statistics.median(e):.0f} ({min(e):.0f}-{max(e):.0f}) | {ratio:.3f} | "
                        f"{statistics.median(paired):.3f} ({min(paired):.3f}-{max(paired):.3f}) |")
            # Where the time goes: a mode's own work shows in its phases even when the
            # machine's drift between runs hides it in examples/s.
            phase = lambda runs, key: statistics.median(x[key] for x in runs)
            phases.append(f"| {model} | {workers} | " + " | ".join(
                f"{phase(default, k):.2f} / {phase(exact, k):.2f}"
                for k in ("compute_ms", "sync_ms", "update_ms")) + " |")
    print()
    threads = (f"{args.threads} intra-op thread(s) per worker" if args.threads > 0 else
               "resources.threads 0 (each mode's own count)")
    print(f"{args.steps} timed steps after {WARMUP}, {threads}, "
          f"medians (min-max) of {args.repeats} alternating repeats")
    print("| model | workers | default examples/s | deterministic examples/s | ratio | "
          "paired ratio (min-max) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(row)
    print()
    print("mean step phases in ms (metrics records), median over the repeats, default / deterministic")
    print("| model | workers | compute | sync | update |")
    print("|---|---|---|---|---|")
    for row in phases:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
