"""A simulated GPU behind a fake NVML binding, driven by a recorded power-limit sweep.

Only the hardware is faked: the binding answers with pynvml's names and conventions (mW, mJ, NVMLError
with `.value`). Each training step advances the simulated clock by the table's time per step at the
current limit (scaled down) and the energy counter by the table's power at that limit times that time,
so every window the optimizer measures has an exact answer independent of the wall clock.
"""

from __future__ import annotations

import csv
import os
from typing import Any

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "zeus__profile_data__A40+resnet50+gpu0.csv")
V100 = os.path.join(os.path.dirname(__file__), "fixtures", "zeus__profile_data__V100+resnet50+gpu0.csv")
WINDOW_STEPS = 40  # Zeus's profile window the table was recorded over
TIME_SCALE = 1e-3  # a 24 s window becomes 24 simulated ms


def load_table(path: str = FIXTURE) -> dict[float, tuple[float, float]]:
    """limit W -> (energy J, time s) of one 40-step window, as recorded."""
    out = {}
    with open(path) as fh:
        for row in csv.DictReader(fh):
            limit = float(row["window_name"].rsplit("_", 1)[1])
            out[limit] = (float(row["gpu0_energy"]), float(row["elapsed_time"]))
    return out


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 4: "Insufficient Permissions", 9: "Driver Not Loaded"}.get(self.value, f"error {self.value}")


class SimGpu:
    def __init__(self, table: dict[float, tuple[float, float]], default_w: float | None = None,
                 settable: bool = True, time_scale: float = TIME_SCALE) -> None:
        self.table = table
        self.min_w, self.max_w = min(table), max(table)
        self.limit_w = default_w if default_w is not None else self.max_w
        self.settable = settable
        self.clock_s = 0.0
        self.energy_j = 0.0
        self.sets: list[float] = []
        self.time_scale = time_scale

    def step(self) -> None:
        """One training step at the current limit: the table's per-step time and power."""
        energy, elapsed = self.table[self.limit_w]
        dt = elapsed / WINDOW_STEPS * self.time_scale
        self.clock_s += dt
        self.energy_j += energy / elapsed * dt


class FakeNvml:
    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4

    def __init__(self, gpus: list[SimGpu]) -> None:
        self.gpus = gpus
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> SimGpu:
        if not 0 <= i < len(self.gpus):
            raise NVMLError(2)
        return self.gpus[i]

    def nvmlDeviceGetPowerManagementLimitConstraints(self, g: SimGpu) -> list[int]:
        return [int(g.min_w * 1000), int(g.max_w * 1000)]

    def nvmlDeviceGetPowerManagementLimit(self, g: SimGpu) -> int:
        return int(g.limit_w * 1000)

    def nvmlDeviceSetPowerManagementLimit(self, g: SimGpu, mw: int) -> None:
        if not g.settable:
            raise NVMLError(4)
        if not g.min_w * 1000 <= mw <= g.max_w * 1000:
            raise NVMLError(2)
        g.limit_w = mw / 1000.0
        g.sets.append(g.limit_w)

    def nvmlDeviceGetTotalEnergyConsumption(self, g: SimGpu) -> float:
        return g.energy_j * 1000.0  # mJ; kept unrounded so the windows are exact


def run(plo: Any, gpu: SimGpu, steps: int, epoch_steps: int | None = None) -> None:
    """A training loop calling Zeus's callbacks, `epoch_steps` steps to an epoch."""
    epoch_steps = epoch_steps or steps
    done = 0
    while done < steps:
        plo.on_epoch_begin()
        for _ in range(min(epoch_steps, steps - done)):
            plo.on_step_begin()
            gpu.step()
            plo.on_step_end()
            done += 1
        plo.on_epoch_end()
