#!/usr/bin/python3
"""Export example PyTorch models as TorchScript files that vflow can train.

    scripts/export_torchscript.py --model convnet --out convnet.pt

A job trains the exported file with `model: {torchscript: convnet.pt}`. The
models here are ordinary torch.nn modules; any module whose forward maps a
batch of inputs to logits ([n, classes], or [n, T, classes] for sequence
models) can be exported the same way with torch.jit.script or torch.jit.trace.

Models:
  convnet   2 conv + batch norm blocks, dropout, for Fashion-MNIST [1, 28, 28]
  mlp-cumulative
            an MLP whose BatchNorm1d keeps a cumulative average (momentum None)
  instance-norm
            a convolution with an instance norm that tracks running statistics
  bert-tiny a small transformer encoder over byte tokens (fortunes-langid)
"""
import argparse
import math
import sys

import torch
from torch import nn


class ConvNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Sequential(
            nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Dropout(0.25), nn.Linear(64, classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class CumulativeMlp(nn.Module):
    def __init__(self, inputs=784, classes=10):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(), nn.Linear(inputs, 32), nn.BatchNorm1d(32, momentum=None), nn.ReLU(),
            nn.Linear(32, classes))

    def forward(self, x):
        return self.layers(x)


class InstanceNormNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1, bias=False),
            nn.InstanceNorm2d(8, affine=True, track_running_stats=True), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 14 * 14, classes))

    def forward(self, x):
        return self.layers(x)


class TinyEncoder(nn.Module):
    """Byte-token classifier: embeddings, a transformer encoder, [CLS] pooling."""

    def __init__(self, vocab=259, length=64, classes=4, width=64, layers=2, heads=2):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(length, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.1,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(width, classes)
        self.scale = math.sqrt(width)

    def forward(self, tokens):
        where = torch.arange(tokens.size(1), device=tokens.device)
        x = self.tokens(tokens) + self.positions(where).unsqueeze(0)
        x = self.encoder(x, src_key_padding_mask=tokens.eq(0))
        return self.head(x[:, 0])


MODELS = {"convnet": ConvNet, "mlp-cumulative": CumulativeMlp, "instance-norm": InstanceNormNet,
          "bert-tiny": TinyEncoder}


def build(name, seed=0):
    """The named example model, initialised from `seed`."""
    torch.manual_seed(seed)
    return MODELS[name]()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="convnet")
    parser.add_argument("--out", required=True, help="the TorchScript file to write")
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed")
    args = parser.parse_args()
    scripted = torch.jit.script(build(args.model, args.seed))
    scripted.save(args.out)
    count = sum(p.numel() for p in scripted.parameters())
    print(f"wrote {args.out}: {args.model}, {count} parameters")


if __name__ == "__main__":
    sys.exit(main())
