"""This process's share of a GPU it may share with others: the compute-process list and per-process utilisation.

1 when this process (or one of its children) is the only compute process on the GPU. Shared with
others: its share of SM utilisation when the driver reports per-process utilisation, else an equal
split between the compute processes (an estimate either way). No compute process at all, or not
listed: 1 if this process has CUDA loaded (containers hide its host pid from it), else 0 (the
GPU's draw is someone else's or idle).
"""

from __future__ import annotations

import os
import sys
import time

from ... import probes
from .nvml_device import GpuError, NvmlDevice

SHARE_REFRESH_S = 0.5  # how often the process list / utilisation is asked for


class ProcessShare:
    """The share, refreshed at most every SHARE_REFRESH_S and served from cache between; never raises."""

    def __init__(self, device: NvmlDevice) -> None:
        self.device = device
        self.value = 1.0
        self.refreshed_at = -1e18
        self._util_ts = 0
        self._uses_cuda = False
        self.seen_pids: set[int] = set()  # every compute process NVML listed on the device (ties GPUs to ranks)

    def __call__(self) -> float:
        now = time.monotonic()
        if now - self.refreshed_at < SHARE_REFRESH_S:
            return self.value
        self.refreshed_at = now
        try:
            self.value = self.compute()
        except Exception:  # noqa: BLE001 - keep the last figure
            pass
        return self.value

    def compute(self) -> float:
        try:
            pids = self.device.compute_pids()
        except GpuError:  # not supported / no permission
            return 1.0 if self.uses_cuda() else 0.0
        self.seen_pids |= pids
        ours = own_pids()
        mine = pids & ours
        if not pids:
            return 1.0 if self.uses_cuda() else 0.0
        if not mine:
            # Either another job's GPU, or a container whose pids NVML reports from the host.
            return 1.0 / len(pids) if self.uses_cuda() else 0.0
        if mine == pids:
            return 1.0
        util = self._utilisation_share(ours)
        return util if util is not None else len(mine) / len(pids)

    def _utilisation_share(self, ours: set[int]) -> float | None:
        try:
            samples = self.device.process_utilization(self._util_ts)
        except GpuError:  # NOT_FOUND: no sample since the last call; or not supported
            return None
        total = mine = 0.0
        for pid, sm, ts in samples:
            total += sm
            if pid in ours:
                mine += sm
            self._util_ts = max(self._util_ts, ts)
        return mine / total if total > 0 else None

    def uses_cuda(self) -> bool:
        """Whether this process has CUDA loaded (torch initialised it, or libcuda is mapped)."""
        if self._uses_cuda:
            return True
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                self._uses_cuda = True
                return True
        except Exception:  # noqa: BLE001
            pass
        try:
            with open("/proc/self/maps", "rb") as fh:
                self._uses_cuda = b"libcuda.so" in fh.read()
        except OSError:
            pass
        return self._uses_cuda


def own_pids() -> set[int]:
    pids = {os.getpid()}
    kids = probes.descendant_pids()
    if kids is None:
        try:
            import psutil

            kids = [c.pid for c in psutil.Process().children(recursive=True)]
        except Exception:  # noqa: BLE001
            kids = []
    pids.update(kids)
    return pids
