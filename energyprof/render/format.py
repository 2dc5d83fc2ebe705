"""Numbers as a reader sees them, shared by every renderer (console, HTML)."""

from __future__ import annotations


def fmt_energy(j: float | None) -> str:
    """Joules with a prefix readers can compare at a glance (3 significant digits)."""
    if j is None:
        return "\u2013"
    a = abs(j)
    for scale, unit in ((1e3, "kJ"), (1.0, "J"), (1e-3, "mJ"), (1e-6, "\u00b5J")):
        if a >= scale:
            return f"{j / scale:.3g} {unit}"
    return "0 J" if a == 0 else f"{j * 1e9:.3g} nJ"


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "\u2013"
    if s >= 3600:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    if s >= 60:
        return f"{int(s // 60)} min {s % 60:04.1f} s"
    if s >= 1 or s == 0:
        return f"{s:.3g} s"
    return f"{s * 1000:.3g} ms"


def fmt_bytes(b: float | None) -> str:
    if b is None:
        return "\u2013"
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(b) >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{int(b)} B"
