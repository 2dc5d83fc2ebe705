"""The live export's two wire formats: InfluxDB's line protocol and Prometheus's text exposition format.
Pure: a Point in, text out."""

from __future__ import annotations

import math

from ...record import record

MEASUREMENT = "energyprof"


@record
class Point:
    """One point: a measurement, its tags (host, run, source, method, ...), its numeric fields, its wall time (ns)."""

    measurement: str
    tags: dict[str, str]
    fields: dict[str, float]
    t_ns: int


def _escape(text: str, chars: str) -> str:
    out = str(text).replace("\\", "\\\\")
    for c in chars:
        out = out.replace(c, "\\" + c)
    return out.replace("\n", "\\n")


def _number(v: float) -> str:
    return repr(float(v))


def line_protocol(p: Point) -> str:
    """One InfluxDB line: `measurement,tag=v,... field=1.5,... <ns>` (every field a float, non-finite left out)."""
    tags = "".join(f",{_escape(k, ', =')}={_escape(v, ', =')}" for k, v in sorted(p.tags.items()) if v != "")
    fields = ",".join(f"{_escape(k, ', =')}={_number(v)}" for k, v in p.fields.items() if math.isfinite(v))
    return f"{_escape(p.measurement, ', ')}{tags} {fields} {p.t_ns}"


def metric_name(measurement: str, name: str) -> str:
    raw = name if measurement == MEASUREMENT and name.startswith(MEASUREMENT) else f"{measurement}_{name}"
    out = "".join(c if c.isascii() and (c.isalnum() or c in "_:") else "_" for c in raw)
    return out if not out[:1].isdigit() else "_" + out


def _label(name: str) -> str:
    out = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)
    return out if out and not out[0].isdigit() else "_" + out


def exposition(values: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> str:
    """Prometheus text format, every metric a gauge."""
    by_name: dict[str, list[tuple[tuple[tuple[str, str], ...], float]]] = {}
    for (name, labels), v in values.items():
        by_name.setdefault(name, []).append((labels, v))
    lines = []
    for name in sorted(by_name):
        lines.append(f"# TYPE {name} gauge")
        for labels, v in sorted(by_name[name]):
            inner = ",".join(f'{_label(k)}="{_escape(val, chr(34))}"' for k, val in labels)
            value = repr(float(v)) if math.isfinite(v) else ("NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf"))
            lines.append(f"{name}{{{inner}}} {value}" if inner else f"{name} {value}")
    return "\n".join(lines) + "\n"
