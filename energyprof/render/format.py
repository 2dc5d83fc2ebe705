"""Numbers as a reader sees them (energy, time, bytes, carbon, money), shared by every renderer.

One definition: `UNITS` is the table of units and thresholds and `DIGITS` the significant digits;
the console and the HTML template format with the functions below, and the page's script gets the
same table as JSON (`format_spec()`) and runs the same algorithm on it (report.js `fmt`), so
3,700 s reads "1 h 02 min" everywhere. Rounding is half-up on the exact binary value in both
languages (JavaScript's toPrecision rule), so they agree digit for digit.
"""

from __future__ import annotations

import math
from typing import Any

DASH = "\u2013"
DIGITS = 3

# kind -> [(scale, unit), ...] largest first; a value takes the first unit it reaches (after
# rounding, so 999.7 J is "1 kJ"), and the last one below that.
UNITS: dict[str, list[tuple[float, str]]] = {
    "energy": [(1e9, "GJ"), (1e6, "MJ"), (1e3, "kJ"), (1.0, "J"), (1e-3, "mJ"), (1e-6, "\u00b5J"), (1e-9, "nJ")],
    "power": [(1e6, "MW"), (1e3, "kW"), (1.0, "W"), (1e-3, "mW")],
    "bytes": [(2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"), (1.0, "B")],
    "grams": [(1e6, "t"), (1e3, "kg"), (1.0, "g"), (1e-3, "mg"), (1e-6, "\u00b5g")],
    # seconds below a minute; a minute and more prints as "m min ss s" and an hour as "h h mm min"
    "seconds": [(1.0, "s"), (1e-3, "ms"), (1e-6, "\u00b5s"), (1e-9, "ns")],
}


def sig(x: float, digits: int = DIGITS) -> str:
    """x to `digits` significant digits in fixed point, trailing zeros dropped (half-up rounding)."""
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    # The float's exact value as a fraction, rounded half-up in integers: what decimal's quantize gives,
    # without importing decimal (1.5 ms of every run's start).
    n, d = abs(x).as_integer_ratio()
    e = math.floor(math.log10(abs(x)))  # the leading digit's place, corrected where log10 rounds across a power
    if _below(n, d, e):
        e -= 1
    elif not _below(n, d, e + 1):
        e += 1
    k = e - digits + 1  # the place of the last digit kept
    num, den = (n, d * 10**k) if k >= 0 else (n * 10**-k, d)
    r = (2 * num + den) // (2 * den)
    if k >= 0:
        return sign + str(r) + "0" * k
    s = str(r).rjust(1 - k, "0")
    s = (s[:k] + "." + s[k:]).rstrip("0").rstrip(".")
    return sign + s


def _below(n: int, d: int, e: int) -> bool:
    """n / d < 10**e, exactly."""
    return n < d * 10**e if e >= 0 else n * 10**-e < d


def _scaled(x: float, kind: str) -> str:
    units = UNITS[kind]
    a = abs(x)
    if a == 0:
        return f"0 {units[0][1] if kind == 'seconds' else _zero_unit(kind)}"
    for k, (scale, unit) in enumerate(units):
        if a >= scale or k == len(units) - 1:
            s = sig(x / scale)
            if k > 0 and s.lstrip("-") == "1000":  # rounded up into the next unit
                scale, unit = units[k - 1]
                s = sig(x / scale)
            return f"{s} {unit}"
    raise AssertionError("unreachable")


def _zero_unit(kind: str) -> str:
    return {"energy": "J", "power": "W", "bytes": "B", "grams": "g"}[kind]


def half_up(x: float) -> int:
    return math.floor(x + 0.5)


def fmt_energy(j: float | None) -> str:
    return DASH if j is None else _scaled(j, "energy")


def fmt_power(w: float | None) -> str:
    return DASH if w is None else _scaled(w, "power")


def fmt_bytes(b: float | None) -> str:
    return DASH if b is None else _scaled(b, "bytes")


def fmt_grams(g: float | None) -> str:
    """gCO2eq, in mg below a gram (a short run emits milligrams)."""
    return DASH if g is None else _scaled(g, "grams")


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return DASH
    if abs(s) >= 59.5:
        if abs(s) >= 3570:  # 59.5 min rounds to an hour
            m = half_up(abs(s) / 60)
            return f"{'-' if s < 0 else ''}{m // 60} h {m % 60:02d} min"
        t = half_up(abs(s))
        return f"{'-' if s < 0 else ''}{t // 60} min {t % 60:02d} s"
    return _scaled(s, "seconds")


def fmt_percent(part: float, whole: float) -> str:
    """A share with one decimal (half-up); '–' when the whole is zero."""
    if not whole:
        return DASH
    return f"{half_up(part / whole * 1000) / 10:.1f}%"


def fmt_error(relative: float | None) -> str:
    """A relative error as the console and the page put it after a figure: " ±12%" ("" when unknown)."""
    return "" if relative is None else f" \u00b1{half_up(relative * 100)}%"


def fmt_money(value: float | None, currency: str | None = "") -> str:
    """Money in fixed point with two significant digits below a cent: 0.0000020 EUR, never 2.013e-06.

    Amounts of a cent or more print with cents; below 1e-10 it says so rather than print zeros.
    """
    unit = f" {currency}" if currency else ""
    if value is None:
        return DASH
    a = abs(value)
    if a == 0:
        return f"0.00{unit}"
    if a >= 0.01:
        return f"{value:,.2f}{unit}"
    if a < 1e-10:
        return f"< 0.0000000001{unit}"
    digits = -math.floor(math.log10(a)) + 1
    return f"{value:.{digits}f}{unit}"


def format_spec() -> dict[str, Any]:
    """The table the page's script formats with (the same one the functions above use)."""
    return {"digits": DIGITS, "units": {k: [[s, u] for s, u in v] for k, v in UNITS.items()}}


#: How a source's joules came about (a source's `tier`), in the reader's words.
TIER_TEXT = {"counter": "hardware energy counter", "integrated": "power samples integrated over time",
             "model": "model estimate"}


def source_how(source: Any) -> str:
    """`sensor, tier, every N s`: what read a source, how, and how often the hardware refreshes it;
    each word once ("model estimate", not "model, model estimate")."""
    how = TIER_TEXT.get(source.tier_or_guess, source.tier_or_guess)
    replayed = source.sensor == "replay"
    origin = (source.detail or {}).get("recorded_with", "") if replayed and isinstance(source.detail, dict) \
        else source.sensor
    if origin and origin in how.split():
        parts = [("replayed " if replayed else "") + how]
    else:
        parts = [source.sensor_text, how]
    if source.update_period_s:
        parts.append(f"every {sig(source.update_period_s)} s")
    return ", ".join(parts)


_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;"})


def esc(value: object) -> str:
    """Text for an element or a quoted attribute of the page."""
    return str(value).translate(_ESCAPES)
