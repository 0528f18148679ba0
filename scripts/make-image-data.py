#!/usr/bin/python3
"""Image data sets for vflow's image-folder and image-shards, made from Debian's files.

  scripts/make-image-data.py fashion OUT [--limit N] [--shard-size N]
      Fashion-MNIST (dataset-fashion-mnist) as OUT/png/{train,test}/<class>/<n>.png,
      OUT/jpeg/{train,test}/<class>/<n>.jpg (quality 90) and WebDataset tar shards
      OUT/shards/{train,test}-NNNNNN.tar (<n>.jpg beside <n>.cls). Class folders are
      named 0-tshirt ... 9-boot, so that sorting them by name keeps Fashion-MNIST's labels.
      --limit: the first N images of each split (tests).

  scripts/make-image-data.py photos OUT --count N [--classes K] [--seed S]
      N JPEGs of ImageNet's typical size and quality (about 500 x 375, quality 75 to 90)
      in OUT/<class>/, for the loader benchmarks: each is a random landscape of smooth
      regions, edges and fine texture with a natural image's 1/f spectrum, and a
      Fashion-MNIST item drawn large on it, so that they compress as photographs do rather
      than as flat colour or white noise.

Deterministic: the same arguments make the same files.
"""
import argparse
import gzip
import io
import os
import sys
import tarfile

import numpy as np
from PIL import Image

FASHION = "/usr/share/datasets/fashion-mnist"
CLASSES = ["0-tshirt", "1-trouser", "2-pullover", "3-dress", "4-coat", "5-sandal", "6-shirt",
           "7-sneaker", "8-bag", "9-boot"]


def read_idx(name):
    with gzip.open(os.path.join(FASHION, name), "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def encoded(image, fmt, quality=90):
    out = io.BytesIO()
    if fmt == "JPEG":
        image.save(out, fmt, quality=quality)
    else:
        image.save(out, fmt, optimize=False)
    return out.getvalue()


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def add_member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def fashion(args):
    splits = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
              "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
    for split, (images_file, labels_file) in splits.items():
        images = read_idx(images_file)
        labels = read_idx(labels_file)
        n = len(images) if args.limit is None else min(args.limit, len(images))
        tar = None
        for i in range(n):
            image = Image.fromarray(images[i], "L")
            label = int(labels[i])
            jpeg = encoded(image, "JPEG")
            write(f"{args.out}/png/{split}/{CLASSES[label]}/{i:05d}.png", encoded(image, "PNG"))
            write(f"{args.out}/jpeg/{split}/{CLASSES[label]}/{i:05d}.jpg", jpeg)
            if i % args.shard_size == 0:
                if tar:
                    tar.close()
                os.makedirs(f"{args.out}/shards", exist_ok=True)
                tar = tarfile.open(f"{args.out}/shards/{split}-{i // args.shard_size:06d}.tar",
                                   "w", format=tarfile.USTAR_FORMAT)
            add_member(tar, f"{i:05d}.jpg", jpeg)
            add_member(tar, f"{i:05d}.cls", str(label).encode())
            if (i + 1) % 10000 == 0:
                print(f"{split}: {i + 1} of {n} images", file=sys.stderr)
        if tar:
            tar.close()
        print(f"{split}: {n} images in {args.out}/{{png,jpeg}}/{split} and "
              f"{args.out}/shards/{split}-*.tar", file=sys.stderr)


def landscape(rng, height, width):
    """A colour image with a natural image's 1/f amplitude spectrum and a few hard edges."""
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    radius = np.sqrt(fx * fx + fy * fy)
    radius[0, 0] = 1.0
    amplitude = radius ** -0.9
    amplitude[0, 0] = 0.0
    channels = []
    base_phase = rng.uniform(0, 2 * np.pi, amplitude.shape)
    for c in range(3):  # correlated colour channels: mostly one phase field
        phase = base_phase + rng.normal(0, 0.6, amplitude.shape)
        field = np.fft.irfft2(amplitude * np.exp(1j * phase), s=(height, width))
        field = (field - field.mean()) / (field.std() + 1e-9)
        channels.append(field)
    img = np.stack(channels, axis=-1) * 40 + rng.uniform(60, 190, 3)
    # hard edges: a horizon and a few flat-ish blocks, as objects in a scene
    horizon = int(rng.uniform(0.3, 0.7) * height)
    img[horizon:] = img[horizon:] * rng.uniform(0.5, 0.9) + rng.uniform(-30, 30, 3)
    for _ in range(rng.integers(2, 6)):
        y0, x0 = rng.integers(0, height - 40), rng.integers(0, width - 40)
        h, w = rng.integers(20, height // 2), rng.integers(20, width // 2)
        img[y0:y0 + h, x0:x0 + w] = img[y0:y0 + h, x0:x0 + w] * 0.5 + rng.uniform(0, 255, 3) * 0.5
    return img


def photos(args):
    rng = np.random.default_rng(args.seed)
    items = read_idx("train-images-idx3-ubyte.gz")
    labels = read_idx("train-labels-idx1-ubyte.gz")
    total = 0
    for i in range(args.count):
        width = int(rng.choice([500, 500, 500, 375, 333, 640]))
        height = 375 if width == 500 else int(rng.choice([500, 375, 480]))
        img = landscape(rng, height, width)
        # a Fashion-MNIST item drawn large in the middle, in a colour
        k = int(rng.integers(0, len(items)))
        side = int(min(height, width) * rng.uniform(0.4, 0.8))
        item = np.asarray(Image.fromarray(items[k]).resize((side, side), Image.BILINEAR),
                          np.float64)[..., None] / 255.0
        y0, x0 = (height - side) // 2, (width - side) // 2
        colour = rng.uniform(0, 255, 3)
        patch = img[y0:y0 + side, x0:x0 + side]
        img[y0:y0 + side, x0:x0 + side] = patch * (1 - item) + colour * item
        img += rng.normal(0, 3, img.shape)  # sensor noise
        image = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")
        label = int(labels[k]) % args.classes
        data = encoded(image, "JPEG", quality=int(rng.integers(75, 91)))
        total += len(data)
        write(f"{args.out}/{label:03d}/{i:06d}.jpg", data)
        if (i + 1) % 200 == 0:
            print(f"photos: {i + 1} of {args.count}", file=sys.stderr)
    print(f"photos: {args.count} JPEGs in {args.out}, {total / max(args.count, 1) / 1024:.1f} KiB "
          f"each on average", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    f = sub.add_parser("fashion")
    f.add_argument("out")
    f.add_argument("--limit", type=int)
    f.add_argument("--shard-size", type=int, default=10000)
    p = sub.add_parser("photos")
    p.add_argument("out")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not os.path.isdir(FASHION):
        sys.exit(f"{FASHION}: not found (Debian's dataset-fashion-mnist)")
    fashion(args) if args.what == "fashion" else photos(args)


if __name__ == "__main__":
    main()
