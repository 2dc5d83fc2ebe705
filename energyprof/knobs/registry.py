"""Every knob this machine has, and the `KIND[:INDEX]=VALUES` specs of `--knob` and `--grid`.

A spec's values are `low:high:step` (high included when a step lands on it) or `a,b,c`. A kind
without an index means every knob of that kind (`cpu_max_freq` means `cpu_max_freq:all`).
"""

from __future__ import annotations

import math
from typing import Any

from ..record import record
from .base import Knob, KnobError

KINDS = ("gpu_power_limit", "cpu_power_limit", "cpu_max_freq", "jetson_power_mode")
MAX_VALUES = 1000  # a typo like 1:1000000:1 is a mistake, not a sweep


@record(frozen=True)
class Spec:
    kind: str
    index: str | None
    values: list[float]

    @property
    def name(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def _number(text: str, spec: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise KnobError(f"{spec!r}: {text!r} is not a number") from None
    if not math.isfinite(v):
        raise KnobError(f"{spec!r}: {text!r} is not a finite number")
    return v


def parse_values(text: str, spec: str) -> list[float]:
    if not text:
        raise KnobError(f"{spec!r}: no values after '='")
    if text.count(":") == 2:
        low, high, step = (_number(t, spec) for t in text.split(":"))
        if step <= 0 or high < low:
            raise KnobError(f"{spec!r}: LOW:HIGH:STEP needs LOW <= HIGH and STEP > 0")
        count = int(math.floor((high - low) / step + 1e-9)) + 1
        if count > MAX_VALUES:
            raise KnobError(f"{spec!r}: {count} values, more than {MAX_VALUES}")
        return [round(low + i * step, 9) for i in range(count)]
    if ":" in text:
        raise KnobError(f"{spec!r}: values are LOW:HIGH:STEP or A,B,C")
    return [_number(t.strip(), spec) for t in text.split(",")]


def parse_spec(text: str) -> Spec:
    """`gpu_power_limit=100:250:25`, `cpu_max_freq:3=1200000,2400000` -> Spec."""
    name, eq, values = text.partition("=")
    if not eq:
        raise KnobError(f"{text!r}: a knob is KIND=VALUES, e.g. gpu_power_limit=100:250:25")
    kind, _, index = name.strip().partition(":")
    if kind not in KINDS:
        raise KnobError(f"{text!r}: unknown knob {kind!r} (known: {', '.join(KINDS)})")
    return Spec(kind, index or None, parse_values(values.strip(), text))


def _nvml_knobs(nvml: Any) -> list[Knob]:
    try:
        from . import nvml as nvml_knob  # type: ignore[attr-defined]
    except ImportError:  # the NVIDIA knob lives in its own module, which a build may lack
        return []
    return list(nvml_knob.discover(nvml) if nvml is not None else nvml_knob.discover())


def discover(powercap_root: str | None = None, cpufreq_root: str | None = None, amdsmi: Any = None,
             nvml: Any = None, kinds: tuple[str, ...] = KINDS) -> list[Knob]:
    """The knobs found (none is an error: a machine may have none); `kinds` limits the search, so a run
    that sets only the CPU's frequency never loads a GPU library."""
    found: list[Knob] = []
    if "gpu_power_limit" in kinds:
        found += _nvml_knobs(nvml)
        from . import amdsmi as amd

        found += amd.discover(amdsmi)
    if "cpu_power_limit" in kinds:
        from . import rapl

        found += rapl.discover(powercap_root)
    if "cpu_max_freq" in kinds:
        from . import cpufreq

        found += cpufreq.discover(cpufreq_root)
    if "jetson_power_mode" in kinds:
        from . import nvpmodel

        found += nvpmodel.discover()
    return found


def select(knobs: list[Knob], spec: Spec) -> list[Knob]:
    """The knobs a spec names, or a one-line KnobError naming those there are."""
    of_kind = [k for k in knobs if k.kind == spec.kind]
    if spec.index is not None:
        chosen = [k for k in of_kind if k.index == spec.index]
    else:
        chosen = [k for k in of_kind if k.index == "all"] or of_kind
    if not chosen:
        there = ", ".join(k.name for k in of_kind) or "none on this machine"
        raise KnobError(f"no knob {spec.name} (there are: {there})")
    return chosen


def resolve(specs: list[Spec], knobs: list[Knob]) -> list[tuple[Spec, list[Knob]]]:
    """Every spec with its knobs, every value checked against their ranges before anything is set."""
    out = []
    for spec in specs:
        chosen = select(knobs, spec)
        for knob in chosen:
            for v in spec.values:
                knob.check(v)
        out.append((spec, chosen))
    return out


def overlap(resolved: list[tuple[Spec, list[Knob]]]) -> str | None:
    """Two specs that write the same part (`cpu_max_freq` and `cpu_max_freq:0` both write CPU 0's file):
    a line naming them, or None. A sweep's axes must be independent."""
    seen: dict[str, str] = {}
    for spec, knobs in resolved:
        for knob in knobs:
            for part in knob.parts():
                other = seen.setdefault(part.key, spec.name)
                if other != spec.name:
                    return f"{other} and {spec.name} set the same knob ({part.key})"
    return None


def find(name: str, **where: Any) -> Knob:
    """The knob named `KIND:INDEX`, found again (the keeper, restoring in another process)."""
    kind = name.partition(":")[0]
    for k in discover(kinds=(kind,), **where):
        if k.name == name:
            return k
    raise KnobError(f"no knob {name}")
