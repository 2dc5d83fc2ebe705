"""Live export, the run's side: the run's power and energy while it runs, to InfluxDB and a Prometheus pushgateway,
and MLflow's live window logging, all on threads of energyprof's own.

    python -m energyprof --influx http://HOST:8086/DB train.py         # InfluxDB 1.x, line protocol
    python -m energyprof --influx 'http://HOST:8086?org=ORG&bucket=B'  # 2.x: INFLUX_TOKEN from the environment
    python -m energyprof --pushgateway http://HOST:9091 train.py       # Prometheus pushgateway

What goes out (every point tagged with the host, the run, the source and its `method`, measured or
estimated; carbon is always estimated):
- about once a second, per source: `energyprof` with machine_power_watts, machine_energy_joules,
  program_power_watts, program_energy_joules (energy cumulative since the start, the program's
  under the run's idle policy), as far as the ledger has charged it;
- each window as it is charged: `energyprof_window` (tag `window`: its name) with index, seconds,
  machine_energy_joules, program_energy_joules, machine_carbon_grams, program_carbon_grams;
- at the end, from the finished profile: a last `energyprof` point whose program energy is the
  profile's exactly, and `energyprof_carbon` (machine_grams, program_grams, intensity_g_per_kwh);
- `log_metrics({...})`: figures of the program's (a forecast after each epoch) as `energyprof_metric`.
Carbon is priced by the report's arithmetic (analysis/carbon.py, `CarbonFigures.grams`): the end's from
the finished profile exactly as the report prices it; a window's at the run's intensity, or with an
intensity time series at its mean over the window (the report's figure wherever the window's power was
even over it).
For the pushgateway, a point's field is the metric `<measurement>_<field>` (`energyprof_program_energy_joules`),
pushed (PUT) with every figure so far under /metrics/job/energyprof/instance/<host>/run/<run>.

Never at the program's cost: the collector's tick (energyprof's thread) only appends to a bounded
buffer, and each sink sends from a thread of its own with short socket timeouts. A server that is
slow, refuses or never answers loses points, counted, never time: when the buffer is full the oldest
are dropped, a failing sink rests RETRY_S before it tries again (dropping what comes meanwhile), and
the run's end waits at most FINISH_WAIT_S for everything sinks still hold. Drops are counted per
sink in the profile's `meta.live_export` and said in a note (the console summary prints it; one
line on stderr where no summary is shown). Under `python -m energyprof` all of this runs in the supervisor;
in-process (the decorator, `with energy_profile()`, `Monitor`) on invisible threads whose CPU is
charged to `[energyprof]`. Only the standard library (http.client): no dependency.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from typing import Any, Callable

from ...agent.wire import METRICS_FILE, MLFLOW_RUN_SUFFIX
from ...record import record
from .formats import MEASUREMENT, Point
from .sinks import PERIOD_S, Channel, InfluxSink, Metrics, MlflowSink, PushgatewaySink, WindowBlock

FINISH_WAIT_S = 0.5  # the most the run's end waits for the sinks, all together (a healthy server answers in ms)
METHODS = ("measured", "estimated")
MIN_LAST_SPAN_S = PERIOD_S / 2  # the last point's power is over at least this long (else over the run so far)


@record
class Figures:
    """The run's cumulative energy per source at one wall time (ns): what a point's power is measured from."""

    t_ns: int
    machine: dict[str, float]
    program: dict[str, float]


def reference(history: list[Figures], end_ns: int) -> Figures | None:
    """The figures the last point's power is taken from: the newest at least MIN_LAST_SPAN_S before `end_ns`
    (the oldest where none is), so the last point says the run's last power, not the last few ms' rounding."""
    before = [f for f in history if f.t_ns < end_ns]
    if not before:
        return None
    far = [f for f in before if end_ns - f.t_ns >= MIN_LAST_SPAN_S * 1e9]
    return max(far, key=lambda f: f.t_ns) if far else min(before, key=lambda f: f.t_ns)


_current: LiveExport | None = None


class LiveExport:
    """The run's sinks, one Channel each; what the drivers hand it goes to the sinks that take it."""

    def __init__(self, options: Any, own: Any = None, host: str | None = None, run: str | None = None,
                 started_wall: float | None = None) -> None:
        global _current
        from ...engines.distributed import hostname

        self.host = host or hostname()
        start = started_wall if started_wall is not None else time.time()
        self.run = run or os.environ.get("ENERGYPROF_LIVE_RUN") or (
            time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(start)) + f"-{os.getpid()}")
        self.wall_offset_ns = time.time_ns() - time.perf_counter_ns()
        self.started_wall_ns = int(start * 1e9)
        self.carbon = None  # (g/kWh, PUE) of the Measurements logged to MLflow, set by the driver
        self.pricing = _carbon_settings(options)  # the report's carbon settings: the points' carbon
        self.methods: dict[str, str] = {}  # source id -> measured or estimated, set by whoever feeds the points
        self.points: list[Channel] = []
        self.mlflow: Channel | None = None
        if getattr(options, "influx", None):
            self.points.append(Channel(InfluxSink(options.influx), own))
        if getattr(options, "pushgateway", None):
            self.points.append(Channel(PushgatewaySink(options.pushgateway, self.host, self.run), own))
        if getattr(options, "mlflow", False):
            self.mlflow = Channel(MlflowSink(), own)
        self.source_errors: list[str] = []
        self.point_sources: list[Callable[[int], list[Point]]] = []  # more points, once a period (add_point_source)
        self.finished = False
        _current = self

    def add_point_source(self, source: Callable[[int], list[Point]]) -> None:
        """More points, beside the energy's: `source(wall_ns)` is called once a PERIOD_S on energyprof's thread,
        and at the end, and returns its points (each tagged with `tags`); one that raises is dropped, counted."""
        self.point_sources.append(source)

    def poll_point_sources(self, wall_ns: int) -> None:
        for source in list(self.point_sources):
            try:
                self.emit(source(wall_ns))
            except Exception as exc:  # noqa: BLE001 - another source's figures are never worth the run's
                self.point_sources.remove(source)
                self.source_errors.append(f"{type(exc).__name__}: {exc}")

    @property
    def channels(self) -> list[Channel]:
        return [*self.points, *([self.mlflow] if self.mlflow is not None else [])]

    def tags(self, source: str, method: str | None = None, **more: str) -> dict[str, str]:
        """A point's tags: every point says whether its figures are measured or estimated (a source's own
        method; a forecast's and carbon's, estimated)."""
        method = method or self.methods.get(source) or "measured"
        return {"host": self.host, "run": self.run, "source": source, "method": method, **more}

    def span_carbon(self, start_wall_ns: int, end_wall_ns: int) -> Any:
        """The figures (analysis/carbon.CarbonFigures) pricing energy spent over a span of wall time; None
        where carbon is off."""
        from ...analysis.carbon import CarbonSettings, span_figures

        settings = self.pricing
        if settings is None and self.carbon is not None:  # the driver's own (g/kWh, PUE)
            from ...carbon.intensity import Intensity

            settings = CarbonSettings(intensity=Intensity(self.carbon[0], "the run's setting", ""), pue=self.carbon[1])
        return None if settings is None else span_figures(settings, start_wall_ns / 1e9, end_wall_ns / 1e9)

    def wall_ns(self, perf_ns: int) -> int:
        return perf_ns + self.wall_offset_ns

    def emit(self, points: list[Point]) -> None:
        if points:
            for ch in self.points:
                ch.put(points)

    def window_block(self, m: Any, name: str, index: int | None, program_run: str | None = None) -> None:
        if self.mlflow is not None:
            self.mlflow.put([WindowBlock(m, str(name), index, program_run)])

    def metrics(self, values: dict[str, float], step: int | None = None, program_run: str | None = None,
                method: str = "estimated") -> None:
        clean = {str(k): float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        if not clean:
            return
        t = time.time_ns()
        tags = self.tags("all", method=method if method in METHODS else "estimated")
        if step is not None:
            tags["step"] = str(int(step))
        self.emit([Point(f"{MEASUREMENT}_metric", tags, clean, t)])
        if self.mlflow is not None:
            self.mlflow.put([Metrics(clean, step, t, program_run)])

    # figures --------------------------------------------------------------------------------------
    def source_points(self, t_ns: int, ids: list[str], machine: list[float], program: list[float],
                      power_machine: list[float], power_program: list[float]) -> list[Point]:
        return [Point(MEASUREMENT, self.tags(sid),
                      {"machine_power_watts": pm, "machine_energy_joules": em,
                       "program_power_watts": pp, "program_energy_joules": ep}, t_ns)
                for sid, em, ep, pm, pp in zip(ids, machine, program, power_machine, power_program)]

    def window_points(self, name: str, index: int | None, seconds: float, t_ns: int, machine: dict[str, float],
                      program: dict[str, float]) -> list[Point]:
        """A window's points, one per source, ending at wall time `t_ns`: its energy, and its carbon priced
        as the report prices the window's."""
        fig = self.span_carbon(t_ns - int(seconds * 1e9), t_ns)
        out = []
        for sid, em in machine.items():
            ep = program.get(sid, 0.0)
            fields = {"seconds": seconds, "machine_energy_joules": em, "program_energy_joules": ep}
            if index is not None:
                fields["index"] = float(index)
            if fig is not None:
                fields["machine_carbon_grams"] = fig.grams({sid: em})
                fields["program_carbon_grams"] = fig.grams({sid: ep})
            out.append(Point(f"{MEASUREMENT}_window", self.tags(sid, window=str(name)), fields, t_ns))
        return out

    # the end --------------------------------------------------------------------------------------
    def finish(self, profile: Any = None, history: list[Figures] | None = None, wait_s: float = FINISH_WAIT_S,
               totals: tuple[dict[str, float], dict[str, float]] | None = None, end_ns: int | None = None
               ) -> dict[str, Any]:
        """The last points (from the finished profile: its program energy exactly, and its carbon; or the
        machine's and the program's `totals` per source, as of wall time `end_ns`, else now), their power
        from the `history` of figures sent, then at most `wait_s` for every sink together; returns what
        each sent and dropped (`summary`)."""
        global _current
        if self.finished:
            return self.summary()
        self.finished = True
        if _current is self:
            _current = None
        try:
            fig = None
            if profile is not None:
                t = profile.totals
                totals = ({k: float(v) for k, v in (t.get("energy_j") or {}).items()},
                          {k: float(v) for k, v in (t.get("attributed_j") or {}).items()})
                for s in profile.sources:  # the profile says each source's method, whoever fed the points
                    self.methods.setdefault(s.id, s.method)
                if self.pricing is not None:
                    from ...analysis.carbon import carbon

                    fig = carbon(profile, self.pricing)  # the report's figures, to the last bit
            end = end_ns if end_ns is not None else time.time_ns()
            self.poll_point_sources(end)
            if totals is not None:
                self.emit(self._final_points(*totals, history or [], end, fig))
        finally:
            deadline = time.monotonic() + wait_s
            for ch in self.channels:
                ch.close(deadline)
        return self.summary()

    def _final_points(self, machine: dict[str, float], program: dict[str, float], history: list[Figures],
                      end_ns: int, fig: Any = None) -> list[Point]:
        """The run's last points, at `end_ns`: their power over the run's last stretch (`reference`); their
        carbon priced by `fig` (the profile's CarbonFigures), else over the run's span of wall time."""
        ref = reference([Figures(self.started_wall_ns, {}, {}), *history], end_ns)
        dt = (end_ns - ref.t_ns) / 1e9 if ref is not None else 0.0
        points = []
        if fig is None:
            fig = self.span_carbon(self.started_wall_ns, end_ns)
        for sid in machine:
            em, ep = machine[sid], program.get(sid, 0.0)
            pm = (em - ref.machine.get(sid, 0.0)) / dt if ref is not None and dt > 0 else 0.0
            pp = (ep - ref.program.get(sid, 0.0)) / dt if ref is not None and dt > 0 else 0.0
            points.append(Point(MEASUREMENT, self.tags(sid), {"machine_power_watts": max(0.0, pm), "machine_energy_joules": em,
                                                               "program_power_watts": max(0.0, pp), "program_energy_joules": ep},
                                end_ns))
            if fig is not None:  # carbon: an energy priced at an intensity, which is an estimate
                points.append(Point(f"{MEASUREMENT}_carbon", self.tags(sid, method="estimated"),
                                    {"machine_grams": fig.grams({sid: em}), "program_grams": fig.grams({sid: ep}),
                                     "intensity_g_per_kwh": float(fig.by_source.get(sid, fig.default_g_per_kwh)),
                                     "pue": float(fig.pue)}, end_ns))
        return points

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run, "host": self.host, "sinks": [ch.report() for ch in self.channels]}
        if self.source_errors:
            out["point_source_errors"] = list(self.source_errors)
        return out


