"""Measurement: what a window (or the run so far) spent, handed to the code that asked. Pure.

Filled once, when the block ends: the machine's energy per source, the program's part of it,
their totals, the program's carbon, and two honesty flags: `estimated` (a source's figures came
from a model, not a counter) and `complete` (every joule of the window was in when it was read).
"""

from __future__ import annotations

import _thread
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..record import field, record

if TYPE_CHECKING:
    from .policy import IdlePolicy, WindowAccount

# Nothing here imports at module level beyond energyprof.record (which imports only built-in modules)
# and _thread (built in): a supervised program's process loads this module, and an import made there
# could pick up the program's own modules.


@record
class Measurement:
    """One window's figures. `energy_j` and `program_energy_j` are {source: joules}, or None where
    nothing could be measured (a supervised program's agent has no ledger: time only)."""

    name: str = ""
    index: int | None = None
    time_s: float = 0.0
    energy_j: dict[str, float] | None = field(default_factory=dict)
    program_energy_j: dict[str, float] | None = field(default_factory=dict)
    intensity_g_per_kwh: float | None = None  # None: not priced (no energy to price)
    pue: float = 1.0
    estimated: bool = False
    complete: bool = True
    note: str = ""

    def defer(self, fill: Callable[[Measurement], None]) -> None:
        """Have `fill` complete this Measurement on the first read of any of its figures: a window
        whose figures nobody reads never waits for them. A read from another thread while it
        fills waits for the whole (re-entrant: `fill` may read what it has set)."""
        d = self.__dict__
        d["_fill"] = fill
        d["_filling"] = _thread.RLock()

    def __getattribute__(self, name: str) -> Any:
        if name[0] != "_":
            d = object.__getattribute__(self, "__dict__")
            lock = d.get("_filling")
            if lock is not None:
                with lock:
                    fill = d.pop("_fill", None)
                    if fill is not None:
                        try:
                            fill(self)
                        finally:
                            d.pop("_filling", None)
        return object.__getattribute__(self, name)

    @property
    def total_j(self) -> float | None:
        """The machine's energy over the window, all sources."""
        return None if self.energy_j is None else sum(self.energy_j.values())

    @property
    def program_total_j(self) -> float | None:
        """The program's part of it, all sources."""
        return None if self.program_energy_j is None else sum(self.program_energy_j.values())

    @property
    def carbon_g(self) -> float | None:
        """The program's emissions: its energy x PUE x grid intensity."""
        total = self.program_total_j
        if total is None or self.intensity_g_per_kwh is None:
            return None
        return carbon_grams(total, self.intensity_g_per_kwh, self.pue)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "index": self.index, "time_s": self.time_s, "energy_j": self.energy_j,
                "program_energy_j": self.program_energy_j, "total_j": self.total_j,
                "program_total_j": self.program_total_j, "carbon_g": self.carbon_g, "estimated": self.estimated,
                "complete": self.complete, **({"note": self.note} if self.note else {})}


def fill_from_account(m: Measurement, account: WindowAccount, policy: IdlePolicy, intensity_g_per_kwh: float | None,
                      pue: float) -> Measurement:
    """`m` filled with one window's account under the run's policy: the one way a driver (the
    Profiler, the Monitor) turns a window's figures into the Measurement the program reads."""
    m.name, m.index, m.time_s = account.name, account.index, account.time_s
    m.energy_j, m.program_energy_j = account.machine(), account.program(policy)
    m.estimated, m.complete, m.intensity_g_per_kwh, m.pue = account.estimated, account.done, intensity_g_per_kwh, pue
    return m


def carbon_grams(energy_j: float, intensity_g_per_kwh: float, pue: float = 1.0) -> float:
    from ..carbon.intensity import J_PER_KWH

    return energy_j / J_PER_KWH * pue * intensity_g_per_kwh


def any_estimated(sources: Iterable[dict[str, Any]]) -> bool:
    return any(s.get("method") == "estimated" for s in sources)


def carbon_setting(options: Any) -> tuple[float, float]:
    """(g/kWh, PUE) a live Measurement prices energy at: the run's fixed intensity setting (a
    country, region, cloud or number), the world average when none is given. An intensity time
    series is applied to the saved profile only."""
    from ..carbon.intensity import WORLD_AVERAGE_G_PER_KWH
    from ..carbon.intensity import lookup

    try:
        g = lookup(options).g_per_kwh
    except Exception:  # noqa: BLE001 - options are validated before a run; never fail a window
        g = WORLD_AVERAGE_G_PER_KWH
    return float(g), float(getattr(options, "pue", None) or 1.0)
