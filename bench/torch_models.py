"""PyTorch twins of vflow's models, for the benchmarks that run both side by side."""


def convnet():
    """vflow's `convnet` with channels [32, 64], 128 hidden, dropout 0.25, batch norm,
    on 1x28x28 images."""
    import torch.nn as nn
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10))


def mlp_wide():
    """vflow's `mlp` with hidden [2048, 2048] and no dropout, on 1x28x28 images."""
    import torch.nn as nn
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048),
                         nn.ReLU(), nn.Linear(2048, 10))


def by_name(name):
    """The model bench/ddp_compare.py's --model names."""
    if name == "mlp-wide":
        return mlp_wide()
    if name == "resnet18":
        return resnet18(16)
    if name == "bert-mini":
        return bert(layers=4, hidden=256, heads=4)
    return convnet()


# vflow's byte tokens (data/text.h): ids 0 (padding), 1 (start), 2 (end), then 256 bytes.
BYTE_VOCAB = 259


def bert(layers, hidden, heads, vocab=BYTE_VOCAB, positions=64, classes=4, dropout=0.1):
    """vflow's `bert` classifier: learned token and position embeddings, layer norm and
    dropout on them, post-norm blocks (fused QKV projection, GELU feed-forward of 4x
    width), padding (id 0) masked from every query, a tanh pooler over the first token,
    dropout, a linear classifier. Defaults are those of the fortunes-langid data
    (max_length 64, 4 languages)."""
    import math
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.out = nn.Linear(hidden, hidden)
            self.up = nn.Linear(hidden, 4 * hidden)
            self.down = nn.Linear(4 * hidden, hidden)
            self.norm1 = nn.LayerNorm(hidden)
            self.norm2 = nn.LayerNorm(hidden)
            self.dropout = nn.Dropout(dropout)

        def attend(self, x, mask):
            n, t, width = x.shape
            head = width // heads
            qkv = self.qkv(x).view(n, t, 3, heads, head).permute(2, 0, 3, 1, 4)
            scores = qkv[0] @ qkv[1].transpose(-2, -1) / math.sqrt(head) + mask
            y = self.dropout(scores.softmax(-1)) @ qkv[2]
            return self.out(y.transpose(1, 2).reshape(n, t, width))

        def forward(self, x, mask):
            y = self.norm1(x + self.dropout(self.attend(x, mask)))
            return self.norm2(y + self.dropout(self.down(F.gelu(self.up(y)))))

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(vocab, hidden)
            self.positions = nn.Embedding(positions, hidden)
            self.norm = nn.LayerNorm(hidden)
            self.dropout = nn.Dropout(dropout)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.pooler = nn.Linear(hidden, hidden)
            self.classifier = nn.Linear(hidden, classes)
            nn.init.normal_(self.tokens.weight, 0.0, 0.02)
            nn.init.normal_(self.positions.weight, 0.0, 0.02)

        def forward(self, tokens):
            n, t = tokens.shape
            mask = tokens.eq(0).float().mul(-1e9).view(n, 1, 1, t)
            x = self.tokens(tokens) + self.positions(torch.arange(t)).unsqueeze(0)
            x = self.dropout(self.norm(x))
            for block in self.blocks:
                x = block(x, mask)
            return self.classifier(self.dropout(torch.tanh(self.pooler(x[:, 0]))))

    return Bert()


def resnet18(width, classes=10, in_channels=3):
    """vflow's `resnet` with depth 18 (CIFAR-style 3x3 stem, basic blocks [2, 2, 2, 2],
    first-stage width `width`, batch norm, no biases in convolutions)."""
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.b2(self.c2(self.b1(self.c1(x)).relu()))
            return (y + (self.down(x) if self.down is not None else x)).relu()

    layers = [nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    cin = width
    for stage, stride in enumerate([1, 2, 2, 2]):
        cout = width * 2 ** stage
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)
