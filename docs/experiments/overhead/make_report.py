#!/usr/bin/python3
"""Overhead of virtual nodes: throughput and peak memory against the vnode count.

For ConvNet (Fashion-MNIST-sized synthetic images), a thin ResNet-18 (synthetic
3x32x32 images) and BERT-tiny (the fortunes-langid sentences), runs
build/bench/vnode_overhead, which trains each model with V vnodes of a fixed
micro-batch two ways, side by side in the same processes: vflow's step, and the
plain LibTorch gradient-accumulation loop a user would write. It writes
report.md (the tables, next to the VirtualFlow paper's figures) and
overhead.png next to this script.

    docs/experiments/overhead/make_report.py [--bench build/bench/vnode_overhead]
        [--vnodes 1,2,4,8,16,32] [--repeats 3] [--out DIR]
"""
import argparse
import datetime
import os
import re
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
# (bench --model, label, micro-batch, examples per measurement)
MODELS = [("convnet", "ConvNet", 32, 4096),
          ("resnet18", "ResNet-18 (width 16)", 32, 1024),
          ("bert-tiny", "BERT-tiny", 32, 1024)]
ROW = re.compile(r"^\| (\d+) \| (\d+) \| (\d+) \| (\d+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$")


def run(bench, model, micro_batch, examples, vnodes, repeats):
    cmd = [bench, "--model", model, "--micro-batch", str(micro_batch), "--examples",
           str(examples), "--vnodes", vnodes, "--repeats", str(repeats), "--threads", "1"]
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    print(out, flush=True)
    rows = [tuple(float(x) for x in m.groups()) for m in map(ROW.match, out.splitlines()) if m]
    return cmd, out, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "vnode_overhead"))
    parser.add_argument("--vnodes", default="1,2,4,8,16,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=HERE)
    parser.add_argument("--models", default=",".join(m[0] for m in MODELS))
    args = parser.parse_args()
    wanted = args.models.split(",")
    os.makedirs(args.out, exist_ok=True)

    results = []
    for model, label, micro_batch, examples in MODELS:
        if model in wanted:
            results.append((label, micro_batch) + run(args.bench, model, micro_batch, examples,
                                                      args.vnodes, args.repeats))

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, _, _, _, rows in results:
        v = [r[0] for r in rows]
        axes[0].plot(v, [r[4] for r in rows], "o-", label=label)
        axes[1].plot(v, [100 * (r[5] - rows[0][5]) / rows[0][5] for r in rows], "o-", label=label)
    axes[0].axhline(1.0, color="gray", linewidth=0.8)
    axes[0].set_ylabel("throughput, vflow / plain LibTorch loop")
    axes[1].set_ylabel("vflow peak RSS change from V = 1 (%)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("virtual nodes V (global batch = V x micro-batch)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle("Virtual-node overhead against a plain LibTorch gradient-accumulation loop")
    fig.tight_layout()
    png = os.path.join(args.out, "overhead.png")
    fig.savefig(png, dpi=110)

    lines = ["# Overhead of virtual nodes: throughput and memory against V", "",
             f"Generated {datetime.date.today()} by `docs/experiments/overhead/make_report.py "
             f"--vnodes {args.vnodes} --repeats {args.repeats}` on a 2-core machine "
             "(1 intra-op thread per process).", "",
             "Each model trains with V vnodes of a fixed micro-batch two ways, alternating "
             "blocks of steps in the same process: **vflow** (the engine's step: flat gradient "
             "buffer, per-vnode dropout seeds, stateful-kernel replay of batch norm) and "
             "**plain** (zero_grad, V x forward/backward of loss / V, step). Throughput rows "
             "are medians over the repeated processes; peak RSS comes from separate "
             "processes, one per loop (bench/vnode_overhead.cpp).", ""]
    summary = []
    for label, micro_batch, cmd, out, rows in results:
        lines += [f"## {label}, micro-batch {micro_batch}", "", f"`{' '.join(cmd[1:])}`", "",
                  "| V | B | vflow ex/s | plain ex/s | ratio | vflow peak RSS MiB | "
                  "plain peak RSS MiB |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r[0]:.0f} | {r[1]:.0f} | {r[2]:.0f} | {r[3]:.0f} | {r[4]:.3f} | "
                         f"{r[5]:.1f} | {r[6]:.1f} |")
        growth = 100 * (rows[-1][5] - rows[0][5]) / rows[0][5]
        summary.append(f"| {label} | {rows[0][4]:.3f} | {min(r[4] for r in rows):.3f} | "
                       f"{growth:+.2f}% |")
        lines.append("")
    lines += ["## Summary, next to the VirtualFlow paper", "",
              "| model | throughput ratio at V = 1 | lowest ratio over V | vflow peak RSS, "
              f"V = {args.vnodes.split(',')[0]} to {args.vnodes.split(',')[-1]} |",
              "|---|---|---|---|", *summary, "",
              "VirtualFlow's microbenchmark logs (Or et al., on TensorFlow) show peak memory "
              "with virtual nodes against without of +1% (ResNet), +11.9% (Transformer) and "
              "+17.5% (BERT-LARGE), and a throughput with one virtual node of 0.87-0.95 of "
              "stock TensorFlow (ResNet). Here the baseline is the equivalent hand-written "
              "LibTorch loop, measured in the same processes; run-to-run noise on this machine "
              "is about +-2%.", "",
              "![overhead](overhead.png)", ""]
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {os.path.join(args.out, 'report.md')} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
