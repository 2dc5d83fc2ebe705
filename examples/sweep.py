"""A batch-size x power-limit sweep in one run, one window per configuration: its Pareto front.

    python -m energyprof --json sweep.json -o sweep.html examples/sweep.py
    energyprof compare --windows config sweep.json other-machine.json -o fronts.html

Each configuration runs inside `energyprof.torch.window("config:bs=...,pl=...")`: the report
places every `config:LABEL` window as a point of energy against time and joins the Pareto front
(the configurations no other one beats on both), the figure of Zeus's batch-size x power-limit
study, from one script. `energyprof compare --windows config` puts the sweeps of several runs
(machines, versions) side by side.

The work is a stand-in that runs anywhere: a step costs CPU in proportion to its batch plus a
fixed part per step (launch and synchronisation), and the "power limit" is a duty cycle (the
work runs at that fraction of the time, as a capped device stretches its kernels). On a GPU,
replace `step` with a real training step and set the limit before each configuration with
`pynvml.nvmlDeviceSetPowerManagementLimit(handle, watts * 1000)` (root only).
"""

from __future__ import annotations

import argparse
import time

import energyprof.torch as ept

FIXED = 20_000  # the per-step cost, in loop iterations
PER_SAMPLE = 200


def step(batch: int, limit: float) -> None:
    """One step on `batch` samples at duty cycle `limit` (1.0: no cap)."""
    t0 = time.perf_counter()
    x = 0
    for i in range(FIXED + batch * PER_SAMPLE):
        x += i * i
    if limit < 1.0:
        time.sleep((time.perf_counter() - t0) * (1.0 - limit) / limit)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=4096, help="samples per configuration (one epoch)")
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--limit", type=float, nargs="+", default=[1.0, 0.6], help="duty cycles standing in for power limits")
    args = ap.parse_args()
    for bs in args.batch:
        for pl in args.limit:
            with ept.window(f"config:bs={bs},pl={pl:.0%}") as m:
                for _ in range(max(1, args.samples // bs)):
                    step(bs, pl)
            print(f"bs={bs:<4} pl={pl:>4.0%}  {m.time_s:.2f} s  {m.program_total_j if m.program_total_j is not None else '-'} J")


if __name__ == "__main__":
    main()
