#!/usr/bin/python3
"""Memory and speed of the optimizer state sharded by vnode (resources.shard_optimizer).

Memory: AdamW (or --optimizer lamb, lars) on the largest zoo models that fit this machine, ResNet-50 (CIFAR stem,
synthetic 3x32x32 images, B 32 as 4 vnodes) and BERT-base (byte tokens, the fortunes
language-identification data, B 8 as 4 vnodes), deterministic, one intra-op thread per
worker, on K = 1, 2, 4 workers, unsharded and sharded with 2 replicas. Each worker's
peak resident memory (VmHWM, read from /proc every 0.1 s while it runs) and the optimizer
state it keeps (its "[shards]" log line) are recorded; the table gives the largest
worker's peak and its ratio to the unsharded run's at the same K, and the state a worker
keeps against state x replicas / K.

Speed: the default job (ConvNet on Fashion-MNIST, B 256 as 8 vnodes) with AdamW (or
--optimizer's) on K = 2
and 4 workers, unsharded and sharded, the two alternating within each repeat; median
examples/s over the timed steps and the ratio sharded / unsharded of each repeat (median,
min-max over repeats), the median of each run's mean update time (the optimizer step
and, sharded, the parameters' gather), and the bytes rank 0 read of its peers' data a step
in the sums and the gather through shared memory (the metrics' received_mb): the sharded
job's reduce-scatter and gather move what the unsharded job's one allreduce moves.

    bench/sharded_state.py [--build build] [--repeats 5] [--steps 100] [--memory-only]
                           [--speed-only] [--models resnet50,bert-base] [--workers 1,2,4]
                           [--optimizer adamw|lamb|lars] [--checkpoint]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vflow_runs  # noqa: E402

OPTIMIZERS = {  # --optimizer: the state sharded
    "adamw": "semantic.optimizer={name: adamw, lr: 0.001, weight_decay: 0.01}",
    "lamb": "semantic.optimizer={name: lamb, lr: 0.001, weight_decay: 0.01}",
    "lars": "semantic.optimizer={name: lars, lr: 0.1, trust_coefficient: 0.001}",
}
MODELS = {
    "resnet50": ["--set", "semantic.model={name: resnet, options: {depth: 50, stem: cifar}}",
                 "--set", "semantic.data={name: synthetic, options: {train_size: 256, "
                 "test_size: 32, shape: [3, 32, 32], classes: 10}}",
                 "--set", "semantic.global_batch=32", "--set", "semantic.virtual_nodes=4"],
    "bert-base": [os.path.join(ROOT, "examples/jobs/langid-bert.yaml"),
                  "--set", "semantic.model={name: bert, options: {preset: base}}",
                  "--set", "semantic.global_batch=8", "--set", "semantic.virtual_nodes=4"],
}


def children(pid):
    """The pids whose parent is `pid`: its workers, not the zygote they are forked from."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                name, rest = f.read().split("(", 1)[1].rsplit(")", 1)
            if int(rest.split()[1]) == pid and name != "vflow-zygote":
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    return out


def hwm_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def memory_run(build, model, workers, sharded, optimizer, steps=2, extra=()):
    """(each worker's peak MB, each worker's kept state MB from its log line; 10^6 bytes)."""
    cmd = [os.path.join(build, "vflow-train"), *MODELS[model], *extra, "--set", OPTIMIZERS[optimizer],
           "--set", "semantic.deterministic=true", "--set", "semantic.epochs=null",
           "--set", f"semantic.steps={steps}", "--set", "resources.threads=1",
           "--set", "output.evaluation.enabled=false", "--set", "output.logging.progress=off",
           "--set", f"resources.shard_optimizer={'true' if sharded else 'false'}",
           "--workers", str(workers)]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        peaks = {}
        while proc.poll() is None:
            for child in children(proc.pid):
                kib = hwm_kib(child)
                if kib is not None:
                    peaks[child] = max(peaks.get(child, 0), kib)
            time.sleep(0.1)
        log.seek(0)
        text = log.read()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{text[-3000:]}")
    state = [float(m) for m in re.findall(r"keeps the optimizer state of shards [^:]*: ([0-9.e+]+) MB",
                                          text)]
    return sorted(v * 1024 / 1e6 for v in peaks.values()), state, text  # MB, as the log's


