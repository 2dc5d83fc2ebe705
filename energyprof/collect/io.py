"""I/O on the sensors' clock: the program's /proc/PID/io and the disks' /proc/diskstats, read at every tick
and at every window's edge.

Both are cumulative counters, kept as read (the facts). A window's edges are read when the window
begins and ends, in the program (agent/iostat.py: /proc/self/io, then the disks), so its bytes are the
counters' differences at its own edges; between readings a span's figures are interpolated linearly
(analysis/io.py). /proc/PID/io counts the process and the children it has waited for; workers still
alive at a tick are not in it until they exit.

Disks are counted once: the physical disks, the block devices with no device beneath them
(`/sys/block/NAME/slaves` empty). A volume stacked on others (LVM, dm-crypt, md RAID, multipath)
is counted through the disks beneath it, so a 1 GB read from an encrypted LVM volume is 1 GB, not
2 or 3. Loop, RAM and zram devices are left out (their bytes are a file's on a disk, or memory).
Disks may come and go: each keeps its own readings, a counter that restarts (a disk removed and
added again under its name) carries on from its last value, and the set of disks is looked up
again when /proc/diskstats lists other names. Linux only: elsewhere the recorder reads nothing and
the profile says I/O is absent.

The /proc and /sys roots are parameters, which is how tests give a fake tree.
"""

from __future__ import annotations

import bisect
import os
import sys
import threading
import time
from typing import Any, Callable

from ..agent.iostat import DISK_FIELDS, PROC_FIELDS, parse_diskstats, parse_proc_io, read_bytes

SECTOR = 512  # diskstats counts 512-byte sectors whatever the device's own sector size
MAX_POINTS = 4000  # past this, every other tick's reading is let go: the counters stay exact at the ones kept
MAX_EDGES = 8000  # window edges kept exact (a few MB of JSON at most); past this every other one is let go (the fact says so)
ABSENT = "I/O is not recorded on this system (/proc/PID/io and /proc/diskstats are Linux's)"
OFF = "I/O is not recorded in this run (--io off)"
COUNTED = ("physical disks (block devices with no device beneath them): a volume stacked on others (LVM,"
           " dm-crypt, md) is counted through its disks, once")
_SKIPPED = ("loop", "ram", "zram")


def counted_disks(sys_root: str = "/sys") -> set[str]:
    """The disks whose counters a read is counted on, once: every block device with nothing beneath it
    (an empty or missing `slaves` folder), not a loop, RAM or zram device. Partitions are not in
    /sys/block; a device-mapper or md volume has its devices under `slaves` (and is in their `holders`)."""
    block = os.path.join(sys_root, "block")
    try:
        names = os.listdir(block)
    except OSError:
        return set()
    out = set()
    for name in names:
        if name.startswith(_SKIPPED):
            continue
        try:
            beneath = os.listdir(os.path.join(block, name, "slaves"))
        except OSError:
            beneath = []
        if not beneath:
            out.add(name)
    return out


whole_disks = counted_disks  # the name it had


def read_proc_io(pid: int | str, proc_root: str = "/proc") -> dict[str, int] | None:
    values = parse_proc_io(read_bytes(os.path.join(proc_root, str(pid), "io")))
    return None if values is None else dict(zip(PROC_FIELDS, values))


def read_diskstats(disks: set[str] | None, proc_root: str = "/proc") -> dict[str, dict[str, int]]:
    """The named disks' counters (every device's, with None)."""
    rows = parse_diskstats(read_bytes(os.path.join(proc_root, "diskstats")), disks)
    return {name: dict(zip(DISK_FIELDS, values)) for name, values in rows.items()}


class _Disk:
    """One disk's readings: its own times (it may appear late or go away), its counters made monotonic."""

    def __init__(self) -> None:
        self.t_ns: list[int] = []
        self.values: list[tuple[int, ...]] = []
        self.raw: tuple[int, ...] | None = None  # the last raw reading
        self.offset = [0] * len(DISK_FIELDS)

    def carried(self, raw: tuple[int, ...]) -> tuple[int, ...]:
        """A raw reading carried on past a restart: a counter that went back began again from 0."""
        last = self.raw
        if last is not None:
            for k, (a, b) in enumerate(zip(last, raw)):
                if b < a:
                    self.offset[k] += a
        self.raw = raw
        return tuple(v + o for v, o in zip(raw, self.offset))

    def add(self, t_ns: int, raw: tuple[int, ...]) -> None:
        self.values.append(self.carried(raw))
        self.t_ns.append(t_ns)

    def thin(self) -> None:
        keep = list(range(0, len(self.t_ns) - 1, 2)) + [len(self.t_ns) - 1]
        self.t_ns = [self.t_ns[i] for i in keep]
        self.values = [self.values[i] for i in keep]


