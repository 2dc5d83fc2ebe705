"""Carbon and cost arithmetic: joules x PUE x grid intensity, and joules x PUE x price. Pure.

One formula for the program's energy (the headline) and the machine's (beside it). Where the
intensity comes from (a country, a region, a time series) is resolved before this, by intensity.py.
"""

from __future__ import annotations

import bisect
from typing import Any

from ..record import field, record
from ..carbon.intensity import (J_PER_KWH, PER_NODE_TRACE, WORLD_AVERAGE_G_PER_KWH, WORLD_AVERAGE_SCOPE,
                         WORLD_AVERAGE_SOURCE, Intensity, IntensityTrace, _parse_time)
from ..facts.profile import Profile
from ..facts.profile import Window

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


@record(frozen=True)
class CarbonSettings:
    """Resolved render options for carbon and cost: a fixed intensity or a time series (already read)."""

    intensity: Intensity = Intensity(WORLD_AVERAGE_G_PER_KWH, WORLD_AVERAGE_SOURCE, WORLD_AVERAGE_SCOPE)
    trace: IntensityTrace | None = None
    trace_name: str = ""
    pue: float = 1.0
    price_per_kwh: float | None = None
    currency: str = "EUR"


@record
class CarbonFigures:
    """Carbon and cost of one run under one set of settings; `grams`/`cost` price any energy dict."""

    intensity_g_per_kwh: float
    source: str
    scope: str
    country: str | None
    region: str | None
    cloud: str | None
    pue: float
    time_series: bool
    by_source: dict[str, float]  # g/kWh per source (a time series weights each source differently)
    default_g_per_kwh: float
    price_per_kwh: float | None
    currency: str | None
    program_g: float = 0.0  # the headline: the program's attributed energy
    machine_g: float = 0.0  # everything the sensors measured
    program_cost: float | None = None
    machine_cost: float | None = None
    equivalents: list[dict[str, Any]] = field(default_factory=list)
    trace: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def grams(self, energy_j: dict[str, float], by_source: dict[str, float] | None = None) -> float:
        table = self.by_source if by_source is None else by_source
        return sum(j / J_PER_KWH * self.pue * table.get(sid, self.default_g_per_kwh) for sid, j in energy_j.items())

    def cost(self, energy_j: dict[str, float]) -> float | None:
        if self.price_per_kwh is None:
            return None
        return sum(energy_j.values()) / J_PER_KWH * self.pue * self.price_per_kwh

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def equivalents(carbon_g: float, energy_kwh: float) -> list[dict[str, Any]]:
    """Reader-friendly comparisons, each with its cited factor."""
    out = []
    for e in EQUIVALENTS:
        amount = carbon_g if e["basis"] == "carbon" else energy_kwh
        out.append({"name": e["name"], "value": amount / e["per"], "unit": e["unit"], "basis": e["basis"],
                    "factor": e["per"], "factor_unit": "gCO2/km" if e["unit"] == "km" else "kWh/charge",
                    "source": e["source"]})
    return out


def started_at(profile: Profile) -> float | None:
    text = profile.meta.get("started_at")
    if not isinstance(text, str):
        return None
    try:
        return _parse_time(text)
    except ValueError:
        return None


Bucket = tuple[float, float, dict[str, float]]


def buckets(profile: Profile) -> list[Bucket]:
    """(start_s, end_s, {source: joules}) per timeline bucket, from the exported mean power."""
    tl = profile.timeline
    mids = tl.t_s
    starts = tl.start_s or mids
    ends = tl.end_s or mids
    out = []
    for k in range(len(mids)):
        a, b = float(starts[k]), float(ends[k])
        span = max(b - a, 1e-9)  # the ledger exports joules / max(span, 1 ns)
        out.append((a, b, {sid: float(w[k]) * span for sid, w in tl.power_w.items() if k < len(w)}))
    return out


def _trace_weights(bks: list[Bucket], trace: IntensityTrace, t0: float, mid: float) -> tuple[dict[str, float], float]:
    """Per-source energy-weighted mean intensity over the timeline, and the overall mean."""
    num: dict[str, float] = {}
    den: dict[str, float] = {}
    for a, b, energy in bks:
        g = trace.mean(t0 + a, t0 + b)
        for sid, j in energy.items():
            num[sid] = num.get(sid, 0.0) + j * g
            den[sid] = den.get(sid, 0.0) + j
    means = {sid: (num[sid] / den[sid] if den[sid] > 0 else trace.at(mid)) for sid in den}
    total = sum(den.values())
    return means, (sum(num.values()) / total if total > 0 else trace.at(mid))


