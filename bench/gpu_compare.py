#!/usr/bin/env python3
"""vflow's virtual-node step on one GPU against PyTorch's own training loop.

Same model (CIFAR-style ResNet-18: 3x3 stem, basic blocks [2, 2, 2, 2], first-stage
width --width, batch norm, no biases in convolutions), same synthetic 3x32x32 data
held on the CPU and copied per micro-batch from pinned memory, same micro-batch b,
the same V micro-batches accumulated per step, SGD with momentum 0.9, eager mode.

For each V the script runs, one after the other in this one run:
  * PyTorch: the loop a PyTorch user writes (zero_grad; V x (forward, loss / V,
    backward); step), timed after warm-up with torch.cuda.synchronize();
  * vflow and a plain LibTorch loop: bench/vnode_overhead --device cuda (the engine's
    own step, and the same accumulation hand-written in LibTorch, alternating blocks
    in one process).
Memory: device memory the process holds at the end (total minus free, CUDA context
and caching allocator included), for all three measured alike.
With --deterministic, also vflow's step in deterministic mode (semantic.deterministic:
its exact sum, cuDNN's deterministic kernels) against its default mode, alternating
blocks in one process (bench/vnode_overhead --against deterministic), before PyTorch.

    bench/gpu_compare.py [--build build] [--vnodes 1,2,4,8,16] [--micro-batch 64]
                         [--width 64] [--examples 8192] [--repeats 3] [--deterministic]

Prints a Markdown table and the lowest vflow / PyTorch throughput ratio.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import resnet18  # noqa: E402  (the PyTorch twin of vflow's resnet)
WARMUP = 3


def device_memory_mib(torch):
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


def pytorch_run(vnodes, micro, width, examples):
    """One measurement in a fresh process: examples/s and device memory (MiB)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(1)
    # Full float32, as vflow runs it: no TF32 in cuDNN convolutions or cuBLAS products.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda:0")
    x_all = torch.randn(8192, 3, 32, 32)
    y_all = torch.randint(0, 10, (8192,))
    model = resnet18(width).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    perm = torch.randperm(x_all.shape[0])
    cursor = 0

    def step():
        nonlocal cursor
        opt.zero_grad(set_to_none=False)
        for _ in range(vnodes):
            if cursor + micro > x_all.shape[0]:
                cursor = 0
            idx = perm[cursor:cursor + micro]
            cursor += micro
            x = x_all[idx].pin_memory().to(device, non_blocking=True)
            y = y_all[idx].pin_memory().to(device, non_blocking=True)
            (F.cross_entropy(model(x), y) / vnodes).backward()
        opt.step()

    steps = max(1, examples // (vnodes * micro))
    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    print(f"RESULT {steps * vnodes * micro / seconds:.3f} {device_memory_mib(torch):.1f}")


def run(cmd):
    """Runs a measurement; on failure its whole output goes to stderr, not just a code."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(f"gpu_compare: {' '.join(cmd)} failed with exit code "
                         f"{done.returncode}\n--- its stdout ---\n{done.stdout}"
                         f"--- its stderr ---\n{done.stderr}\n")
        sys.exit(1)
    return done.stdout


def measure_pytorch(args, vnodes):
    out = run([sys.executable, os.path.abspath(__file__), "--child", str(vnodes),
               "--micro-batch", str(args.micro_batch), "--width", str(args.width),
               "--examples", str(args.examples)])
    m = re.search(r"RESULT ([0-9.]+) ([0-9.]+)", out)
    if not m:
        sys.exit(f"gpu_compare: no RESULT line from the PyTorch measurement:\n{out}")
    return float(m.group(1)), float(m.group(2))


def measure_vflow(args, against="plain"):
    """Runs bench/vnode_overhead on the GPU; returns {V: (vflow, second, vflow MiB)}, the
    second loop a plain LibTorch one or vflow's deterministic mode."""
    exe = os.path.join(args.build, "bench", "vnode_overhead")
    cmd = [exe, "--device", "cuda:0", "--model", "resnet18", "--width", str(args.width),
           "--vnodes", args.vnodes, "--micro-batch", str(args.micro_batch),
           "--examples", str(args.examples), "--repeats", str(args.repeats),
           "--against", against]
    print("$ " + " ".join(cmd), flush=True)
    out = run(cmd)
    print(out, flush=True)  # vflow's own figures, even if PyTorch's part runs out of time
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0].isdigit():
            rows[int(cells[0])] = (float(cells[2]), float(cells[3]), float(cells[5]))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--vnodes", default="1,2,4,8,16")
    p.add_argument("--micro-batch", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--examples", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--deterministic", action="store_true",
                   help="also deterministic mode against the default, before PyTorch")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        pytorch_run(args.child, args.micro_batch, args.width, args.examples)
        return

    import torch
    if not torch.cuda.is_available():
        sys.exit("gpu_compare: PyTorch sees no CUDA device")
    print(f"ResNet-18 width {args.width}, micro-batch {args.micro_batch}, {args.examples} "
          f"examples per measurement, {torch.cuda.get_device_name(0)}, PyTorch "
          f"{torch.__version__}\n", flush=True)
    vflow = measure_vflow(args)
    if args.deterministic:
        measure_vflow(args, against="deterministic")  # its table is printed as it comes
    print("\n| V | vflow ex/s | LibTorch loop ex/s | PyTorch ex/s | vflow / PyTorch | "
          "vflow MiB | PyTorch MiB |\n|---|---|---|---|---|---|---|")
    worst = None
    for v in [int(x) for x in args.vnodes.split(",")]:
        runs = [measure_pytorch(args, v) for _ in range(args.repeats)]
        py = statistics.median(r[0] for r in runs)
        py_mem = statistics.median(r[1] for r in runs)
        if v not in vflow:
            sys.exit(f"gpu_compare: vnode_overhead printed no row for V={v}")
        ev, ep, ev_mem = vflow[v]
        ratio = ev / py
        worst = ratio if worst is None else min(worst, ratio)
        print(f"| {v} | {ev:.0f} | {ep:.0f} | {py:.0f} | {ratio:.3f} | {ev_mem:.0f} | "
              f"{py_mem:.0f} |", flush=True)
    print(f"\nlowest vflow / PyTorch throughput ratio: {worst:.3f} (target 0.98)")


if __name__ == "__main__":
    main()
