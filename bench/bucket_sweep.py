#!/usr/bin/python3
"""vflow's examples/s against resources.bucket_mb (the reduction overlapped with the
backward pass), side by side in one run: each repeat runs every bucket size once, in
turn, on the bench/ddp_compare.py setup (K workers, one intra-op thread each).

    bench/bucket_sweep.py [--build build] [--model convnet|mlp-wide|resnet18]
                          [--workers 2] [--vnodes 1] [--sizes 0,1,4,25] [--repeats 5]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_compare  # noqa: E402


def print_table(runs, sizes, limit=None):
    """One row per bucket size: examples/s median (min-max), the ratio to the first size,
    to `limit` (examples/s) when given, and the median wait after the backward pass."""
    base = statistics.median(x["examples_per_second"] for x in runs[sizes[0]])
    print(f"| bucket_mb | examples/s | vs bucket_mb {sizes[0]:g} |"
          + (" vs compute-only limit |" if limit else "") + " sync after backward (ms) |")
    print("|---" * (5 if limit else 4) + "|")
    for size in sizes:
        eps = [x["examples_per_second"] for x in runs[size]]
        med = statistics.median(eps)
        print(f"| {size:g} | {med:.0f} ({min(eps):.0f}-{max(eps):.0f}) | {med / base:.3f} |"
              + (f" {med / limit:.2f} |" if limit else "")
              + f" {statistics.median(x['sync_ms'] for x in runs[size]):.1f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ddp_compare.ROOT, "build"))
    parser.add_argument("--model", choices=sorted(ddp_compare.VFLOW_MODEL), default="convnet")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--vnodes", type=int, default=1, help="vnodes per worker")
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sizes", default="0,1,4,25", help="bucket sizes in MiB; 0 = one allreduce")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    args.deterministic = False
    sizes = [float(x) for x in args.sizes.split(",")]
    runs = {size: [] for size in sizes}
    for r in range(args.repeats):
        for size in sizes:
            args.bucket_mb = size
            result = ddp_compare.run_vflow(args)
            runs[size].append(result)
            print(f"repeat {r + 1}: bucket_mb {size:g}: {result['examples_per_second']:.0f} "
                  f"examples/s, sync {result['sync_ms']:.1f} ms", flush=True)
    print()
    print(f"{args.model}: K={args.workers} workers x {args.vnodes} vnodes x b={args.micro_batch}, "
          f"{args.steps} timed steps, median (min-max) of {args.repeats}")
    print_table(runs, sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
