#!/usr/bin/python3
"""vflow's image loader against PyTorch's DataLoader, and against the decode limit.

Both read the same JPEG folder in a shuffled order, in batches of 64, with the same
transforms (ImageNet's training: random resized crop, horizontal flip, to float,
normalize; or --transforms eval: resize to 8/7, centre crop) and the same number of
threads or processes: vflow's image-folder on --threads data threads (the asking thread
one of them), torchvision's ImageFolder under a DataLoader with --threads worker
processes. The decode limit is libjpeg-turbo decoding the same files whole on one
thread (bench/image_loader.cpp --mode decode), times --threads. Two folders, made by
scripts/make-image-data.py when missing: photographs' sizes and quality (about 500 x 375,
JPEG quality 75-90), which measure decoding, and Fashion-MNIST's 28 x 28 images, which
measure the per-image overhead.

    bench/image_loader.py [--build build] [--dir data/bench-images] [--threads 2]
                          [--images 1024] [--repeats 5] [--photos 2000]

--memory measures the loader's peak resident memory on Fashion-MNIST folders of 6,000 and
60,000 files. --training also times ResNet-18 (width 16) on 2 workers from the Fashion-MNIST JPEG folder
against the same job on Fashion-MNIST's idx files held in memory.

A run prints images/s, medians of --repeats alternating runs with min-max, and ratios.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEAN3, STD3 = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def torch_loader(args):
    """The peer: torchvision's ImageFolder and transforms under a DataLoader."""
    import torch
    import torchvision.datasets as datasets
    import torchvision.transforms as T
    torch.set_num_threads(1)
    gray = args.channels == 1
    steps = [T.Grayscale()] if gray else []
    if args.transforms == "rrc":
        steps += [T.RandomResizedCrop(args.size), T.RandomHorizontalFlip()]
    else:
        steps += [T.Resize(args.size * 8 // 7), T.CenterCrop(args.size)]
    steps += [T.ToTensor(), T.Normalize([0.5] if gray else MEAN3, [0.25] if gray else STD3)]
    data = datasets.ImageFolder(args.root, transform=T.Compose(steps))
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True,
                                         num_workers=args.threads)
    it = iter(loader)
    next(it)  # the workers started and the first batch made: not timed, as for vflow
    start, done = time.perf_counter(), 0
    while done < args.images:
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        done += batch[0].shape[0]
    print(f"{done / (time.perf_counter() - start):.1f}")


def run(cmd, field=0):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1].split()[field])


def summary(values):
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def loaders(args, name, root, channels, size):
    bench = os.path.join(args.build, "bench", "image_loader_bench")
    common = ["--root", root, "--threads", str(args.threads), "--channels", str(channels),
              "--size", str(size), "--images", str(args.images), "--transforms", args.transforms]
    vflow, torch_, decode = [], [], []
    for r in range(args.repeats):
        order = ["vflow", "torch"] if r % 2 == 0 else ["torch", "vflow"]
        for who in order:
            if who == "vflow":
                vflow.append(run([bench, "--mode", "loader"] + common))
            else:
                torch_.append(run([sys.executable, __file__, "--peer"] + common))
        decode.append(args.threads * run([bench, "--mode", "decode"] + common))
        print(f"  {name} repeat {r + 1}: vflow {vflow[-1]:.0f}, DataLoader {torch_[-1]:.0f}, "
              f"decode limit {decode[-1]:.0f} images/s", file=sys.stderr)
    ratios = [v / t for v, t in zip(vflow, torch_)]
    limit = [v / d for v, d in zip(vflow, decode)]
    print(f"| {name} | {summary(vflow)} | {summary(torch_)} | "
          f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
          f"{summary(decode)} | {statistics.median(limit):.2f} ({min(limit):.2f}-{max(limit):.2f}) |")


def memory(args, small, large):
    """The loader's peak resident memory reading the same number of images from a folder and
    from one with ten times the files."""
    bench = os.path.join(args.build, "bench", "image_loader_bench")
    common = ["--mode", "loader", "--threads", str(args.threads), "--channels", "1", "--size",
              "28", "--images", "20480"]
    peaks = {"1x": [], "10x": []}
    for r in range(args.repeats):
        for which in (["1x", "10x"] if r % 2 == 0 else ["10x", "1x"]):
            root = small if which == "1x" else large
            peaks[which].append(run([bench, "--root", root] + common, field=1) / 1024)
    print("\n| folder | files | peak resident MiB |\n|---|---|---|")
    for which, root in (("1x", small), ("10x", large)):
        files = sum(len(f) for _, _, f in os.walk(root))
        v = peaks[which]
        print(f"| {which} | {files:,} | {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f}) |")