def current() -> LiveExport | None:
    """The in-process export running now (None: none, or it has finished)."""
    export = _current
    return export if export is not None and not export.finished else None


def _carbon_settings(options: Any) -> Any:
    """The report's carbon settings of the run's options (output/writer.carbon_settings: the intensity, an
    intensity time series read, the PUE); None where they cannot be had (options are checked before the run)."""
    try:
        from ..writer import carbon_settings

        return carbon_settings(options)
    except Exception:  # noqa: BLE001 - carbon is never worth the run's export
        return None


def dropped_line(summary: dict[str, Any]) -> str | None:
    """The one line for stderr when points were lost (None when none were)."""
    parts = []
    for s in summary.get("sinks", []):
        if s.get("dropped"):
            where = f" {s['url']}" if s.get("url") else ""
            why = f" ({s['error']})" if s.get("error") else ""
            parts.append(f"{s['sink']}{where}: {s['dropped']} dropped, {s['sent']} sent{why}")
    if not parts:
        return None
    return "energyprof: live export lost points (the program was not slowed): " + "; ".join(parts)


def finish_run(export: LiveExport | None, profile: Any, say: bool, history: list[Figures] | None = None,
               end_ns: int | None = None) -> Any:
    """The drivers' end: last points, the bounded wait; returns the profile with the export's account in its
    meta and a note where points were lost (a copy: `Profile.with_live_export`), which the console summary
    prints as its one line (`say`: print the line on stderr here, where no summary will)."""
    if export is None:
        return profile
    try:
        summary = export.finish(profile, history, end_ns=end_ns)
    except Exception as exc:  # noqa: BLE001 - the export is never worth the run's outputs
        summary = {"run": export.run, "host": export.host, "sinks": [], "error": f"{type(exc).__name__}: {exc}"}
    line = dropped_line(summary)
    if profile is not None:
        profile = profile.with_live_export(summary, line.split(": ", 1)[1] if line is not None else None)
    if line is not None and say:
        import sys

        print(line, file=sys.stderr, flush=True)
    return profile


