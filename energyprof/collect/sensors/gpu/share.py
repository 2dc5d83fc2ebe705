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
CUDA_RECHECK_S = 5.0  # how often a process not yet seen with CUDA loaded is looked at again


class ProcessShare:
    """The share, refreshed at most every SHARE_REFRESH_S and served from cache between; never raises."""

    def __init__(self, device: NvmlDevice) -> None:
        self.device = device
        self.value = 1.0
        self.refreshed_at = -1e18
        self._util_ts = 0
        self._uses_cuda = False
        self._cuda_checked = -1e18
        self.seen_pids: set[int] = set()  # every compute process NVML listed on the device (ties GPUs to ranks)
        # This process's family, walked from /proc (a file per thread of each process: a trainer has a
        # thread per core) only when NVML lists a pid not seen before, not at every refresh.
        self._ours: set[int] | None = None
        self._not_ours: set[int] = set()
        self.walks = 0

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
        if not pids:
            return 1.0 if self.uses_cuda() else 0.0
        ours = self._family(pids)
        mine = pids & ours
        if not mine:
            # Either another job's GPU, or a container whose pids NVML reports from the host.
            return 1.0 / len(pids) if self.uses_cuda() else 0.0
        if mine == pids:
            return 1.0
        util = self._utilisation_share(ours)
        return util if util is not None else len(mine) / len(pids)

    def _family(self, pids: set[int]) -> set[int]:
        """This process and its descendants, walked again only for a listed pid not yet known."""
        if self._ours is None or pids - self._ours - self._not_ours:
            self._ours = own_pids()
            self.walks += 1
            self._not_ours = pids - self._ours
        return self._ours

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
        now = time.monotonic()
        if now - self._cuda_checked < CUDA_RECHECK_S:
            return False  # the maps (thousands of lines in a torch process) read at most every CUDA_RECHECK_S
        self._cuda_checked = now
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