def window_intensity(bks: list[Bucket], window: Window, trace: IntensityTrace, t0: float) -> dict[str, float]:
    """Per source: the intensity of the buckets a window overlaps, weighted by overlapped energy
    (power taken as constant within a bucket). `bks` are in time order."""
    ws, we = window.start_s, window.end_s
    num: dict[str, float] = {}
    den: dict[str, float] = {}
    k = bisect.bisect_right([b for _, b, _ in bks], ws)  # the first bucket ending after the window starts
    for a, b, energy in bks[k:]:
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
    return {sid: (num[sid] / den[sid] if den.get(sid, 0.0) > 0 else fallback) for sid in set(num) | set(window.energy_j)}


def carbon(profile: Profile, settings: CarbonSettings) -> CarbonFigures:
    """The run's carbon and cost: the program's figures first, the machine's beside them."""
    notes: list[str] = []
    duration = profile.totals.duration_s
    trace = settings.trace
    found = settings.intensity
    t0 = started_at(profile) if trace is not None else None  # the start time aligns a trace, and nothing else
    if trace is not None and t0 is None:
        notes.append("the profile has no start time (meta.started_at), so the intensity trace cannot be aligned; "
                     "used the world average instead")
        trace = None
        found = Intensity(WORLD_AVERAGE_G_PER_KWH, WORLD_AVERAGE_SOURCE + " (intensity trace unusable)",
                          WORLD_AVERAGE_SCOPE)
    if trace is not None and t0 is not None:
        by_source, mean = _trace_weights(buckets(profile), trace, t0, t0 + duration / 2)
        if t0 < trace.t[0]:
            notes.append("the run started before the intensity trace's first row; its first value was used for "
                         "the time before it")
        if trace.t[-1] < t0 and len(trace.t) > 1:
            notes.append("the run started after the intensity trace's last row; its last value was used throughout")
        figures = CarbonFigures(mean, f"time series ({settings.trace_name})",
                                "as given in the intensity trace; timeline buckets weighted by the step function",
                                found.country, found.region, found.cloud, settings.pue, True, by_source, mean,
                                settings.price_per_kwh, settings.currency if settings.price_per_kwh is not None else None,
                                trace={"rows": len(trace.t), "first": trace.t[0], "last": trace.t[-1],
                                       "run_start": t0, "run_end": t0 + duration, "per_node": PER_NODE_TRACE})
    else:
        figures = fixed_figures(found, settings)
    t = profile.totals
    figures.program_g = figures.grams(t.attributed_j)
    figures.machine_g = figures.grams(t.energy_j)
    figures.program_cost = figures.cost(t.attributed_j)
    figures.machine_cost = figures.cost(t.energy_j)
    figures.equivalents = equivalents(figures.program_g, sum(t.attributed_j.values()) / J_PER_KWH * settings.pue)
    figures.notes = notes
    return figures


def fixed_figures(found: Intensity, settings: CarbonSettings) -> CarbonFigures:
    """The figures of one intensity for every source (no time series)."""
    return CarbonFigures(found.g_per_kwh, found.source, found.scope, found.country, found.region, found.cloud,
                         settings.pue, False, {}, found.g_per_kwh, settings.price_per_kwh,
                         settings.currency if settings.price_per_kwh is not None else None)


def span_figures(settings: CarbonSettings, start_unix: float, end_unix: float) -> CarbonFigures:
    """The figures that price energy spent over one span of wall time before the run's profile exists (a live
    export's window or run so far): the run's fixed intensity, as `carbon` prices it; with a time series, its
    mean over the span, which is `window_carbon`'s intensity for a window whose power was even over it."""
    trace = settings.trace
    if trace is None:
        return fixed_figures(settings.intensity, settings)
    found = settings.intensity
    figures = fixed_figures(Intensity(trace.mean(start_unix, end_unix), f"time series ({settings.trace_name})",
                                      "the intensity trace's mean over the span", found.country, found.region,
                                      found.cloud), settings)
    figures.time_series = True
    return figures


def window_carbon(profile: Profile, figures: CarbonFigures, settings: CarbonSettings) -> list[float]:
    """Each window's carbon: with a time series, at the intensity of the time it ran."""
    t0 = started_at(profile) if figures.time_series and settings.trace is not None else None
    if t0 is not None and settings.trace is not None:
        bks = buckets(profile)
        return [figures.grams(w.energy_j, window_intensity(bks, w, settings.trace, t0)) for w in profile.windows]
    return [figures.grams(w.energy_j) for w in profile.windows]
