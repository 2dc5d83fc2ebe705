"""The machine's settings as a reader compares them: `a.b.c: value` lines, and the ones two runs record
differently. Pure: collect/settings.py reads them, this only looks at what was recorded."""

from __future__ import annotations

from typing import Any


def flatten(settings: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """`a.b.c: value` lines, for the report and for compare's differences."""
    out: dict[str, str] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                out.update(flatten(v, f"{name}[{i}]."))
        else:
            out[name] = str(value)
    return out


def differences(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """One line per setting that the two runs record differently (a setting only one side recorded
    is a difference too, unless that side recorded no settings at all: a file from before them)."""
    if not a or not b:
        return []
    fa, fb = flatten(a), flatten(b)
    lines = []
    for key in sorted(set(fa) | set(fb)):
        if key.startswith("storage.path"):
            continue  # the same disk under another path is the same storage
        va, vb = fa.get(key, "(not recorded)"), fb.get(key, "(not recorded)")
        if va != vb:
            lines.append(f"{key}: {va} -> {vb}")
    return lines
