"""Pure annotations on a finished Profile, shared by the live run and a re-render.

Each function reads the profile's own figures and adds derived ones; none does I/O.
"""

from __future__ import annotations

import statistics
from typing import Any

from .profile import Profile

MIN_UPDATES = 3  # a span shorter than this many sensor updates is below the sensor's resolution


def flag_short_windows(profile: Profile) -> None:
    """Mark windows too short for a source's update period (A100/H100 power: ~100 ms)."""
    periods = {s["id"]: s["update_period_s"] for s in profile.sources if s.get("update_period_s")}
    for w in profile.windows:
        short = [sid for sid, period in periods.items() if w.get("time_s", 0.0) < MIN_UPDATES * period]
        if short:
            w["short_for"] = short
        else:
            w.pop("short_for", None)


def window_groups(profile: Profile) -> list[dict[str, Any]]:
    """Energy per window name: count, mean and spread per window (epochs, steps, phases)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for w in profile.windows:
        groups.setdefault(str(w["name"]), []).append(w)
    out = []
    for name, ws in groups.items():
        energies = [sum(w["energy_j"].values()) for w in ws]
        times = [w["time_s"] for w in ws]
        out.append({
            "name": name, "count": len(ws), "total_j": sum(energies),
            "mean_j": statistics.fmean(energies), "stdev_j": statistics.stdev(energies) if len(ws) > 1 else 0.0,
            "min_j": min(energies), "max_j": max(energies), "mean_time_s": statistics.fmean(times),
            "short": sum(1 for w in ws if w.get("short_for")),
        })
    return out


def training_breakdowns(profile: Profile) -> None:
    """The fetch/compute split for every tracked loader (windows `<name>.compute`)."""
    names = sorted({str(w["name"])[: -len(".compute")] for w in profile.windows
                    if str(w["name"]).endswith(".compute")})
    if not names:
        profile.extra.pop("training", None)
        return
    from .analysis.training import breakdown

    profile.extra["training"] = {name: breakdown(profile, name) for name in names}


def annotate(profile: Profile) -> None:
    flag_short_windows(profile)
    training_breakdowns(profile)
