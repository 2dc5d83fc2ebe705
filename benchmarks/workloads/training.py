"""The LeNet-on-CIFAR example (examples/lenet_cifar.py) on CPU, timed like the other workloads.

A thin wrapper: it runs the example as `__main__`, so the example stays a plain example.
The size scales the example's `--batches` (50 per epoch at size 1); arguments after the
size (the runner's `--training-args`) replace that and go to the example as they are. Exits 3 with a message when
torch or the example is missing, which the runner reports as "skipped".
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import size_arg, timed  # noqa: E402

EXAMPLE = os.path.join(HERE, os.pardir, os.pardir, "examples", "lenet_cifar.py")
SKIP_EXIT = 3


def main() -> None:
    example = os.path.normpath(EXAMPLE)
    if importlib.util.find_spec("torch") is None:
        print("training: skipped, torch is not installed", file=sys.stderr)
        raise SystemExit(SKIP_EXIT)
    if not os.path.isfile(example):
        print("training: skipped, examples/lenet_cifar.py does not exist yet", file=sys.stderr)
        raise SystemExit(SKIP_EXIT)
    extra = sys.argv[2:] or ["--batches", str(max(2, round(50 * size_arg())))]
    sys.argv = [example, *extra]

    def run() -> None:
        runpy.run_path(example, run_name="__main__")

    timed(run)


if __name__ == "__main__":
    main()
