#!/usr/bin/env python3
"""The planner's split of a job over two CPU workers of different speed, measured.

Two device types on this machine: `cpu-fast` (one intra-op thread, a whole core) and
`cpu-slow` (one thread limited to --quota cores by a cgroup CPU quota). The script
  1. profiles the default ConvNet job (vflow-profile) for both types at vnode sizes
     8 to 64,
  2. plans 1 x cpu-fast + 1 x cpu-slow (vflow-plan --relaxed): the exact-mode plan, its
     predicted step time, the predicted even split and fast-alone steps, and the
     relaxed-mode plan (a vnode size per type),
  3. trains the job for --steps steps with the planned layout, the relaxed plan, an even
     split of the vnodes, and on the fast worker alone (all vflow-train, Fashion-MNIST),
     takes each run's median step time over windows of 10 steps after the first,
  4. prints measured against predicted step times and the speedups.

Usage: bench/hetero_compare.py [--build build] [--steps 80] [--quota 0.5] [--repeats 5]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WINDOW = 10


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def profile(build, tmp, device_type, quota, sizes):
    out = os.path.join(tmp, device_type + ".yaml")
    cmd = [os.path.join(build, "vflow-profile"), "--device-type", device_type,
           "--set", "resources.threads=1", "--sizes", sizes, "--repeats", "15", "--out", out]
    if quota:
        cmd += ["--cpu-quota", str(quota)]
    run(cmd)
    return out


def plan(build, profiles):
    text = run([os.path.join(build, "vflow-plan"), "--profile", profiles[0], "--profile",
                profiles[1], "--devices", "cpu-fast:1", "--devices", "cpu-slow:1", "--relaxed"])
    print(text)
    exact, relaxed = text.split("relaxed mode:")
    vnodes = {}
    for line in exact.splitlines():
        m = re.match(r"(cpu-\w+): \d+ worker\(s\), vnodes ([\d ]+)", line)
        if m:
            vnodes[m.group(1)] = int(m.group(2).split()[0])
    shapes = {}  # relaxed: type -> (vnodes, size)
    for line in relaxed.splitlines():
        m = re.match(r"(cpu-\w+): \d+ worker\(s\), vnodes x examples (\d+)x(\d+)", line)
        if m:
            shapes[m.group(1)] = (int(m.group(2)), int(m.group(3)))

    def seconds(pattern):
        m = re.search(pattern + r": ([0-9.e+-]+) s", text)
        return float(m.group(1)) if m else float("nan")

    return {"vnodes": vnodes, "shapes": shapes,
            "planned": float(re.search(r"predicted step time ([0-9.e+-]+) s", exact).group(1)),
            "relaxed": float(re.search(r"predicted step time ([0-9.e+-]+) s", relaxed).group(1)),
            "even": seconds("even split over every device"),
            "alone": seconds(r"best single type alone \([\w-]+\)")}


def train(build, tmp, name, steps, layout, sizes=None):
    metrics = os.path.join(tmp, name + ".jsonl")
    cmd = [os.path.join(build, "vflow-train"),
           "--set", f"semantic.steps={steps}", "--set", "semantic.epochs=null",
           "--set", "resources.threads=1", "--set", "output.evaluation.enabled=false",
           "--set", "output.logging.progress=off",
           "--set", f"output.logging.every_steps={WINDOW}",
           "--set", f"output.logging.metrics={metrics}"]
    if layout:
        entries = ", ".join(
            "{vnodes: %d, threads: 1%s}" % (v, f", cpu_quota: {q}" if q else "")
            for v, q in layout)
        cmd += ["--set", f"resources.workers={len(layout)}",
                "--set", f"resources.layout=[{entries}]"]
    if sizes:
        cmd += ["--set", "semantic.virtual_nodes=null",
                "--set", "semantic.vnode_sizes=[%s]" % ", ".join(map(str, sizes))]
    run(cmd)
    rates = [json.loads(line)["examples_per_second"] for line in open(metrics)
             if '"event":"step"' in line]
    return 256 / statistics.median(rates[1:])  # the default job's global batch


def one_round(args, tmp):
    sizes = "8,16,24,32,48,64"
    profiles = [profile(args.build, tmp, "cpu-fast", 0, sizes),
                profile(args.build, tmp, "cpu-slow", args.quota, sizes)]
    predicted = plan(args.build, profiles)
    fast, slow = predicted["vnodes"].get("cpu-fast", 0), predicted["vnodes"].get("cpu-slow", 0)
    runs = {
        "planned": [(fast, 0), (slow, args.quota)] if slow else [(fast, 0)],
        "even": [(4, 0), (4, args.quota)],
        "alone": [],
    }
    measured = {name: train(args.build, tmp, name, args.steps, layout)
                for name, layout in runs.items()}
    shapes = predicted["shapes"]
    layout, vnode_sizes = [], []
    for device, quota in (("cpu-fast", 0), ("cpu-slow", args.quota)):
        if device in shapes:
            layout.append((shapes[device][0], quota))
            vnode_sizes += [shapes[device][1]] * shapes[device][0]
    measured["relaxed"] = train(args.build, tmp, "relaxed", args.steps, layout, vnode_sizes)
    shape = " / ".join(f"{k}x{b}" for k, b in shapes.values())
    return f"{fast} / {slow}", predicted, measured, shape


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--quota", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=5,
                   help="rounds of profile, plan and runs; the table shows medians")
    args = p.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            rounds.append(one_round(args, tmp))
    names = ["planned", "relaxed", "even", "alone"]
    labels = {"planned": "planned (exact mode)", "relaxed": "planned (relaxed mode)",
              "even": "even", "alone": "fast worker alone"}
    counts = {"planned": " or ".join(sorted({r[0] for r in rounds})),
              "relaxed": " or ".join(sorted({r[3] for r in rounds})), "even": "4 / 4",
              "alone": "8 / -"}
    med = lambda name, part: statistics.median(r[part][name] for r in rounds)
    print(f"\ndefault job (ConvNet, B = 256 as 8 vnodes of 32), cpu-fast = 1 thread, "
          f"cpu-slow = 1 thread at {args.quota} cores; {args.steps} steps per run; medians of "
          f"{args.repeats} rounds (each: profile, plan, four runs)\n")
    print("| split | vnodes fast / slow (relaxed: vnodes x size) | measured step | predicted step | "
          "error of the medians | error per round | measured examples/s |\n"
          "|---|---|---|---|---|---|---|")
    for name in names:
        m, q = med(name, 2), med(name, 1)
        errors = ", ".join(f"{100 * (r[2][name] - r[1][name]) / r[1][name]:+.1f}%" for r in rounds)
        print(f"| {labels[name]} | {counts[name]} | {m:.3f} s | {q:.3f} s | "
              f"{100 * (m - q) / q:+.1f}% | {errors} | {256 / m:.0f} |")
    print(f"\nplanned split (measured, medians): {med('even', 2) / med('planned', 2):.2f}x the "
          f"even split, {med('alone', 2) / med('planned', 2):.2f}x the fast worker alone; "
          f"relaxed mode {med('planned', 2) / med('relaxed', 2):.2f}x the exact plan")


if __name__ == "__main__":
    main()
