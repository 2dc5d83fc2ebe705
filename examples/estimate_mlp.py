"""MLPs of several widths and batch sizes, each its own tracked loop, for `energyprof estimate`.

    python -m energyprof --json mlps.json examples/estimate_mlp.py --widths 512,724,1024,1448 --batches 32,128
    energyprof estimate fit mlps.json -o model.json           # every loop is an observation
    energyprof estimate predict model.json --flops 4e8 --params 1.2e6 --batch 64 --steps-per-epoch 100 --epochs 10

One epoch of each configuration in turn: whatever else the machine runs meanwhile falls on all of them
alike. `track(loader, model=model, flops=True)` counts each model's first-step FLOPs (torch's FlopCounterMode).
"""

from __future__ import annotations

import argparse

import torch

import energyprof.torch as ept


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", default="512,724,1024,1448")
    p.add_argument("--batches", default="64")
    p.add_argument("--inputs", type=int, default=512)
    p.add_argument("--steps", type=int, default=6, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    runs = []
    for batch in (int(b) for b in args.batches.split(",")):
        batches = [(torch.randn(batch, args.inputs), torch.randint(0, 10, (batch,))) for _ in range(args.steps)]
        for width in (int(w) for w in args.widths.split(",")):
            model = torch.nn.Sequential(torch.nn.Linear(args.inputs, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                        torch.nn.ReLU(), torch.nn.Linear(width, 10))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            runs.append((model, opt, ept.track(batches, model=model, flops=True, name=f"w{width}-b{batch}")))
    for _ in range(args.epochs):
        for model, opt, tracked in runs:
            for x, y in tracked:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()


if __name__ == "__main__":
    main()
