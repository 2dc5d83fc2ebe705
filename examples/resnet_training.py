"""A ResNet-style network on synthetic ImageNet-shaped data: the GPU example.

    python -m energyprof --sync cuda examples/resnet_training.py --device cuda --batch-size 128
    python -m energyprof examples/resnet_training.py --device cpu --image-size 64 --batches 5

Synthetic images (3 x 224 x 224 by default, 1000 classes) generated on the device itself, so
the data pipeline costs nothing and the profile is about the model: forward, backward and
the optimizer step. The network is ResNet-18's layout (basic blocks, [2, 2, 2, 2], widths
64-512) with a `--width` factor to shrink it for a CPU. Epochs are windows and each step is
split into fetch and compute (`energyprof.torch`); with CUDA, each step also records the
allocator's memory. Run under `--sync cuda` so each step's energy holds its own kernels.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import energyprof.torch as ept


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-18's layout; `width` scales every channel count (1.0 is the real thing)."""

    def __init__(self, classes: int = 1000, width: float = 1.0, blocks: tuple[int, ...] = (2, 2, 2, 2)) -> None:
        super().__init__()
        w = [max(4, int(c * width)) for c in (64, 128, 256, 512)]
        self.stem = nn.Sequential(nn.Conv2d(3, w[0], 7, 2, 3, bias=False), nn.BatchNorm2d(w[0]),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        layers: list[nn.Module] = []
        cin = w[0]
        for i, (cout, n) in enumerate(zip(w, blocks)):
            for j in range(n):
                layers.append(BasicBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(x)))


class SyntheticImageNet:
    """`batches` random batches per epoch, made on the device (no host-to-device copies)."""

    def __init__(self, batches: int, batch_size: int, image_size: int, classes: int, device: torch.device) -> None:
        self.batches, self.batch_size, self.image_size = batches, batch_size, image_size
        self.classes, self.device = classes, device

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):  # type: ignore[no-untyped-def]
        for _ in range(self.batches):
            x = torch.randn(self.batch_size, 3, self.image_size, self.image_size, device=self.device)
            y = torch.randint(0, self.classes, (self.batch_size,), device=self.device)
            yield x, y


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module,
               x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def main(argv: list[str] | None = None) -> ept.TrackedLoader:
    """Train; return the tracked loader (its per-step timings) for callers such as the tests."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batches", type=int, default=20, help="batches per epoch")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--width", type=float, default=1.0, help="channel width factor (0.25 for a quick CPU run)")
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast (CUDA)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda, but torch sees no CUDA device (use --device cpu)")
    device = torch.device(a.device)
    torch.manual_seed(a.seed)

    model = ResNet(a.classes, a.width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    steps = ept.track(SyntheticImageNet(a.batches, a.batch_size, a.image_size, a.classes, device))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"ResNet-18 layout x{a.width:g} ({n_params / 1e6:.1f} M parameters) on {device}, "
          f"batch {a.batch_size}, {a.image_size}px")
    model.train()
    for epoch in range(a.epochs):
        t0 = time.perf_counter()
        with ept.window("epoch", epoch):
            losses = []
            for x, y in steps:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.amp):
                    losses.append(train_step(model, optimizer, loss_fn, x, y))
            loss = torch.stack(losses).mean().item()  # one sync per epoch, not per step
        dt = time.perf_counter() - t0
        peaks = [s.gpu_peak_bytes for s in steps.steps if s.epoch == epoch and s.gpu_peak_bytes is not None]
        extra = f", peak GPU memory {max(peaks) / 2**20:.0f} MiB" if peaks else ""
        print(f"epoch {epoch}: loss {loss:.3f}, {dt:.2f} s, {a.batches * a.batch_size / dt:.0f} images/s{extra}")
    return steps


if __name__ == "__main__":
    main()
