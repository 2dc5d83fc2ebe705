"""A tracked loop's forecast: what it predicted for its epochs, kept as the facts of a zero-length window."""

from __future__ import annotations


from ..record import record
from .records import ProfileFormatError, Window, _Record, number

FORECAST_SUFFIX = ".forecast"  # `<loop>.forecast`, index = epochs done: a zero-length window that carries one


@record
class Forecast(_Record):
    """What a tracked loop predicted, after `epochs_done` of its `epochs` passes, for all of them: the
    program's energy (J), the time (s) and the carbon (g), each with the low and high ends of its
    interval at `confidence` (None: no spread to measure yet). `by_steps`: the interval came from the
    first epoch's steps, not from the epochs' spread. Kept in the profile as the facts of a zero-length
    window (`<loop>.forecast`), so a profile written before forecasts existed simply has none."""

    loop: str
    epochs_done: int
    epochs: int
    made_at_s: float = 0.0
    energy_j: float | None = None
    energy_low_j: float | None = None
    energy_high_j: float | None = None
    time_s: float | None = None
    time_low_s: float | None = None
    time_high_s: float | None = None
    carbon_g: float | None = None
    carbon_low_g: float | None = None
    carbon_high_g: float | None = None
    confidence: float = 0.95
    by_steps: bool = False
    estimated: bool = False


def is_forecast(w: Window) -> bool:
    """A zero-length window that only carries a tracked loop's forecast: a fact, not a span."""
    return w.name.endswith(FORECAST_SUFFIX) and "epochs" in w.loop and "epochs_done" in w.loop


def read_forecast(w: Window) -> Forecast | None:
    """The forecast a `<loop>.forecast` window carries, checked (a profile file can be crafted); None when the
    window is not one, or carries figures no forecast has (a negative energy): the report leaves it out."""
    if not is_forecast(w):
        return None
    try:
        return _forecast(w)
    except ProfileFormatError:
        return None


def _forecast(w: Window) -> Forecast:
    f = w.loop

    def opt(key: str) -> float | None:
        return number(f[key], f"{w.name}.{key}") if key in f else None

    done, total = int(number(f["epochs_done"], f"{w.name}.epochs_done")), int(number(f["epochs"], f"{w.name}.epochs"))
    conf = opt("confidence")
    return Forecast(loop=w.name[: -len(FORECAST_SUFFIX)], epochs_done=done, epochs=total, made_at_s=w.start_s,
                    energy_j=opt("energy_j"), energy_low_j=opt("energy_low_j"), energy_high_j=opt("energy_high_j"),
                    time_s=opt("time_s"), time_low_s=opt("time_low_s"), time_high_s=opt("time_high_s"),
                    carbon_g=opt("carbon_g"), carbon_low_g=opt("carbon_low_g"), carbon_high_g=opt("carbon_high_g"),
                    confidence=conf if conf is not None and 0 < conf < 1 else 0.95,
                    by_steps=bool(f.get("by_steps")), estimated=bool(f.get("estimated")))