def training(args, fashion_root):
    """ResNet-18 on 2 workers: from the JPEG folder, and from the idx files in memory."""
    train = os.path.join(args.build, "vflow-train")
    job = os.path.join(ROOT, "examples", "jobs", "resnet18-fashion.yaml")
    folder = ("{name: image-folder, options: {train: " + fashion_root + ", channels: 1, "
              "index_cache: off, transforms: [{center_crop: 28}, "
              "{normalize: {mean: [0.286], std: [0.353]}}]}}")
    rates = {"jpeg": [], "memory": []}
    for r in range(args.repeats):
        for who in (["jpeg", "memory"] if r % 2 == 0 else ["memory", "jpeg"]):
            with tempfile.TemporaryDirectory() as tmp:
                metrics = os.path.join(tmp, "m.jsonl")
                cmd = [train, job, "--workers", "2", "--set", "resources.threads=1",
                       "--set", f"semantic.steps={args.training_steps}", "--set", "semantic.epochs=null",
                       "--set", "output.evaluation.enabled=false",
                       "--set", f"output.logging.every_steps={args.training_steps // 2}",
                       "--set", f"output.logging.metrics={metrics}"]
                if who == "jpeg":
                    cmd += ["--set", f"semantic.data={folder}"]
                subprocess.run(cmd, check=True, capture_output=True)
                steps = [json.loads(l) for l in open(metrics) if '"event":"step"' in l]
                rates[who].append(steps[-1]["examples_per_second"])  # the second half's rate
            print(f"  training repeat {r + 1} {who}: {rates[who][-1]:.0f} examples/s",
                  file=sys.stderr)
    ratio = [j / m for j, m in zip(rates["jpeg"], rates["memory"])]
    print("\n| ResNet-18 (width 16), 2 workers | examples/s |\n|---|---|")
    print(f"| Fashion-MNIST JPEG folder | {summary(rates['jpeg'])} |")
    print(f"| Fashion-MNIST idx, in memory | {summary(rates['memory'])} |")
    print(f"| JPEG / in memory | {statistics.median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f}) |")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--dir", default=os.path.join(ROOT, "data", "bench-images"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--photos", type=int, default=2000)
    p.add_argument("--skip-loaders", action="store_true", help="only --memory / --training")
    p.add_argument("--transforms", default="rrc", choices=["rrc", "eval"])
    p.add_argument("--training", action="store_true")
    p.add_argument("--memory", action="store_true")
    p.add_argument("--training-steps", type=int, default=60)
    # the peer's own arguments (internal)
    p.add_argument("--peer", action="store_true")
    p.add_argument("--root")
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--mode")
    args = p.parse_args()
    if args.peer:
        return torch_loader(args)
    maker = os.path.join(ROOT, "scripts", "make-image-data.py")
    photos = os.path.join(args.dir, "photos")
    fashion = os.path.join(args.dir, "fashion")
    if not os.path.isdir(photos):
        subprocess.run([sys.executable, maker, "photos", photos, "--count", str(args.photos)],
                       check=True)
    if not os.path.isdir(fashion):
        subprocess.run([sys.executable, maker, "fashion", fashion, "--limit", "10000"], check=True)
    if not args.skip_loaders:
        try:
            import torchvision  # noqa: F401
        except ImportError:
            sys.exit("the DataLoader peer needs torchvision: scripts/dev.sh deps python3-torchvision")
        print(f"{args.threads} threads (vflow) or worker processes (DataLoader), batches of 64, "
              f"{args.images} images a run, transforms {args.transforms}, {args.repeats} repeats\n")
        print("| images | vflow images/s | DataLoader images/s | vflow / DataLoader | "
              "decode limit images/s | vflow / limit |\n|---|---|---|---|---|---|")
        loaders(args, "photographs (about 500 x 375) to 224", photos, 3, 224)
        loaders(args, "Fashion-MNIST 28 x 28 to 28", os.path.join(fashion, "jpeg", "train"), 1, 28)
    if args.memory:
        # Fashion-MNIST's whole training set, 60,000 files, against the 6,000 that
        # scripts/make-image-data.py --limit makes.
        full = os.path.join(args.dir, "fashion-full")
        small = os.path.join(args.dir, "fashion-6k")
        if not os.path.isdir(full):
            subprocess.run([sys.executable, maker, "fashion", full], check=True)
        if not os.path.isdir(small):
            subprocess.run([sys.executable, maker, "fashion", small, "--limit", "6000"], check=True)
        memory(args, os.path.join(small, "jpeg", "train"), os.path.join(full, "jpeg", "train"))
    if args.training:
        training(args, os.path.join(fashion, "jpeg", "train"))


if __name__ == "__main__":
    main()
