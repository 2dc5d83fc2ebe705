"""I/O on the sensors' clock: the program's /proc/PID/io and each disk's /proc/diskstats, read at every tick.

Both are cumulative counters, kept as read (the facts); a span's MB read, IOPS and busy time are the
counters' differences at its ends, interpolated linearly between ticks (analysis/io.py). /proc/PID/io
counts the process and the children it has waited for; workers still alive at a tick are not in it
until they exit. Linux only: elsewhere the recorder reads nothing and the profile says I/O is absent.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

PROC_FIELDS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes")
# /proc/diskstats columns after major, minor, name (Documentation/admin-guide/iostats.rst)
DISK_FIELDS = {"reads": 0, "read_sectors": 2, "writes": 4, "write_sectors": 6, "busy_ms": 9}
SECTOR = 512  # diskstats counts 512-byte sectors whatever the device's own sector size
MAX_POINTS = 4000  # past this, every other reading is let go: the counters stay exact at the ones kept
ABSENT = "I/O is not recorded on this system (/proc/PID/io and /proc/diskstats are Linux's)"


def whole_disks(sys_root: str = "/sys") -> set[str]:
    """Disks, not partitions nor loop or RAM devices: a read is counted once, on its disk."""
    try:
        names = os.listdir(os.path.join(sys_root, "block"))
    except OSError:
        return set()
    return {n for n in names if not n.startswith(("loop", "ram", "zram"))}


def read_proc_io(pid: int, proc_root: str = "/proc") -> dict[str, int] | None:
    try:
        text = Path(proc_root, str(pid), "io").read_text(encoding="utf-8")
    except OSError:
        return None  # gone, or another user's process
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in PROC_FIELDS:
            out[key] = int(value)
    return out


def read_diskstats(disks: set[str], proc_root: str = "/proc") -> dict[str, dict[str, int]]:
    try:
        text = Path(proc_root, "diskstats").read_text(encoding="utf-8")
    except OSError:
        return {}
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 14 or parts[2] not in disks:
            continue
        cols = parts[3:]
        out[parts[2]] = {k: int(cols[i]) for k, i in DISK_FIELDS.items()}
    return out


class IoRecorder:
    """Called by the collector at each tick with the tick's time; keeps the counters as read."""

    def __init__(self, pid: Callable[[], int | None], proc_root: str = "/proc", sys_root: str = "/sys") -> None:
        self.pid = pid
        self.proc_root, self.sys_root = proc_root, sys_root
        self.available = sys.platform.startswith("linux") and os.path.exists(os.path.join(proc_root, "diskstats"))
        self.disks = whole_disks(sys_root) if self.available else set()
        self.t_ns: list[int] = []
        self.process: dict[str, list[int]] = {k: [] for k in PROC_FIELDS}
        self.disk: dict[str, dict[str, list[int]]] = {}

    def __call__(self, t_ns: int) -> None:
        if not self.available:
            return
        pid = self.pid()
        proc = read_proc_io(pid, self.proc_root) if pid else None
        stats = read_diskstats(self.disks, self.proc_root)
        if proc is None and not stats:
            return
        n = len(self.t_ns)
        self.t_ns.append(t_ns)
        for k in PROC_FIELDS:  # a process not readable at this tick holds its last value
            series = self.process[k]
            series.append(proc[k] if proc is not None and k in proc else (series[-1] if series else 0))
        for name, row in stats.items():
            d = self.disk.setdefault(name, {k: [row[k]] * n for k in DISK_FIELDS})
            for k in DISK_FIELDS:
                d[k].append(row[k])
        if len(self.t_ns) > MAX_POINTS:
            self._thin()

    def _thin(self) -> None:
        """Keep every other reading and the last: a 10-hour run at 50 ms stays at a few thousand points,
        its spans' figures interpolated over a coarser grid (the grid the timeline has too)."""
        keep = list(range(0, len(self.t_ns) - 1, 2)) + [len(self.t_ns) - 1]
        self.t_ns = [self.t_ns[i] for i in keep]
        for series in (*self.process.values(), *(v for d in self.disk.values() for v in d.values())):
            series[:] = [series[i] for i in keep]

    def fact(self, origin_ns: int | None) -> dict[str, Any]:
        """The profile's `io`: counters as read, at seconds from the profile's start (its windows' clock)."""
        if not self.available:
            return {"absent": ABSENT}
        origin = origin_ns if origin_ns is not None else (self.t_ns[0] if self.t_ns else 0)
        return {"t_s": [(t - origin) / 1e9 for t in self.t_ns], "process": {k: list(v) for k, v in self.process.items()},
                "disks": {name: {k: list(v) for k, v in d.items()} for name, d in self.disk.items()},
                "sector_bytes": SECTOR, "method": "measured"}