class IoRecorder:
    """Called by the collector at each tick; `edge` takes the readings at a window's edge. Keeps the
    counters as read, and writes them out aligned on one clock (`fact`)."""

    def __init__(self, pid: Callable[[], int | str | None], proc_root: str = "/proc", sys_root: str = "/sys",
                 off: bool = False) -> None:
        """`off` (--io off): nothing is read, not even to find the disks, and the fact says I/O was off."""
        self.pid = pid
        self.proc_root, self.sys_root = proc_root, sys_root
        self.off = off
        self.available = not off and sys.platform.startswith("linux") and os.path.exists(os.path.join(proc_root, "diskstats"))
        self.disks = counted_disks(sys_root) if self.available else set()
        self._listed: frozenset[str] = frozenset()  # the names /proc/diskstats gave last
        self.t_ns: list[int] = []
        self.process: dict[str, list[int]] = {k: [] for k in PROC_FIELDS}
        self.disk: dict[str, _Disk] = {}
        # (t_ns, the main process's counters or None (another process's edge), disks' raw counters)
        self.edges: list[tuple[int, tuple[int, ...] | None, dict[str, tuple[int, ...]]]] = []
        self.edges_thinned = False
        self._lock = threading.Lock()  # ticks (the collector's thread) and edges (the program's, in-process)

    def __call__(self, t_ns: int | None = None) -> None:
        """One tick's reading, at `t_ns` (the collector gives the time it calls at, after the sensors'
        reads, however long they took), else now."""
        if not self.available:
            return
        pid = self.pid()
        t = t_ns if t_ns is not None else time.perf_counter_ns()
        proc = read_proc_io(pid, self.proc_root) if pid else None
        text = read_bytes(os.path.join(self.proc_root, "diskstats"))
        everything = parse_diskstats(text)
        listed = frozenset(everything)
        before = self._listed
        if listed and listed != before:  # a disk came or went: which ones count is looked up again
            self._listed = listed
            self.disks = counted_disks(self.sys_root)
        stats = {name: row for name, row in everything.items() if name in self.disks}
        if proc is None and not stats:
            return
        with self._lock:
            self.t_ns.append(t)
            for k in PROC_FIELDS:  # a process not readable at this tick holds its last value
                series = self.process[k]
                series.append(proc[k] if proc is not None and k in proc else (series[-1] if series else 0))
            for name, row in stats.items():
                d = self.disk.get(name)
                if d is None:
                    d = self.disk[name] = _Disk()
                    if before and name not in before and len(self.t_ns) > 1:
                        # it appeared during the run: its counters began at 0 since the last reading
                        d.add(self.t_ns[-2], (0,) * len(DISK_FIELDS))
                d.add(t, row)
            if len(self.t_ns) > MAX_POINTS:
                self._thin()

    def edge(self, t_ns: int, proc: tuple[int, ...] | None, disks: dict[str, tuple[int, ...]]) -> None:
        """The counters at a window's edge, read at `t_ns` (the window's time): the main process's
        /proc/PID/io (None when another process read its own) and the disks' raw counters."""
        if not self.available:
            return
        with self._lock:
            # carried past its disk's restarts as known now, as the tick readings around it are
            counted = {name: _carry(name, self.disk, row) for name, row in disks.items() if name in self.disks}
            self.edges.append((t_ns, proc, counted))
            if len(self.edges) > MAX_EDGES:
                self.edges = self.edges[::2] + ([self.edges[-1]] if len(self.edges) % 2 == 0 else [])
                self.edges_thinned = True

    def read_edge(self, t_ns: int) -> None:
        """The edge's counters read now, in this process (an in-process profile's windows)."""
        if not self.available:
            return
        from ..agent.iostat import reading

        proc, disks = reading(frozenset(self.disks), self.pid() or "self", self.proc_root)
        self.edge(t_ns, proc, disks)

    def _thin(self) -> None:
        """Keep every other reading and the last: a 10-hour run at 50 ms stays at a few thousand points,
        its spans' figures interpolated over a coarser grid (the grid the timeline has too)."""
        keep = list(range(0, len(self.t_ns) - 1, 2)) + [len(self.t_ns) - 1]
        self.t_ns = [self.t_ns[i] for i in keep]
        for series in self.process.values():
            series[:] = [series[i] for i in keep]
        for d in self.disk.values():
            if len(d.t_ns) > 1:
                d.thin()

    def fact(self, origin_ns: int | None) -> dict[str, Any]:
        """The profile's `io`: counters at seconds from the profile's start (its windows' clock), every tick
        and every window edge on one sorted clock. At a time where a series has no reading of its own, its
        value is interpolated between its neighbours (held flat outside them)."""
        if not self.available:
            return {"absent": OFF if self.off else ABSENT}
        with self._lock:
            ticks = list(self.t_ns)
            process = {k: list(v) for k, v in self.process.items()}
            disks = {name: (list(d.t_ns), list(d.values)) for name, d in self.disk.items()}
            edges = list(self.edges)
        # The main process's readings: the ticks' and the edges it read itself.
        p_t = list(ticks)
        p_v = [tuple(process[k][i] for k in PROC_FIELDS) for i in range(len(ticks))]
        edge_disks: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
        for t, proc, rows in edges:
            if proc is not None:
                p_t.append(t)
                p_v.append(proc)
            for name, row in rows.items():
                edge_disks.setdefault(name, []).append((t, row))
        times = sorted(set(ticks) | {t for t, _, _ in edges})
        out_proc = _aligned(p_t, p_v, times, len(PROC_FIELDS))
        out_disks = {}
        for name in sorted(set(disks) | set(edge_disks)):
            d_t, d_v = disks.get(name, ([], []))
            extra = edge_disks.get(name, [])
            if extra:
                d_t, d_v = d_t + [t for t, _ in extra], d_v + [row for _, row in extra]
            cols = _aligned(d_t, d_v, times, len(DISK_FIELDS))
            out_disks[name] = dict(zip(DISK_FIELDS, cols))
        origin = origin_ns if origin_ns is not None else (times[0] if times else 0)
        fact: dict[str, Any] = {"t_s": [(t - origin) / 1e9 for t in times], "process": dict(zip(PROC_FIELDS, out_proc)),
                                "disks": out_disks, "sector_bytes": SECTOR, "method": "measured", "counted": COUNTED,
                                "window_edges": len(edges)}
        if self.edges_thinned:
            fact["edges_thinned"] = True
        return fact


