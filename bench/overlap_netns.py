#!/usr/bin/python3
"""The reduction overlapped with the backward pass, where the wire is the bottleneck: two
worker hosts and a coordinator in network namespaces this script makes, joined by a
bridge, each worker's link shaped to RATE (tc tbf, both directions), so that an allreduce
waits on the link instead of on this machine's cores. Each repeat runs vflow once per
resources.bucket_mb (0 = one allreduce after the backward pass), then the compute-only
limit (two plain LibTorch loops, no communication, bench/vnode_overhead --child plain).
Needs root and iproute2; traffic stays inside the namespaces.

    bench/overlap_netns.py [--build build] [--model convnet|mlp-wide|resnet18]
                           [--vnodes 1] [--rate 1gbit] [--sizes 0,1] [--repeats 5]
                           [--deterministic]
"""
import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bucket_sweep  # noqa: E402
import ddp_compare  # noqa: E402
import vflow_runs  # noqa: E402

NET = "10.231.78"
WARMUP = 3


def sh(*cmd):
    subprocess.run(cmd, check=True)


class Hosts:
    """Namespaces c (coordinator, bridge) and w0, w1 (workers), removed on exit."""

    def __init__(self, rate):
        self.prefix = f"vfo{os.getpid()}"
        self.names = [f"{self.prefix}-{n}" for n in ("c", "w0", "w1")]
        c = self.names[0]
        for n in self.names:
            sh("ip", "netns", "add", n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
        sh("ip", "-n", c, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", c, "link", "set", "br0", "up")
        sh("ip", "-n", c, "addr", "add", f"{NET}.1/24", "dev", "br0")
        for i, w in enumerate(self.names[1:]):
            side = f"{self.prefix[-6:]}w{i}"
            sh("ip", "link", "add", side, "netns", c, "type", "veth", "peer", "name", "eth0",
               "netns", w)
            sh("ip", "-n", c, "link", "set", side, "master", "br0", "up")
            sh("ip", "-n", w, "addr", "add", f"{NET}.{10 + i}/24", "dev", "eth0")
            sh("ip", "-n", w, "link", "set", "eth0", "up")
            # The host's link, both directions: its own egress and the bridge port's.
            for ns, dev in ((w, "eth0"), (c, side)):
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                   "rate", rate, "burst", "256kb", "latency", "100ms")

    def close(self):
        for n in self.names:
            subprocess.run(["ip", "netns", "del", n], stderr=subprocess.DEVNULL)


def run_vflow(args, hosts, bucket_mb):
    train = os.path.join(args.build, "vflow-train")
    port = 29000 + random.randrange(900)
    args.bucket_mb = bucket_mb
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        # The store listens on the namespaces' private bridge, which nothing else reaches.
        spec = (ddp_compare.job_args(args) + vflow_runs.timing_args(args.steps, WARMUP, metrics)
                + ["--set", "resources.unauthenticated_store=true"])
        coordinator = subprocess.Popen(
            ["ip", "netns", "exec", hosts.names[0], train, *spec, "--workers", "2",
             "--coordinator", f"{NET}.1:{port}"], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        workers = []
        for r in (0, 1):
            env = dict(os.environ, VFLOW_RANK=str(r), VFLOW_WORLD_SIZE="2",
                       VFLOW_STORE=f"{NET}.1:{port}")
            workers.append(subprocess.Popen(
                ["ip", "netns", "exec", hosts.names[1 + r], train, *spec], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [w.communicate()[0] for w in workers]
        coordinator.terminate()
        coordinator.wait()
        if any(w.returncode != 0 for w in workers):
            raise RuntimeError("a worker failed:\n" + "\n".join(o[-2000:] for o in outputs))
        steps = vflow_runs.step_records(metrics, WARMUP)
    return vflow_runs.summary(steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ddp_compare.ROOT, "build"))
    parser.add_argument("--model", choices=sorted(ddp_compare.VFLOW_MODEL), default="convnet")
    parser.add_argument("--vnodes", type=int, default=1, help="vnodes per worker")
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rate", default="1gbit", help="each worker host's link (tc rate)")
    parser.add_argument("--sizes", default="0,1", help="bucket sizes in MiB; 0 = one allreduce")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--deterministic", action="store_true",
                        help="vflow with semantic.deterministic: true")
    args = parser.parse_args()
    args.workers = 2
    sizes = [float(x) for x in args.sizes.split(",")]
    hosts = Hosts(args.rate)
    runs = {size: [] for size in sizes}
    limits = []
    try:
        for r in range(args.repeats):
            for size in sizes:
                result = run_vflow(args, hosts, size)
                runs[size].append(result)
                print(f"repeat {r + 1}: bucket_mb {size:g}: {result['examples_per_second']:.0f} "
                      f"examples/s, sync {result['sync_ms']:.1f} ms", flush=True)
            limits.append(ddp_compare.run_limit(args)["examples_per_second"])
            print(f"repeat {r + 1}: limit {limits[-1]:.0f} examples/s", flush=True)
    finally:
        hosts.close()
    limit = statistics.median(limits)
    print()
    mode = " (deterministic)" if args.deterministic else ""
    print(f"{args.model}{mode}: 2 worker hosts on {args.rate} links x {args.vnodes} vnodes x "
          f"b={args.micro_batch}, {args.steps} timed steps, median (min-max) of {args.repeats}")
    bucket_sweep.print_table(runs, sizes, limit)
    print(f"| compute-only limit | {limit:.0f} ({min(limits):.0f}-{max(limits):.0f}) | | 1.00 | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