# -- the ledger's figures, from the collector's tick -------------------------------------------------
class LedgerWatch:
    """A collector extra (called after each tick, on energyprof's thread): once a PERIOD_S, the
    ledger's charged totals as points; each window as the ledger finishes charging it; `window()`
    blocks of a supervised program (`blocks`: (pid, tally) the job feed hands in) for MLflow; and
    the program's `log_metrics` lines from the spool."""

    def __init__(self, export: LiveExport, ledger: Any, policy: str, lock: Any = None, spool: str | None = None) -> None:
        self.export = export
        self.ledger = ledger
        self.policy = policy
        for s in ledger.sources:
            export.methods.setdefault(s["id"], s.get("method") or "measured")
        self.lock = lock
        self.spool = spool
        self.blocks: list[tuple[int, Any]] = []  # filled by the job feed (supervised runs only)
        self._blocks: list[tuple[int, Any]] = []
        self._seen = 0
        self._pending: list[Any] = []
        self._next = 0
        self._last: tuple[int, list[float], list[float]] | None = None
        self._history: list[Figures] = []  # the last few figures sent (wall ns): the final point's power is from them
        self._metrics_at = 0
        from .units import RequestCounters

        self._requests = RequestCounters()
        self._units: deque[Any] = deque()  # units' windows (web requests) as the ledger charges them: their routes' counters
        if export.points:
            ledger.on_unit = self._units.append
        self._metrics_offset = 0

    def __call__(self, t_ns: int) -> None:
        if self.spool is not None and t_ns >= self._metrics_at:
            self._metrics_at = t_ns + int(PERIOD_S * 1e9 / 4)
            self._program_metrics()
        if not self.export.points and not self.blocks and not self._blocks:  # MLflow alone: only window() blocks
            return
        with self.lock if self.lock is not None else _nolock:
            self._windows()
            if t_ns >= self._next and self.export.points:
                self._next = t_ns + int(PERIOD_S * 1e9)
                self._figures()

    def final(self) -> None:
        """After the collector's last tick (the ledger finished): the windows left, the last figures."""
        with self.lock if self.lock is not None else _nolock:
            self._windows(final=True)
            if self.export.points:
                self._figures()
        if self.spool is not None:
            self._program_metrics()

    def history(self) -> list[Figures]:
        """The last figures sent, from the run's start on (wall ns): the final point's power is from them."""
        led = self.ledger
        start = [Figures(self.export.wall_ns(led.first_ns), {}, {})] if led.first_ns is not None else []
        return [*start, *self._history]

    def end_ns(self) -> int | None:
        """The wall time the ledger has charged up to (the profile's totals are as of then)."""
        charged = self.ledger.charged_ns
        return self.export.wall_ns(charged) if charged is not None else None

    def _figures(self) -> None:
        led = self.ledger
        charged = led.charged_ns
        if charged is None or charged <= (self._last[0] if self._last is not None else (led.first_ns or charged)):
            return  # nothing charged since the last figures (or at all)
        machine = list(led.total)
        program = led.program_energy(self.policy)
        t0, m0, p0 = self._last if self._last is not None else (led.first_ns or charged, [0.0] * led.n, [0.0] * led.n)
        dt = (charged - t0) / 1e9
        pm = [max(0.0, (a - b) / dt) if dt > 0 else 0.0 for a, b in zip(machine, m0)]
        pp = [max(0.0, (a - b) / dt) if dt > 0 else 0.0 for a, b in zip(program, p0)]
        self._last = (charged, machine, program)
        ids = list(led.source_ids)
        self._history = [*self._history[-2:], Figures(self.export.wall_ns(charged), dict(zip(ids, machine)),
                                                      dict(zip(ids, program)))]
        self.export.poll_point_sources(self.export.wall_ns(charged))
        self.export.emit(self.export.source_points(self.export.wall_ns(charged), list(led.source_ids), machine, program, pm, pp))

    def _windows(self, final: bool = False) -> None:
        led = self.ledger
        if len(led.windows) > self._seen and self.export.points:
            self._pending.extend(led.windows[self._seen:])
            self._seen = len(led.windows)
        while self._units:  # taken one by one: the ledger's thread may add one meanwhile
            self._pending.append(self._units.popleft())
        if self.blocks:
            self._blocks.extend(self.blocks)
            self.blocks.clear()
        if not self._pending and not self._blocks:
            return
        out: list[Point] = []
        left = []
        for w in self._pending:
            if not (w.done or final):
                left.append(w)
                continue
            a = led.account(w)
            if self._requests.add(a, self.policy):
                continue  # a request: its route's counters, not a point of its own (output/live/units.py)
            out.extend(self.export.window_points(a.name, a.index, a.time_s, self.export.wall_ns(a.end_ns),
                                                 a.machine(), a.program(self.policy)))
        self._pending = left
        out.extend(self._requests.points(self.export, time.time_ns()))
        self.export.emit(out)
        if self._blocks:
            keep = []
            for pid, w in self._blocks:
                if not (w.done or final):
                    keep.append((pid, w))
                    continue
                from ...facts.measurement import Measurement, fill_from_account

                g, pue = self.export.carbon if self.export.carbon is not None else (None, 1.0)
                m = fill_from_account(Measurement(name=str(w.name), index=w.index), led.account(w), self.policy, g, pue)
                self.export.window_block(m, str(w.name), w.index, self._program_run(pid))
            self._blocks = keep

    def _program_run(self, pid: int) -> str | None:
        """The program's active MLflow run when its window ended (the agent writes it down in the spool)."""
        if self.spool is None:
            return None
        try:
            with open(os.path.join(self.spool, f"{pid}{MLFLOW_RUN_SUFFIX}"), encoding="utf-8") as fh:
                return fh.read().strip() or None
        except OSError:
            return None

    def _program_metrics(self) -> None:
        assert self.spool is not None
        try:
            with open(os.path.join(self.spool, METRICS_FILE), "rb") as fh:
                fh.seek(self._metrics_offset)
                data = fh.read(1 << 20)
        except OSError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self._metrics_offset += end + 1
        for raw in data[:end].splitlines():
            try:
                rec = json.loads(raw)
                self.export.metrics(rec["values"], rec.get("step"), rec.get("run"), method=str(rec.get("method") or "estimated"))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_nolock = _NoLock()