def _carry(name: str, disks: dict[str, _Disk], row: tuple[int, ...]) -> tuple[int, ...]:
    """An edge's raw disk reading with the offsets its disk's restarts have added (none for a disk no tick read)."""
    d = disks.get(name)
    return row if d is None else tuple(v + o for v, o in zip(row, d.offset))


def _aligned(t: list[int], values: list[tuple[int, ...]], times: list[int], width: int) -> list[list[int]]:
    """Columns of `values` (readings at times `t`, in any order) at each of `times`: a reading's own where
    it has one, else linear between the readings around it (rounded), flat outside them; 0 with none."""
    if not t:
        return [[0] * len(times) for _ in range(width)]
    order = sorted(range(len(t)), key=t.__getitem__)
    ts = [t[i] for i in order]
    vs = [values[i] for i in order]
    for k in range(1, len(vs)):  # cumulative: two readings out of step (another process's clock read) never go back
        if any(b < a for a, b in zip(vs[k - 1], vs[k])):
            vs[k] = tuple(max(a, b) for a, b in zip(vs[k - 1], vs[k]))
    cols: list[list[int]] = [[] for _ in range(width)]
    for x in times:
        j = bisect.bisect_right(ts, x)
        if j and ts[j - 1] == x:
            row = vs[j - 1]
        elif j == 0:
            row = vs[0]
        elif j >= len(ts):
            row = vs[-1]
        else:
            a, b = ts[j - 1], ts[j]
            f = (x - a) / (b - a)
            row = tuple(round(va + (vb - va) * f) for va, vb in zip(vs[j - 1], vs[j]))
        for k in range(width):
            cols[k].append(row[k])
    return cols

