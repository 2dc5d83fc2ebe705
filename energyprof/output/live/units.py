"""Live export of web requests: a counter per route, not a point per request.

A busy service ends hundreds of requests a second; a point per request would flood the live export's
bounded buffers. Each request window, once charged, is added to its route's totals instead, and the
totals go out with the figures (Prometheus base units, `_total` on counters, as Kepler and Zeus name
theirs). A request's joules are those of the samples that ran it, the report's requests table's figure
(core/window_parts.py), so the routes' counters add up to at most the program's energy however the
requests overlapped:

    energyprof_request_energy_joules_total{route, source, method}  the program's joules in the route's
                                                                   requests so far, per source
    energyprof_requests_total{route}                               the route's requests so far

In InfluxDB both are fields of the `energyprof` measurement, tagged with `route` (and the source for the
energy), the pushgateway's metric names being `<measurement>_<field>` (output/live.py).
"""

from __future__ import annotations

from typing import Any

from ...agent.window_facts import REQUEST_FACT
from .formats import MEASUREMENT, Point

ENERGY = "energyprof_request_energy_joules_total"
COUNT = "energyprof_requests_total"


class RequestCounters:
    """Each route's requests and joules so far, from the windows the ledger charged."""

    def __init__(self) -> None:
        self.joules: dict[str, dict[str, float]] = {}  # route -> source -> J
        self.count: dict[str, int] = {}
        self._changed: set[str] = set()

    def add(self, account: Any, policy: str) -> bool:
        """Count a charged window (a WindowAccount) if it is a request; whether it was."""
        if dict(account.loop).get(REQUEST_FACT) != 1.0:
            return False
        route = str(account.name)
        per = self.joules.setdefault(route, {})
        for sid, j in account.program(policy).items():
            per[sid] = per.get(sid, 0.0) + j
        self.count[route] = self.count.get(route, 0) + 1
        self._changed.add(route)
        return True

    def points(self, export: Any, t_ns: int) -> list[Point]:
        """The totals of the routes that changed since the last call, as points at wall time `t_ns`."""
        out = []
        for route in sorted(self._changed):
            for sid, j in self.joules[route].items():
                out.append(Point(MEASUREMENT, export.tags(sid, route=route), {ENERGY: j}, t_ns))
            tags = {k: v for k, v in export.tags("").items() if v}  # host and run: a count is no source's
            out.append(Point(MEASUREMENT, {**tags, "route": route}, {COUNT: float(self.count[route])}, t_ns))
        self._changed.clear()
        return out
