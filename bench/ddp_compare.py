#!/usr/bin/python3
"""vflow on K workers against PyTorch DistributedDataParallel, side by side.

Same model (--model convnet: two 3x3 conv + batch norm blocks with 32/64 channels,
128 hidden, dropout 0.25; --model mlp-wide: the MLP 784-2048-2048-10, 5.8 M
parameters, 23 MB of gradient; --model resnet18: CIFAR-style ResNet-18 of width 16,
on synthetic 3x32x32 images; --model bert-mini: vflow's bert preset mini, 4 layers of
width 256, 4 heads, over sentences of 64 byte tokens: fortunes-langid for vflow and the
plain loop, random tokens of the same shape for DDP), same data (Fashion-MNIST unless
said), same global batch (K
workers x V vnodes x b examples), same SGD. PyTorch DDP (Gloo, K processes) accumulates V
micro-batches per step with no_sync() and synchronises on the last one. The
compute-only limit is K plain LibTorch loops (bench/vnode_overhead --child
plain) running at once with no communication. One intra-op thread per process.

    bench/ddp_compare.py [--build build] [--model convnet|mlp-wide|resnet18|bert-mini] [--workers 2]
                         [--vnodes 4] [--micro-batch 32] [--steps 30] [--repeats 3]
                         [--deterministic] [--bucket-mb MB] [--sockets]

vflow's workers on one host sum through shared memory (resources.shared_memory, the
default); --sockets adds a vflow run over Gloo's loopback sockets, side by side.
"""
import argparse
import contextlib
import gzip
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vflow_runs  # noqa: E402
DATA = "/usr/share/datasets/fashion-mnist"
WARMUP = 3


# ---- PyTorch DDP ---------------------------------------------------------------

VFLOW_MODEL = {
    "convnet": "{name: convnet, options: {channels: [32, 64], hidden: 128, dropout: 0.25}}",
    "mlp-wide": "{name: mlp, options: {hidden: [2048, 2048], dropout: 0}}",
    "resnet18": "{name: resnet, options: {depth: 18, width: 16}}",
    "bert-mini": "{name: bert, options: {preset: mini}}",
}
# Data other than Fashion-MNIST, for vflow.
DATA_SPEC = {
    "bert-mini": "{name: fortunes-langid, options: {max_length: 64}}",
}
# ResNet-18 trains on synthetic 3x32x32 images on every side (as bench/vnode_overhead's
# plain loop does); the others on Fashion-MNIST.
SYNTHETIC = {"resnet18": "{name: synthetic, options: {train_size: 8192, test_size: 0, "
                         "shape: [3, 32, 32], classes: 10}}"}
DATA_SPEC.update(SYNTHETIC)


def ddp_worker(rank, world, port, model_name, vnodes, micro, steps, queue):
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if model_name in SYNTHETIC:
        x_all = torch.randn(8192, 3, 32, 32)
        y_all = torch.randint(0, 10, (8192,))
    elif model_name == "bert-mini":
        # Sentences of 64 byte tokens (vflow's fortunes-langid with max_length 64): a start
        # token, bytes, no padding. The work of a step does not depend on the token values.
        x_all = torch.randint(3, 259, (8192, 64))
        x_all[:, 0] = 1
        y_all = torch.randint(0, 4, (8192,))
    else:
        with gzip.open(os.path.join(DATA, "train-images-idx3-ubyte.gz")) as f:
            images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
        with gzip.open(os.path.join(DATA, "train-labels-idx1-ubyte.gz")) as f:
            labels = np.frombuffer(f.read(), np.uint8, offset=8)
        x_all = (torch.from_numpy(images.copy()).float() / 255 - 0.2860) / 0.3530
        y_all = torch.from_numpy(labels.copy()).long()

    import torch_models
    torch.manual_seed(1)
    model = torch_models.by_name(model_name)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    perm = torch.randperm(x_all.shape[0])
    cursor = rank * vnodes * micro

    def step():
        nonlocal cursor
        opt.zero_grad()
        for v in range(vnodes):
            idx = perm[cursor:cursor + micro]
            cursor = (cursor + world * micro) % (x_all.shape[0] - world * micro)
            # no_sync() must hold the forward pass too: DDP decides in forward() whether the
            # next backward pass synchronises.
            with ddp.no_sync() if v < vnodes - 1 else contextlib.nullcontext():
                loss = F.cross_entropy(ddp(x_all.index_select(0, idx)),
                                       y_all.index_select(0, idx)) / vnodes
                loss.backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    seconds = time.perf_counter() - t0
    if rank == 0:
        queue.put(world * vnodes * micro * steps / seconds)
    dist.destroy_process_group()


