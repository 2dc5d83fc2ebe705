"""Carbon and cost: joules times PUE times grid intensity, and joules times a price.

Arithmetic on a finished `Profile` and an `Intensity` (intensity.py holds where figures come from).
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .options import Options
    from .profile import Profile


from .intensity import (J_PER_KWH, PER_NODE_TRACE, WORLD_AVERAGE_G_PER_KWH, WORLD_AVERAGE_SCOPE,
                        WORLD_AVERAGE_SOURCE, Intensity, IntensityTrace, _parse_time, load_trace, lookup)


def _kwh(energy_j: dict[str, float]) -> dict[str, float]:
    return {sid: float(j) / J_PER_KWH for sid, j in energy_j.items()}


def _started_at(profile: Profile) -> float | None:
    text = profile.meta.get("started_at")
    if not isinstance(text, str):
        return None
    try:
        return _parse_time(text)
    except ValueError:
        return None


def _buckets(profile: Profile) -> list[tuple[float, float, dict[str, float]]]:
    """(start_s, end_s, {source: joules}) per timeline bucket, from the exported mean power."""
    tl = profile.timeline or {}
    mids = tl.get("t_s") or []
    starts = tl.get("start_s") or mids
    ends = tl.get("end_s") or mids
    power = tl.get("power_w") or {}
    out = []
    for k in range(len(mids)):
        a, b = float(starts[k]), float(ends[k])
        span = max(b - a, 1e-9)  # the ledger exports joules / max(span, 1 ns)
        out.append((a, b, {sid: float(w[k]) * span for sid, w in power.items() if k < len(w)}))
    return out


def _trace_weights(profile: Profile, buckets: list[tuple[float, float, dict[str, float]]], trace: IntensityTrace,
                   t0: float) -> tuple[dict[str, float], float, float]:
    """Per-source energy-weighted mean intensity over the timeline, plus total grams and kWh
    of the timeline itself (before PUE)."""
    num: dict[str, float] = {}
    den: dict[str, float] = {}
    for a, b, energy in buckets:
        g = trace.mean(t0 + a, t0 + b)
        for sid, j in energy.items():
            kwh = j / J_PER_KWH
            num[sid] = num.get(sid, 0.0) + kwh * g
            den[sid] = den.get(sid, 0.0) + kwh
    mid = t0 + float(profile.totals.get("duration_s", 0.0) or 0.0) / 2
    means = {sid: (num[sid] / den[sid] if den[sid] > 0 else trace.at(mid)) for sid in den}
    return means, sum(num.values()), sum(den.values())


def _window_intensity(buckets: list[tuple[float, float, dict[str, float]]], ends: list[float],
                      window: dict[str, Any], trace: IntensityTrace, t0: float) -> dict[str, float]:
    """Per source: the intensity of the buckets a window overlaps, weighted by overlapped energy
    (power taken as constant within a bucket). `buckets` are in time order."""
    ws, we = float(window.get("start_s", 0.0)), float(window.get("end_s", 0.0))
    num: dict[str, float] = {}
    den: dict[str, float] = {}
    k = bisect.bisect_right(ends, ws)  # the first bucket ending after the window starts
    for a, b, energy in buckets[k:]:
        if a >= we:
            break
        lo, hi = max(a, ws), min(b, we)
        if hi <= lo:
            continue
        frac = (hi - lo) / (b - a) if b > a else 1.0
        g = trace.mean(t0 + lo, t0 + hi)
        for sid, j in energy.items():
            num[sid] = num.get(sid, 0.0) + j * frac * g
            den[sid] = den.get(sid, 0.0) + j * frac
    fallback = trace.mean(t0 + ws, t0 + we)
    return {sid: (num[sid] / den[sid] if den.get(sid, 0.0) > 0 else fallback)
            for sid in set(num) | set(window.get("energy_j", {}))}


def _grams(energy_j: dict[str, float], pue: float, by_source: dict[str, float], default: float) -> float:
    return sum(kwh * pue * by_source.get(sid, default) for sid, kwh in _kwh(energy_j).items())


def _cost(energy_j: dict[str, float], pue: float, price: float | None) -> float | None:
    if price is None:
        return None
    return sum(_kwh(energy_j).values()) * pue * price


# Equivalents. Each factor is a published number; `per` is what one unit costs.
EQUIVALENTS: tuple[dict[str, Any], ...] = (
    {"name": "distance driven by an average US passenger car", "unit": "km", "basis": "carbon",
     "per": 8887.0 / 22.0 / 1.609344,  # g CO2 per km
     "source": "US EPA, 'Tailpipe Greenhouse Gas Emissions from a Typical Passenger Vehicle', EPA-420-F-23-014 "
               "(June 2023): 8,887 g CO2 per gallon of gasoline at 22.0 mpg = 404 g/mile = 251 g CO2/km (tailpipe only)"},
    {"name": "distance driven by an average new car sold in Europe in 2023", "unit": "km", "basis": "carbon",
     "per": 106.6,
     "source": "European Environment Agency, provisional 2023 data on CO2 emissions of new passenger cars "
               "(EU, Iceland, Norway): 106.6 g CO2/km, WLTP type-approval (tailpipe only)"},
    {"name": "smartphone full charges", "unit": "charges", "basis": "energy",
     "per": 0.019,  # kWh per charge
     "source": "US EPA, Greenhouse Gas Equivalencies Calculator, Calculations and References, 'Number of "
               "smartphones charged': 0.019 kWh per full charge (a comparison of electricity, not of carbon)"},
)


def equivalents(carbon_g: float, energy_kwh: float) -> list[dict[str, Any]]:
    """Reader-friendly comparisons for the run's total, each with its cited factor."""
    out = []
    for e in EQUIVALENTS:
        amount = carbon_g if e["basis"] == "carbon" else energy_kwh
        out.append({"name": e["name"], "value": amount / e["per"], "unit": e["unit"], "basis": e["basis"],
                    "factor": e["per"], "factor_unit": "gCO2/km" if e["unit"] == "km" else "kWh/charge",
                    "source": e["source"]})
    return out


