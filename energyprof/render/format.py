"""Numbers as a reader sees them (energy, time, bytes, carbon, money), shared by every renderer."""

from __future__ import annotations

import math


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


def fmt_grams(g: float | None) -> str:
    """gCO2eq, in mg below a gram (a short run emits milligrams)."""
    if g is None:
        return "\u2013"
    return f"{g:.3g} g" if g >= 1 or g == 0 else f"{g * 1000:.3g} mg"


def fmt_money(value: float | None, currency: str | None = "") -> str:
    """Money in fixed point with two significant digits below a cent: 0.0000020 EUR, never 2.013e-06.

    Amounts of a cent or more print with cents; below 1e-10 it says so rather than print zeros.
    """
    unit = f" {currency}" if currency else ""
    if value is None:
        return "\u2013"
    a = abs(value)
    if a == 0:
        return f"0.00{unit}"
    if a >= 0.01:
        return f"{value:,.2f}{unit}"
    if a < 1e-10:
        return f"< 0.0000000001{unit}"
    digits = -math.floor(math.log10(a)) + 1
    return f"{value:.{digits}f}{unit}"
