"""LeNet on CIFAR-10-shaped data (grayscale 32x32): the classic small training loop.

    python -m energyprof examples/lenet_cifar.py                 # profile it (report + summary)
    python examples/lenet_cifar.py --epochs 5 --batches 0        # or just train (0: every batch)

Batch 16, SGD (lr 0.01, momentum 0.9), cross-entropy, a DataLoader with worker processes.
Uses the real CIFAR-10 when torchvision finds it under `--data` (never downloads); otherwise
synthetic tensors of the same shape, so it runs anywhere (`--save-data` writes them under `--data`,
and later runs read them from there one item at a time). Each epoch is a window
(`ept.window("epoch", i)`) and each step is split into data fetch and compute
(`ept.track(loader)`): both are no-ops when energyprof is not profiling.
The defaults finish in a few seconds on a laptop CPU.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import energyprof.torch as ept


class LeNet(nn.Module):
    """LeNet-5 for one-channel 32x32 images and 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class SyntheticCifar(Dataset):
    """CIFAR-10's shape without its files: a fixed random image and label per index.

    The per-item normalisation is real work done in the loader's workers, like a transform.
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (size, 1, 32, 32), generator=g, dtype=torch.uint8)
        self.labels = torch.randint(0, 10, (size,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images[i].float().div_(255.0).sub_(0.5).div_(0.5)
        return x, self.labels[i]


class FileCifar(Dataset):
    """Images read from disk per item: `lenet-images.u8` (N x 32 x 32 bytes) and `lenet-labels.u8` under a
    folder (written by `--save-data`). Each item is one read of its 1,024 bytes, as a file-per-sample dataset
    does, so the disk and the page cache are on the loader's path (try `--watch-cache` on the folder)."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, IMAGES)
        with open(os.path.join(root, LABELS), "rb") as fh:
            self.labels = torch.frombuffer(bytearray(fh.read()), dtype=torch.uint8).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            raw = os.pread(fd, 1024, i * 1024)
        finally:
            os.close(fd)
        x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(1, 32, 32).float().div_(255.0).sub_(0.5).div_(0.5)
        return x, self.labels[i]


IMAGES, LABELS = "lenet-images.u8", "lenet-labels.u8"


def save_data(root: str, size: int) -> None:
    """Write the synthetic set under `root` in FileCifar's layout."""
    data = SyntheticCifar(size)
    os.makedirs(root, exist_ok=True)
    for name, t in ((IMAGES, data.images), (LABELS, data.labels.to(torch.uint8))):
        with open(os.path.join(root, name), "wb") as fh:
            fh.write(t.numpy().tobytes())
            fh.flush()
            os.fsync(fh.fileno())  # written out, so `energyprof cache drop` can evict the pages (dirty ones stay)


def load_data(root: str, size: int) -> tuple[Dataset, str]:
    """The real CIFAR-10 training set in grayscale when it is on disk, else the files `--save-data` wrote,
    else synthetic."""
    if os.path.isdir(os.path.join(root, "cifar-10-batches-py")):
        try:
            from torchvision import datasets, transforms

            tf = transforms.Compose([transforms.Grayscale(), transforms.ToTensor(), transforms.Normalize((0.5,), (0.5,))])
            return datasets.CIFAR10(root, train=True, download=False, transform=tf), "CIFAR-10"
        except ImportError:
            pass
    if os.path.exists(os.path.join(root, IMAGES)):
        return FileCifar(root), "synthetic, read from disk"
    return SyntheticCifar(size), "synthetic"


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module,
               x: torch.Tensor, y: torch.Tensor) -> float:
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)  # forward
    loss.backward()
    optimizer.step()
    return loss.item()


def main(argv: list[str] | None = None) -> ept.TrackedLoader:
    """Train; return the tracked loader (its per-step timings) for callers such as the tests."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batches", type=int, default=200, help="batches per epoch (0: the whole data set)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--data", default="data", help="folder holding cifar-10-batches-py, if you have it")
    p.add_argument("--save-data", action="store_true", help="write the synthetic images under --data and exit")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)

    size = a.batches * a.batch_size if a.batches else 50_000
    if a.save_data:
        save_data(a.data, size)
        raise SystemExit(0)
    data, kind = load_data(a.data, size)
    loader = DataLoader(data, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                        persistent_workers=a.workers > 0)
    model = LeNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    steps = ept.track(loader)
    print(f"LeNet on {kind} data: {len(data)} images, batch {a.batch_size}, {a.workers} workers")
    for epoch in range(a.epochs):
        t0 = time.perf_counter()
        total, n = 0.0, 0
        with ept.window("epoch", epoch):
            for i, (x, y) in enumerate(steps):
                total += train_step(model, optimizer, loss_fn, x, y)
                n += 1
                if a.batches and i + 1 >= a.batches:
                    break
        s = steps.summary()["epochs"][-1]
        print(f"epoch {epoch}: loss {total / max(n, 1):.3f}, {time.perf_counter() - t0:.2f} s "
              f"(fetch {s['fetch_s']:.2f} s, compute {s['compute_s']:.2f} s, stall {s['stall_s']:.2f} s)")
    return steps


if __name__ == "__main__":
    main()
