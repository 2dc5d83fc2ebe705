"""A stand-in pynvml module whose simulated GPU keeps its power limit in a file ($SIM_GPU_STATE).

tests/sim_gpu.py's FakeNvml is an object of the test's process: its GPU lives and dies with that
process, so nothing else can reach it. This module is importable by name (`sim_pynvml`, from the tests
folder), and its limit lives in a file, so the keeper's process, started by whoever set the limit, puts
it back through the same binding, and a test reads what is left after the setter was killed. The clock
and the energy counter advance in `step()`, by the recorded table (sim_gpu.load_table) at the current limit.
"""

from __future__ import annotations

import os

from sim_gpu import FIXTURE, TIME_SCALE, WINDOW_STEPS, NVMLError, load_table

STATE_ENV = "SIM_GPU_STATE"
TABLE_ENV = "SIM_GPU_TABLE"
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4

TABLE = load_table(os.environ.get(TABLE_ENV) or FIXTURE)
MIN_W, MAX_W = min(TABLE), max(TABLE)
clock_s = 0.0
energy_j = 0.0
sets: list[float] = []


def state_path() -> str:
    return os.environ[STATE_ENV]


def reset(limit_w: float | None = None, path: str | None = None) -> None:
    with open(path or state_path(), "w") as f:
        f.write(f"{MAX_W if limit_w is None else limit_w:g}\n")


def limit_w(path: str | None = None) -> float:
    with open(path or state_path()) as f:
        return float(f.read())


def step() -> None:
    """One training step at the current limit: the table's per-step time and power."""
    global clock_s, energy_j
    energy, elapsed = TABLE[limit_w()]
    dt = elapsed / WINDOW_STEPS * TIME_SCALE
    clock_s += dt
    energy_j += energy / elapsed * dt


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return 1


def nvmlDeviceGetHandleByIndex(i: int) -> str:
    if i != 0:
        raise NVMLError(2)
    return "gpu0"


def nvmlDeviceGetPowerManagementLimitConstraints(h: str) -> list[int]:
    return [int(MIN_W * 1000), int(MAX_W * 1000)]


def nvmlDeviceGetPowerManagementLimit(h: str) -> int:
    return int(limit_w() * 1000)


def nvmlDeviceSetPowerManagementLimit(h: str, mw: int) -> None:
    if not MIN_W * 1000 <= mw <= MAX_W * 1000:
        raise NVMLError(2)
    with open(state_path(), "w") as f:
        f.write(f"{mw / 1000.0:g}\n")
    sets.append(mw / 1000.0)


def nvmlDeviceGetTotalEnergyConsumption(h: str) -> float:
    return energy_j * 1000.0