def memory(args):
    print("| model | K | unsharded peak MB | sharded peak MB | ratio | state kept a worker MB "
          "| state x 2 / K MB |")
    print("|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        full_state = None
        for k in (int(c) for c in args.workers.split(",")):
            plain, _, _ = memory_run(args.build, model, k, False, args.optimizer)
            sharded, state, text = memory_run(args.build, model, k, True, args.optimizer)
            if full_state is None:
                # The state of every parameter, kept by min(2, K) of K.
                full_state = state[0] * k / min(2, k)
            expected = full_state * min(2, k) / k if full_state else float("nan")
            print(f"| {model} | {k} | {max(plain):.0f} ({', '.join(f'{v:.0f}' for v in plain)}) "
                  f"| {max(sharded):.0f} ({', '.join(f'{v:.0f}' for v in sharded)}) "
                  f"| {max(sharded) / max(plain):.3f} "
                  f"| {', '.join(f'{v:.0f}' for v in state)} | {expected:.0f} |", flush=True)


def checkpoint_memory(args):
    """Rank 0 writes every shard's file of a checkpoint, each sent to it in turn: its peak
    with a checkpoint at every step against none, sharded."""
    print("\n| model | K | sharded peak MB, no checkpoint | with a checkpoint every step | more "
          "| one shard's state MB |")
    print("|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for k in (int(c) for c in args.workers.split(",")):
            if k < 2:
                continue
            plain, state, _ = memory_run(args.build, model, k, True, args.optimizer)
            with tempfile.TemporaryDirectory() as ckpt:
                written, _, text = memory_run(
                    args.build, model, k, True, args.optimizer,
                    extra=["--set", f"output.checkpoint.dir={ckpt}",
                           "--set", "output.checkpoint.every_steps=1"])
                if "[checkpoint] wrote" not in text:
                    sys.exit("no checkpoint was written:\n" + text[-3000:])
            # 4 vnodes, so 4 shards; each worker keeps 2 of them (2 replicas).
            shard = state[0] / min(2, k) * k / 4 if k >= 2 else float("nan")
            print(f"| {model} | {k} | {max(plain):.0f} | {max(written):.0f} "
                  f"| {max(written) - max(plain):.0f} | {shard:.0f} |", flush=True)


def speed(args):
    print("\n| K | unsharded examples/s | sharded examples/s | ratio sharded / unsharded "
          "| update ms unsharded | update ms sharded | received MB/step unsharded "
          "| received MB/step sharded |")
    print("|---|---|---|---|---|---|---|---|")
    for k in (2, 4):
        runs = {False: [], True: []}
        update = {False: [], True: []}  # the update and, sharded, the parameters' gather
        received = {False: [], True: []}  # rank 0's bytes read of its peers' data a step
        ratio = []
        for r in range(args.repeats):
            order = [False, True] if r % 2 == 0 else [True, False]
            for sharded in order:
                steps = vflow_runs.timed_steps(
                    args.build, ["--workers", str(k), "--set", OPTIMIZERS[args.optimizer],
                                 "--set", f"resources.shard_optimizer={'true' if sharded else 'false'}"],
                    args.steps, 3, 1)
                summary = vflow_runs.summary(steps)
                runs[sharded].append(summary["examples_per_second"])
                update[sharded].append(summary["update_ms"])
                received[sharded].append(statistics.mean(r.get("received_mb", -1) for r in steps))
            ratio.append(runs[True][-1] / runs[False][-1])
        a, b = runs[False], runs[True]
        print(f"| {k} | {statistics.median(a):.0f} ({min(a):.0f}-{max(a):.0f}) "
              f"| {statistics.median(b):.0f} ({min(b):.0f}-{max(b):.0f}) "
              f"| {statistics.median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f}) "
              f"| {statistics.median(update[False]):.2f} | {statistics.median(update[True]):.2f} "
              f"| {statistics.median(received[False]):.3f} | {statistics.median(received[True]):.3f} |",
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--models", default="resnet50,bert-base")
    parser.add_argument("--workers", default="1,2,4", help="the worker counts of the memory runs")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adamw")
    parser.add_argument("--memory-only", action="store_true")
    parser.add_argument("--checkpoint", action="store_true",
                        help="with the memory runs: rank 0's peak writing a checkpoint of shards")
    parser.add_argument("--speed-only", action="store_true")
    args = parser.parse_args()
    if not args.speed_only:
        memory(args)
        if args.checkpoint:
            checkpoint_memory(args)
    if not args.memory_only:
        speed(args)


if __name__ == "__main__":
    main()