def run_ddp(args):
    import socket
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=ddp_worker, args=(r, args.workers, port, args.model, args.vnodes, args.micro_batch,
                                                  args.steps, queue)) for r in range(args.workers)]
    for p in procs:
        p.start()
    result = queue.get(timeout=600)
    for p in procs:
        p.join()
    return {"examples_per_second": result}


# ---- vflow -----------------------------------------------------------------------

def job_args(args):
    """vflow-train settings of the compared job: `args.workers` x `args.vnodes` vnodes of
    `args.micro_batch`, the model, SGD with momentum, and `args.bucket_mb` when set."""
    return [
        "--set", f"semantic.model={VFLOW_MODEL[args.model]}",
        *(["--set", f"semantic.data={DATA_SPEC[args.model]}"] if args.model in DATA_SPEC else []),
        "--set", f"semantic.deterministic={'true' if args.deterministic else 'false'}",
        "--set", f"semantic.global_batch={args.workers * args.vnodes * args.micro_batch}",
        "--set", f"semantic.virtual_nodes={args.workers * args.vnodes}",
        "--set", "semantic.optimizer={name: sgd, lr: 0.01, momentum: 0.9, nesterov: false, weight_decay: 0}",
        "--set", "semantic.schedule={name: constant}",
        *(["--set", f"resources.bucket_mb={args.bucket_mb}"] if args.bucket_mb is not None else [])]


def run_vflow(args, shared_memory=True):
    steps = vflow_runs.timed_steps(
        args.build, ["--workers", str(args.workers), *job_args(args),
                     "--set", f"resources.shared_memory={'true' if shared_memory else 'false'}"],
        args.steps, WARMUP)
    return vflow_runs.summary(steps)


def run_vflow_sockets(args):
    return run_vflow(args, shared_memory=False)


# ---- compute-only limit ------------------------------------------------------------

def run_limit(args):
    cmd = [os.path.join(args.build, "bench", "vnode_overhead"), "--child", "plain",
           "--vnodes", str(args.vnodes), "--micro-batch", str(args.micro_batch),
           "--examples", str(args.steps * args.vnodes * args.micro_batch), "--threads", "1",
           "--channels", "32,64", "--model", args.model]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(args.workers)]
    total = 0.0
    for p in procs:
        out, _ = p.communicate()
        total += float(re.search(r"RESULT ([0-9.]+)", out).group(1))
        if p.returncode != 0:
            raise RuntimeError("plain loop failed")
    return {"examples_per_second": total}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--model", choices=sorted(VFLOW_MODEL), default="convnet")
    parser.add_argument("--deterministic", action="store_true",
                        help="vflow with semantic.deterministic: true")
    parser.add_argument("--bucket-mb", type=float, default=None,
                        help="vflow's resources.bucket_mb (default: the job spec's default)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--vnodes", type=int, default=4, help="vnodes per worker")
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sockets", action="store_true",
                        help="also run vflow with resources.shared_memory=false: its sums over "
                             "Gloo's loopback sockets instead of shared memory")
    args = parser.parse_args()

    systems = [("vflow", run_vflow), ("ddp", run_ddp), ("limit", run_limit)]
    if args.sockets:
        systems.insert(1, ("vflow-sockets", run_vflow_sockets))
    runs = {name: [] for name, _ in systems}
    for r in range(args.repeats):
        for name, fn in systems:
            result = fn(args)
            runs[name].append(result)
            print(f"repeat {r + 1}: {name:13s} {result['examples_per_second']:.0f} examples/s", flush=True)

    def med(name, key="examples_per_second"):
        return statistics.median(x[key] for x in runs[name])

    v, d, l = med("vflow"), med("ddp"), med("limit")
    print()
    print(f"{args.model}{' (vflow deterministic)' if args.deterministic else ''}: "
          f"K={args.workers} workers x {args.vnodes} vnodes x b={args.micro_batch} "
          f"(global batch {args.workers * args.vnodes * args.micro_batch}), {args.steps} timed steps, "
          f"median of {args.repeats}")
    print("| system | examples/s | vs PyTorch DDP | vs compute-only limit |")
    print("|---|---|---|---|")
    print(f"| vflow | {v:.0f} | {v / d:.2f}x | {v / l:.2f} |")
    if args.sockets:
        k = med("vflow-sockets")
        print(f"| vflow, sums over sockets (shared_memory: false) | {k:.0f} | {k / d:.2f}x | {k / l:.2f} |")
    print(f"| PyTorch DDP (no_sync) | {d:.0f} | 1.00x | {d / l:.2f} |")
    print(f"| compute-only limit ({args.workers} plain loops) | {l:.0f} | {l / d:.2f}x | 1.00 |")
    print()
    for name in [n for n, _ in systems if n.startswith("vflow")]:
        print("%s step breakdown (ms, rank 0): compute %.1f, allreduce %.1f, update %.1f" % (
            name, med(name, "compute_ms"), med(name, "sync_ms"), med(name, "update_ms")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