#: The options that produced a carbon block, saved in it so a re-render can start from them.
#: The trace is not among them: its path means nothing on another machine.
SAVED_OPTIONS = ("country", "region", "cloud", "carbon_intensity", "pue", "price_per_kwh", "currency")


def saved_options(profile: Profile) -> dict[str, Any]:
    """The carbon options a saved profile was rendered with (for `energyprof report`, so that
    `--price-per-kwh` alone keeps the run's PUE and location). Empty for older profiles."""
    block = profile.carbon or {}
    saved = block.get("options") if isinstance(block, dict) else None
    if not isinstance(saved, dict):
        return {}
    return {k: v for k, v in saved.items() if k in SAVED_OPTIONS and v is not None}


def apply(profile: Profile, options: Options) -> None:
    """Set carbon and cost on every node, window and total, and the profile's carbon block.

    Idempotent: every figure is computed from the joules, never from a previous carbon figure,
    so re-rendering with the same or different options gives clean results.
    """
    pue = float(options.pue)
    price = options.price_per_kwh
    notes = [n for n in profile.notes if n.get("kind") != "carbon"]
    trace: IntensityTrace | None = None
    t0 = _started_at(profile)
    fallback: Intensity | None = None
    if options.carbon_intensity_trace is not None:
        try:
            trace = load_trace(options.carbon_intensity_trace)
        except ValueError as exc:
            notes.append({"kind": "carbon", "message": f"{exc}; used the world average instead"})
        if trace is not None and t0 is None:
            notes.append({"kind": "carbon", "message": "the profile has no start time (meta.started_at), so the "
                          "intensity trace cannot be aligned; used the world average instead"})
            trace = None
        if trace is None:
            fallback = Intensity(WORLD_AVERAGE_G_PER_KWH, WORLD_AVERAGE_SOURCE + " (intensity trace unusable)",
                                 WORLD_AVERAGE_SCOPE)
    block: dict[str, Any]
    if trace is not None and t0 is not None:
        buckets = _buckets(profile)
        ends = [b for _, b, _ in buckets]
        by_source, grams, kwh = _trace_weights(profile, buckets, trace, t0)
        mid = t0 + float(profile.totals.get("duration_s", 0.0) or 0.0) / 2
        mean = grams / kwh if kwh > 0 else trace.at(mid)
        default = mean
        run_end = t0 + float(profile.totals.get("duration_s", 0.0) or 0.0)
        if t0 < trace.t[0]:
            notes.append({"kind": "carbon", "message": "the run started before the intensity trace's first row; "
                          "its first value was used for the time before it"})
        if trace.t[-1] < t0 and len(trace.t) > 1:
            notes.append({"kind": "carbon", "message": "the run started after the intensity trace's last row; "
                          "its last value was used throughout"})
        block = {
            "intensity_g_per_kwh": mean, "source": f"time series ({Path(str(options.carbon_intensity_trace)).name})",
            "scope": "as given in the intensity trace; timeline buckets weighted by the step function",
            "time_series": True, "per_node": PER_NODE_TRACE,
            "intensity_by_source_g_per_kwh": by_source,
            "trace": {"rows": len(trace.t), "first": trace.t[0], "last": trace.t[-1],
                      "run_start": t0, "run_end": run_end},
        }
        country, region, cloud = options.country, options.region, options.cloud
    else:
        found = fallback or lookup(options)
        by_source, default = {}, found.g_per_kwh
        block = {"intensity_g_per_kwh": found.g_per_kwh, "source": found.source, "scope": found.scope,
                 "time_series": False}
        country, region, cloud = found.country or options.country, found.region or options.region, \
            found.cloud or options.cloud
    block.update({"country": country, "region": region, "cloud": cloud, "pue": pue,
                  "price_per_kwh": price, "currency": options.currency if price is not None else None})
    block["options"] = {name: getattr(options, name) for name in SAVED_OPTIONS}

    for node, _ in profile.nodes():
        node.carbon_g = _grams(node.energy_j, pue, by_source, default)
        node.cost = _cost(node.energy_j, pue, price)

    totals = profile.totals
    totals["carbon_g"] = _grams(totals.get("energy_j", {}), pue, by_source, default)
    totals["attributed_carbon_g"] = _grams(totals.get("attributed_j", {}), pue, by_source, default)
    for key, energy in (("cost", totals.get("energy_j", {})), ("attributed_cost", totals.get("attributed_j", {}))):
        value = _cost(energy, pue, price)
        if value is None:
            totals.pop(key, None)
        else:
            totals[key] = value

    for window in profile.windows:
        energy = window.get("energy_j", {})
        if trace is not None and t0 is not None:
            window["carbon_g"] = _grams(energy, pue, _window_intensity(buckets, ends, window, trace, t0), default)
        else:
            window["carbon_g"] = _grams(energy, pue, by_source, default)
        value = _cost(energy, pue, price)
        if value is None:
            window.pop("cost", None)
        else:
            window["cost"] = value

    total_kwh = sum(_kwh(totals.get("energy_j", {})).values()) * pue
    block["equivalents"] = equivalents(totals["carbon_g"], total_kwh)
    block["equivalents_basis"] = "totals.carbon_g (all energy measured during the run, times PUE)"
    profile.carbon = block
    profile.notes[:] = notes
