"""A span's I/O from the profile's recorded counters (collect/io.py writes them): MB, IOPS, busy share. Pure.

The counters are read at every tick and at every window's edge, so a window's figures are the counters'
differences at readings taken at its own edges; any other span's ends are interpolated between readings."""

from __future__ import annotations

import bisect
from typing import Any

from ..facts.blocks import IoFact


def _at(t: list[float], values: list[int], x: float) -> float:
    """A cumulative counter at time x: linear between readings, flat outside them. A series shorter than
    the clock (a disk that went away, in a profile written before disks kept their own readings) holds
    the first readings' times: it is read over those, and held at its last value after them."""
    if len(values) != len(t):
        n = min(len(values), len(t))
        t, values = t[:n], values[:n]
    if not t:
        return 0.0
    k = bisect.bisect_right(t, x)
    if k == 0:
        return float(values[0])
    if k >= len(t):
        return float(values[-1])
    a, b = t[k - 1], t[k]
    return values[k - 1] + (values[k] - values[k - 1]) * ((x - a) / (b - a) if b > a else 1.0)


def io_in_span(io: IoFact | None, start_s: float, end_s: float) -> dict[str, float] | None:
    """MB read and written by the program and by the disks, read IOPS and the busiest disk's busy share,
    over [start_s, end_s]. None where the profile holds no I/O. Pure.

    Rates are over the part of the span the readings cover: nothing is known of the counters outside it
    (they are held flat there), and the run's span, asked as (-inf, inf), is its readings' span (divided by
    an infinite span, its rates were always 0)."""
    if io is None or not io.t_s:
        return None
    t = io.t_s
    span = min(end_s, t[-1]) - max(start_s, t[0])

    def delta(series: list[int]) -> float:
        return max(0.0, _at(t, series, end_s) - _at(t, series, start_s))

    proc = io.process
    sector = io.sector_bytes
    disks = io.disks
    out = {"process_read_mb": delta(proc.get("read_bytes", [0] * len(t))) / 1e6,
           "process_write_mb": delta(proc.get("write_bytes", [0] * len(t))) / 1e6,
           "process_read_calls": delta(proc.get("syscr", [0] * len(t))),
           "disk_read_mb": sum(delta(d["read_sectors"]) for d in disks.values()) * sector / 1e6,
           "disk_write_mb": sum(delta(d["write_sectors"]) for d in disks.values()) * sector / 1e6,
           "disk_reads": sum(delta(d["reads"]) for d in disks.values())}
    out["read_iops"] = out["disk_reads"] / span if span > 0 else 0.0
    out["read_mb_s"] = out["disk_read_mb"] / span if span > 0 else 0.0
    busy = [delta(d["busy_ms"]) / 1e3 / span for d in disks.values()] if span > 0 else []
    out["disk_busy_share"] = min(1.0, max(busy)) if busy else 0.0
    return out


def io_of(profile: Any) -> IoFact | None:
    """The profile's recorded I/O (None in a profile written without it, or where it is absent)."""
    io = profile.io
    return io if io is not None and io.absent is None else None


def read_rates(io: IoFact | None, max_points: int) -> dict[str, list[float]] | None:
    """The disks' read MB/s and read IOPS between readings, for the timeline: {t_s (each interval's start, then the
    last reading), mb_s, iops}, consecutive intervals pooled so at most max_points remain. None without readings. Pure."""
    if io is None or len(io.t_s) < 2:
        return None
    t = io.t_s
    disks = io.disks.values()
    sector = io.sector_bytes
    step = max(1, -(-(len(t) - 1) // max(1, max_points)))
    out: dict[str, list[float]] = {"t_s": [], "mb_s": [], "iops": []}
    def moved(series: list[int], a: int, b: int) -> int:  # a short series (a disk gone) holds its last value
        if not series:
            return 0
        return max(0, series[min(b, len(series) - 1)] - series[min(a, len(series) - 1)])

    for a in range(0, len(t) - 1, step):
        b = min(a + step, len(t) - 1)
        dt = t[b] - t[a]
        sectors = sum(moved(d["read_sectors"], a, b) for d in disks)
        reads = sum(moved(d["reads"], a, b) for d in disks)
        out["t_s"].append(t[a])
        out["mb_s"].append(sectors * sector / 1e6 / dt if dt > 0 else 0.0)
        out["iops"].append(reads / dt if dt > 0 else 0.0)
    out["t_s"].append(t[-1])
    return out
