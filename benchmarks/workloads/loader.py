"""A torch DataLoader with 4 worker processes doing the CPU work in `__getitem__`: what
following the workers costs. Exits 3 with a message when torch is missing ("skipped")."""

from __future__ import annotations

import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import size_arg, timed  # noqa: E402

SKIP_EXIT = 3


def burn(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i
    return s


def main() -> None:
    if importlib.util.find_spec("torch") is None:
        print("loader: skipped, torch is not installed", file=sys.stderr)
        raise SystemExit(SKIP_EXIT)
    import torch
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)
    items = max(8, int(160 * size_arg()))

    class Work(Dataset):
        def __len__(self) -> int:
            return items

        def __getitem__(self, i: int) -> torch.Tensor:
            burn(40_000)
            return torch.tensor([i])

    def run() -> None:
        for _ in DataLoader(Work(), batch_size=4, num_workers=4):
            pass

    timed(run)


if __name__ == "__main__":
    main()
