"""Replay a recorded power trace: exact answers for tests, an external meter's log for users.

CSV: header `t_s,<source>,<source>...`, watts, `t_s` in seconds from the start of profiling.
Each row's power holds until the next row; the last row holds until the end; before the
first row the power is zero.

Lines starting with `#` are comments. `energyprof sensors record` writes one per column,
`# column cpu: method=estimated sensor=model tier=model`, so that a recorded estimate replays
as an estimate: a figure never becomes "measured" by passing through a file. A column no such
line names is an external meter's, measured.
"""

from __future__ import annotations

import bisect
import csv
import math
import re
from pathlib import Path

from ...record import field, record
from .base import Discovery, Sensor

COMPONENTS = {"cpu", "dram", "ram", "psys"}
#: the comment that names how a column was recorded (written by `trace_header`)
_ORIGIN = re.compile(r"#\s*column\s+(?P<column>\S+?):(?:\s+(?P<pairs>.*))?$")
METHODS = ("measured", "estimated")


class TraceError(ValueError):
    pass


@record(frozen=True)
class PowerTrace:
    columns: list[str]
    t_s: list[float]
    watts: dict[str, list[float]]
    cumulative: dict[str, list[float]]  # joules at each t_s
    #: column -> how it was recorded ({"method", "sensor", "tier"}), from the trace's comments;
    #: absent for a column an external meter wrote
    origin: dict[str, dict[str, str]] = field(default_factory=dict)

    def energy_at(self, column: str, t_s: float) -> float:
        """Joules from time 0 to t_s: exact for piecewise-constant power."""
        ts = self.t_s
        if not ts or t_s <= ts[0]:
            return 0.0
        k = bisect.bisect_right(ts, t_s) - 1
        return self.cumulative[column][k] + self.watts[column][k] * (t_s - ts[k])


def load_trace(path: str | Path) -> PowerTrace:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except OSError as exc:
        raise TraceError(f"cannot read power trace {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"power trace {path} is not a text CSV file") from None
    comments = [",".join(r).strip() for r in rows if r and r[0].lstrip().startswith("#")]
    rows = [r for r in rows if r and any(c.strip() for c in r) and not r[0].lstrip().startswith("#")]
    if not rows:
        raise TraceError(f"power trace {path} is empty")
    header = [h.strip() for h in rows[0]]
    if header[0] != "t_s" or len(header) < 2:
        raise TraceError(f"power trace {path}: the header must be t_s followed by one column per source (e.g. t_s,cpu,dram)")
    columns = header[1:]
    if len(set(columns)) != len(columns) or any(not c for c in columns):
        raise TraceError(f"power trace {path}: source columns must be named and unique")
    t_s: list[float] = []
    watts: dict[str, list[float]] = {c: [] for c in columns}
    for lineno, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise TraceError(f"power trace {path} line {lineno}: expected {len(header)} values, got {len(row)}")
        try:
            values = [float(v) for v in row]
        except ValueError:
            raise TraceError(f"power trace {path} line {lineno}: not a number") from None
        if any(not math.isfinite(v) for v in values) or any(v < 0 for v in values[1:]):
            raise TraceError(f"power trace {path} line {lineno}: values must be finite and power >= 0")
        if t_s and values[0] <= t_s[-1]:
            raise TraceError(f"power trace {path} line {lineno}: t_s must increase")
        t_s.append(values[0])
        for c, v in zip(columns, values[1:]):
            watts[c].append(v)
    if not t_s:
        raise TraceError(f"power trace {path} has a header but no rows")
    cumulative: dict[str, list[float]] = {}
    for c in columns:
        acc, out = 0.0, []
        for k, t in enumerate(t_s):
            if k:
                acc += watts[c][k - 1] * (t - t_s[k - 1])
            out.append(acc)
        cumulative[c] = out
    return PowerTrace(columns, t_s, watts, cumulative, _origins(path, comments, columns))


def trace_header(sources: list[dict[str, str]]) -> list[str]:
    """The comment lines that keep each recorded column's method, sensor and tier with its watts."""
    lines = ["# energyprof power trace: each column's method and sensor when it was recorded"]
    for s in sources:
        pairs = " ".join(f"{k}={s[k]}" for k in ("method", "sensor", "tier") if s.get(k))
        lines.append(f"# column {s['id']}: {pairs}")
    return lines


def _origins(path: str | Path, comments: list[str], columns: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for line in comments:
        m = _ORIGIN.match(line)
        if not m:
            continue
        column = m["column"]
        if column not in columns:
            raise TraceError(f"power trace {path}: a comment names column {column}, which the header lacks")
        pairs = dict(p.split("=", 1) for p in (m["pairs"] or "").split() if "=" in p)
        if pairs.get("method") not in METHODS:
            raise TraceError(f"power trace {path}: column {column}'s method must be measured or estimated, "
                             f"not {pairs.get('method')!r}")
        out[column] = {k: pairs[k] for k in ("method", "sensor", "tier") if pairs.get(k)}
    return out


class ReplaySensor(Sensor):
    def __init__(self, trace: PowerTrace, column: str, path: str) -> None:
        component = column.split(":")[0] if column.split(":")[0] in COMPONENTS | {"gpu"} else column
        if component == "gpu":
            component = column if ":" in column else "gpu:0"
        origin = trace.origin.get(column, {})
        # A recorded model stays a model; anything else replays as interval means held constant.
        tier = "model" if origin.get("tier") == "model" else "integrated"
        detail: dict[str, object] = {"trace": str(path), "rows": len(trace.t_s),
                                     "recorded_with": origin.get("sensor", "external meter")}
        super().__init__(id=column, component=component, method=origin.get("method", "measured"), sensor="replay",
                         tier=tier, detail=detail)
        self.trace = trace
        self.column = column
        self._t0 = 0

    def start(self, t_ns: int) -> None:
        self._t0 = t_ns

    def read(self, t_ns: int) -> float:
        return self.trace.energy_at(self.column, (t_ns - self._t0) / 1e9)


def discover(path: str) -> Discovery:
    trace = load_trace(path)
    found = Discovery([ReplaySensor(trace, c, path) for c in trace.columns])
    found.notes.append(f"replay: power from {path} ({len(trace.t_s)} rows); other sensors are not read")
    estimated = [c for c in trace.columns if trace.origin.get(c, {}).get("method") == "estimated"]
    if estimated:
        found.notes.append(f"replay: {', '.join(estimated)} were estimated when recorded, and stay estimated")
    return found
