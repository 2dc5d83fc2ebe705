"""The estimate used when no energy counter can be read (cloud VMs, laptops in VMs, CI).

CPU: P = TDP x (IDLE_FRACTION + (1 - IDLE_FRACTION) x u), where u is the busy fraction of
all logical CPUs over the last reading. The TDP comes from `--cpu-tdp`, else codecarbon's
CPU table (read as a file: codecarbon itself is never imported here), else DEFAULT_TDP_W.
RAM: RAM_W_PER_GB x installed GB, constant (codecarbon's long-standing 3 W per 8 GB rule).
Both are labelled *estimated* wherever they appear.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ...carbon import data as carbon_data
from .. import probes
from .base import Discovery, Sensor

IDLE_FRACTION = 0.1
_busy_ns = probes.machine_busy_ns
DEFAULT_TDP_W = 65.0
RAM_W_PER_GB = 0.375


@lru_cache(maxsize=1)
def _cpu_table() -> dict[str, float]:
    """codecarbon's CPU table (hardware/cpu_power.csv): its own file when codecarbon is installed,
    else energyprof's snapshot of it; empty if neither can be read (the default TDP applies)."""
    try:
        rows = carbon_data.active().csv_rows(carbon_data.CPUS)
    except ValueError:
        return {}
    table: dict[str, float] = {}
    for row in rows:
        try:
            table[_normalise(row["Name"])] = float(row["TDP"])
        except (KeyError, TypeError, ValueError):
            continue
    return table


@lru_cache(maxsize=1)
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """Trademark marks and filler words, compiled where a name is matched: a run whose CPU's TDP is in
    the cache (or given) never matches one, and compiling them was a third of this module's import."""
    return re.compile(r"\((r|tm)\)", flags=re.I), re.compile(r"\b(cpu|processor|\d+-core)\b", flags=re.I)


def _normalise(name: str) -> str:
    marks, filler = _patterns()
    name = marks.sub("", name).split("@")[0]
    return " ".join(filler.sub("", name).lower().split())


def lookup_tdp(model: str) -> tuple[float, str] | None:
    """(watts, matched table name) for a CPU model string, or None when not in the table.

    Exact match on the normalised name first, then the longest table name contained in it
    (so "Intel Xeon Gold 6248 CPU @ 2.50GHz" finds "Xeon Gold 6248"); a bare family name
    such as "Intel Xeon Processor" matches nothing rather than a guess.
    """
    table = _cpu_table()
    key = _normalise(model)
    if key in table:
        return table[key], key
    best = None
    for name, tdp in table.items():
        if len(name) >= 6 and any(ch.isdigit() for ch in name) and name in key:
            if best is None or len(name) > len(best[1]):
                best = (tdp, name)
    return best


class CpuModelSensor(Sensor):
    def __init__(self, tdp_w: float, tdp_source: str, cores: int) -> None:
        super().__init__(id="cpu", component="cpu", method="estimated", sensor="model", tier="model",
                         detail={"tdp_w": tdp_w, "tdp_source": tdp_source, "idle_fraction": IDLE_FRACTION,
                                 "logical_cpus": cores,
                                 "formula": "TDP x (idle_fraction + (1 - idle_fraction) x machine CPU utilisation)"})
        self.tdp_w = tdp_w
        self.cores = cores
        self._t = 0
        self._busy = 0
        self._joules = 0.0

    def start(self, t_ns: int) -> None:
        self._t, self._busy, self._joules = t_ns, probes.machine_busy_ns(), 0.0

    def read(self, t_ns: int) -> float:
        # A Monitor window reads this at both edges: comparisons rather than min()/max() calls.
        dt = t_ns - self._t
        if dt > 0:
            busy = _busy_ns()
            u = (busy - self._busy) / (dt * self.cores)
            u = 0.0 if u < 0.0 else 1.0 if u > 1.0 else u
            self._joules += self.tdp_w * (IDLE_FRACTION + (1 - IDLE_FRACTION) * u) * dt / 1e9
            self._t, self._busy = t_ns, busy
        return self._joules


class RamModelSensor(Sensor):
    def __init__(self, total_bytes: int) -> None:
        gb = total_bytes / 1e9
        self.watts = RAM_W_PER_GB * gb
        super().__init__(id="ram", component="ram", method="estimated", sensor="model", tier="model",
                         detail={"installed_gb": round(gb, 2), "w_per_gb": RAM_W_PER_GB, "watts": round(self.watts, 3),
                                 "formula": "0.375 W per GB installed, constant"})
        self._t0 = 0

    def start(self, t_ns: int) -> None:
        self._t0 = t_ns

    def read(self, t_ns: int) -> float:
        return self.watts * (t_ns - self._t0) / 1e9


def _cached_lookup(model: str) -> tuple[float, str] | None:
    """`lookup_tdp`, remembered per CPU model and table file in the user's cache: reading and
    matching the 5,000-row table took about 0.18 s of every run's start."""
    from ...store.cache import load
    from ...store.cache import store

    key = f"{carbon_data.cpu_table_key()}\x1f{model}"
    known = load("tdp.json")
    if key in known:
        hit = known[key]
        return (float(hit[0]), str(hit[1])) if isinstance(hit, list) and len(hit) == 2 else None
    found = lookup_tdp(model)
    known[key] = list(found) if found else None
    store("tdp.json", known)
    return found


def discover(cpu_tdp: float | None = None, want_ram: bool = True) -> Discovery:
    found = Discovery()
    model = probes.cpu_model()
    if cpu_tdp is not None:
        tdp, source = cpu_tdp, "--cpu-tdp"
    else:
        hit = _cached_lookup(model)
        if hit:
            tdp, source = hit[0], f"codecarbon CPU table: {hit[1]}"
        else:
            tdp = DEFAULT_TDP_W
            source = f"default {DEFAULT_TDP_W:g} W ({model!r} is not in codecarbon's CPU table; set --cpu-tdp)"
    found.sensors.append(CpuModelSensor(tdp, source, probes.logical_cpus()))
    if want_ram:
        found.sensors.append(RamModelSensor(probes.total_memory_bytes()))
    found.notes.append(f"model: CPU power estimated from utilisation and TDP {tdp:g} W ({source})")
    return found


def model_for(component: str, cpu_tdp: float | None) -> Sensor | None:
    """The model's sensor for a CPU-class component whose counter counts nothing: the CPU from its TDP
    and utilisation, DRAM from the installed RAM (estimated); None for the whole platform (psys),
    which the model has no figure for."""
    if component == "cpu":
        return discover(cpu_tdp, want_ram=False).sensors[0]
    if component == "dram":
        return RamModelSensor(probes.total_memory_bytes())
    return None
