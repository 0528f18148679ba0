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
    return convnet()


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
