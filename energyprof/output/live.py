"""Live export: the run's power and energy while it runs, to InfluxDB and a Prometheus pushgateway,
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

import base64
import json
import math
import os
import threading
import time
from collections import deque
from urllib.parse import parse_qsl, quote, urlsplit
from typing import Any, Iterable

from ..record import field, record

PERIOD_S = 1.0  # the figures' period
CAPACITY = 4096  # points (or MLflow items) a sink holds before the oldest are dropped
SEND_TIMEOUT_S = 1.0  # one request's socket timeout (connect, each read)
RETRY_S = 5.0  # a sink that failed waits this long before it sends again
FINISH_WAIT_S = 0.5  # the most the run's end waits for the sinks, all together (a healthy server answers in ms)
BATCH = 500  # points per request
MEASUREMENT = "energyprof"
TOKEN_ENV = "INFLUX_TOKEN"
METRICS_FILE = "live-metrics.jsonl"  # in a supervised run's spool: the program's log_metrics, for the supervisor
MLFLOW_RUN_SUFFIX = ".mlflow-run"  # in the spool: <pid>.mlflow-run, the program's active MLflow run


class TargetError(ValueError):
    """A bad --influx or --pushgateway URL: one line, said before the program starts."""


@record
class Point:
    """One point: a measurement, its tags (host, run, source, ...), its numeric fields, its wall time (ns)."""

    measurement: str
    tags: dict[str, str]
    fields: dict[str, float]
    t_ns: int


@record
class WindowBlock:
    """A `window()` block that ended, for MLflow: its Measurement (figures filled on the first read, on
    the sink's thread) and the program's active MLflow run when it ended (None: none)."""

    m: Any
    name: str
    index: int | None
    program_run: str | None = None


@record
class Metrics:
    """`log_metrics`'s figures: name -> value at `step`."""

    values: dict[str, float]
    step: int | None
    t_ns: int
    program_run: str | None = None


# -- targets: parsed and checked before anything runs (pure: the environment is handed in) ---------
@record
class InfluxTarget:
    scheme: str
    host: str
    port: int
    path: str  # the write request's path and query
    headers: dict[str, str] = field(default_factory=dict)
    version: int = 1


def influx_target(url: str, env: dict[str, str] | None = None) -> InfluxTarget:
    """`http://HOST:8086/DB` (1.x: /write?db=DB) or `http://HOST:8086?org=ORG&bucket=B` (also with the
    path /api/v2/write; 2.x: the token from INFLUX_TOKEN, org and bucket also from INFLUX_ORG and
    INFLUX_BUCKET). A 1.x server that wants a login gets INFLUX_TOKEN as `user:password`."""
    env = dict(os.environ) if env is None else env
    scheme, host, port, path, query = _split(url, "--influx", 8086)
    q = dict(parse_qsl(query))
    token = env.get(TOKEN_ENV, "")
    base = path.rstrip("/")
    if base.endswith("/api/v2/write"):
        base = base[: -len("/api/v2/write")]
    org, bucket = q.get("org") or env.get("INFLUX_ORG", ""), q.get("bucket") or env.get("INFLUX_BUCKET", "")
    v2 = "org" in q or "bucket" in q or path.rstrip("/").endswith("/api/v2/write")
    if v2:
        if not org or not bucket:
            raise TargetError(f"--influx {url}: InfluxDB 2 needs ?org=ORG&bucket=BUCKET (or INFLUX_ORG and INFLUX_BUCKET)")
        if not token:
            raise TargetError(f"--influx {url}: InfluxDB 2 needs a token: set {TOKEN_ENV}")
        write = f"{base}/api/v2/write?org={quote(org, safe='')}&bucket={quote(bucket, safe='')}&precision=ns"
        return InfluxTarget(scheme, host, port, write, {"Authorization": f"Token {token}"}, 2)
    db = base.strip("/")
    if not db or "/" in db:
        raise TargetError(f"--influx {url}: give the database as the path (http://HOST:8086/DB), or"
                          " ?org=ORG&bucket=BUCKET for InfluxDB 2")
    headers = {"Authorization": f"Token {token}"} if token else {}
    return InfluxTarget(scheme, host, port, f"/write?db={quote(db, safe='')}&precision=ns", headers, 1)


def pushgateway_target(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, base path) of `http://HOST:9091` (the group's path is added per run), or
    of a URL that names its own group (`.../metrics/job/NAME/...`), used as it is."""
    scheme, host, port, path, query = _split(url, "--pushgateway", 9091)
    if query:
        raise TargetError(f"--pushgateway {url}: a pushgateway URL takes no query")
    return scheme, host, port, path.rstrip("/")


def _split(url: str, flag: str, default_port: int) -> tuple[str, str, int, str, str]:
    if not isinstance(url, str) or not url.strip():
        raise TargetError(f"{flag} needs a URL (http://HOST:PORT...), not {url!r}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetError(f"{flag} {url}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError(f"{flag} {url}: give an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise TargetError(f"{flag} {url}: no credentials in the URL (InfluxDB reads {TOKEN_ENV})")
    return parts.scheme, parts.hostname, port or default_port, parts.path or "/", parts.query


# -- sinks: each sends one batch, raising on any failure ------------------------------------------
class SendError(Exception):
    pass


def _request(scheme: str, host: str, port: int, method: str, path: str, body: bytes, headers: dict[str, str],
             timeout: float) -> None:
    import http.client

    kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    conn = kind(host, port, timeout=max(0.05, timeout))
    try:
        conn.request(method, path, body=body, headers={"Content-Length": str(len(body)), **headers})
        resp = conn.getresponse()
        said = resp.read(300)
        if not 200 <= resp.status < 300:
            text = " ".join(said.decode("utf-8", "replace").split())[:200]
            raise SendError(f"HTTP {resp.status}{': ' + text if text else ''}")
    finally:
        conn.close()


class InfluxSink:
    kind = "influx"

    def __init__(self, url: str) -> None:
        self.url = url
        self.target = influx_target(url)

    def send(self, items: list[Any], timeout: float) -> int:
        points = [p for p in items if isinstance(p, Point)]
        lines = [line_protocol(p) for p in points if any(math.isfinite(v) for v in p.fields.values())]
        if lines:
            t = self.target
            body = "".join(line + "\n" for line in lines).encode()
            _request(t.scheme, t.host, t.port, "POST", t.path, body,
                     {"Content-Type": "text/plain; charset=utf-8", **t.headers}, timeout)
        return len(points)


class PushgatewaySink:
    """Holds the latest value of every metric and pushes them all (PUT: the group is replaced)."""

    kind = "pushgateway"

    def __init__(self, url: str, host: str, run: str) -> None:
        self.url = url
        scheme, h, port, path = pushgateway_target(url)
        if "/metrics/job/" not in path:
            path = (f"{path}/metrics/job/{MEASUREMENT}/instance@base64/{_b64(host)}/run@base64/{_b64(run)}")
        self.where = (scheme, h, port, path)
        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def send(self, items: list[Any], timeout: float) -> int:
        n = 0
        for p in items:
            if isinstance(p, Point):
                labels = tuple(sorted((k, v) for k, v in p.tags.items() if k != "run"))
                for name, value in p.fields.items():
                    self.values[(metric_name(p.measurement, name), labels)] = value
                n += 1
        if n:
            scheme, host, port, path = self.where
            _request(scheme, host, port, "PUT", path, exposition(self.values).encode(),
                     {"Content-Type": "text/plain; version=0.0.4"}, timeout)
        return n


class MlflowSink:
    """Windows of `window()` blocks and `log_metrics` figures, logged as output/mlflow.py logs them,
    from this thread: its store's work (SQLite, a tracking server) is energyprof's, not the program's."""

    kind = "mlflow"
    url = ""

    def __init__(self) -> None:
        import mlflow  # noqa: F401 - imported once, here, before the program's windows

        self.lock = threading.Lock()
        self.closed = False
        self.handed_over = 0  # items left to the end-of-run log (which logs what is not in the run yet): not lost

    def send(self, items: list[Any], timeout: float) -> int:
        from . import mlflow as ml

        n = 0
        for k, item in enumerate(items):
            with self.lock:
                if self.closed:  # the end-of-run log has taken over: it logs what is left, once
                    self.handed_over += len(items) - k
                    return n
                if isinstance(item, WindowBlock):
                    ml.log_window(item.m, item.name, item.index, program_run=item.program_run)
                elif isinstance(item, Metrics):
                    ml.log_metrics(item.values, item.step, program_run=item.program_run)
            n += 1
        return n


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode() or "="


# -- formats ------------------------------------------------------------------------------------
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


# -- one sink's buffer and thread ------------------------------------------------------------------
class Channel:
    """A sink with a bounded buffer and a thread of its own (invisible, energyprof's CPU where `own` is
    given). `put` never blocks: a full buffer drops its oldest item, counted."""

    def __init__(self, sink: Any, own: Any = None, capacity: int = CAPACITY) -> None:
        self.sink = sink
        self.own = own
        self.items: deque[Any] = deque()
        self.capacity = capacity
        self.sent = 0
        self.dropped = 0
        self.error: str | None = None
        self.retry_at = 0.0
        self.deadline: float | None = None  # set at the end: nothing is sent after it
        self.cond = threading.Condition(threading.Lock())
        self.busy = False
        self.inflight = 0
        self.abandoned = False  # the run's end gave up on the request in flight (its points counted as dropped)
        self.stopping = False
        from ..collect.collector import _Thread

        self.thread = _Thread(self._run)

    def put(self, items: Iterable[Any]) -> None:
        with self.cond:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.dropped += sum(1 for _ in items)
                return
            self.items.extend(items)
            over = len(self.items) - self.capacity
            for _ in range(max(0, over)):
                self.items.popleft()
            if over > 0:
                self.dropped += over
            self.cond.notify()

    def _run(self) -> None:
        if self.own is not None:
            self.own.register_current()
        while True:
            with self.cond:
                while not self.items and not self.stopping:
                    self.cond.wait(PERIOD_S)
                if not self.items and self.stopping:
                    return
                batch = [self.items.popleft() for _ in range(min(BATCH, len(self.items)))]
                self.busy, self.inflight = True, len(batch)
            try:
                self._send(batch)
            finally:
                with self.cond:
                    self.busy = False
                    self.cond.notify_all()

    def _send(self, batch: list[Any]) -> None:
        now = time.monotonic()
        end = self.deadline
        if now < self.retry_at and end is None:
            self._drop(batch)  # resting after a failure: what comes meanwhile is lost, counted (the end is tried)
            return
        timeout = SEND_TIMEOUT_S if end is None else min(SEND_TIMEOUT_S, end - now)
        if timeout <= 0:
            self._drop(batch)
            return
        try:
            sent = self.sink.send(batch, timeout)
            with self.cond:
                if not self.abandoned:
                    self.sent += sent
        except Exception as exc:  # noqa: BLE001 - a sink's failure costs points, never the run
            self._drop(batch)
            self.retry_at = time.monotonic() + RETRY_S
            if self.error is None:
                self.error = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]

    def _drop(self, batch: list[Any]) -> None:
        with self.cond:
            if not self.abandoned:  # counted already, when the run's end gave up on it
                self.dropped += len(batch)

    def close(self, deadline: float) -> None:
        """Send what is held until `deadline` (time.monotonic()); whatever is left then is dropped."""
        with self.cond:
            self.deadline = deadline
            self.stopping = True
            self.cond.notify_all()
            while (self.items or self.busy) and time.monotonic() < deadline:
                self.cond.wait(max(0.0, deadline - time.monotonic()))
            left = len(self.items)
            self.items.clear()
            if hasattr(self.sink, "handed_over"):
                self.sink.handed_over += left
            else:
                self.dropped += left
            if self.busy:  # a request still in flight at the deadline: lost as far as the run can tell
                self.abandoned = True
                self.dropped += self.inflight
        closed = getattr(self.sink, "lock", None)
        if closed is not None:  # MLflow: the end-of-run log logs what this thread has not
            if closed.acquire(timeout=max(0.0, deadline - time.monotonic())):
                self.sink.closed = True
                closed.release()
            else:
                self.sink.closed = True

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sink": self.sink.kind, "sent": self.sent, "dropped": self.dropped}
        if getattr(self.sink, "handed_over", 0):
            out["left_to_the_end_of_run_log"] = self.sink.handed_over
        if self.sink.url:
            out["url"] = self.sink.url
        if self.error:
            out["error"] = self.error
        return out


# -- the run's export --------------------------------------------------------------------------
_current: LiveExport | None = None


class LiveExport:
    """The run's sinks, one Channel each; what the drivers hand it goes to the sinks that take it."""

    def __init__(self, options: Any, own: Any = None, host: str | None = None, run: str | None = None,
                 started_wall: float | None = None) -> None:
        global _current
        from ..engines.distributed import hostname

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
        self.finished = False
        _current = self

    @property
    def channels(self) -> list[Channel]:
        return [*self.points, *([self.mlflow] if self.mlflow is not None else [])]

    def tags(self, source: str, **more: str) -> dict[str, str]:
        method = self.methods.get(source)
        return {"host": self.host, "run": self.run, "source": source, **({"method": method} if method else {}), **more}

    def span_carbon(self, start_wall_ns: int, end_wall_ns: int) -> Any:
        """The figures (analysis/carbon.CarbonFigures) pricing energy spent over a span of wall time; None
        where carbon is off."""
        from ..analysis.carbon import CarbonSettings, span_figures

        settings = self.pricing
        if settings is None and self.carbon is not None:  # the driver's own (g/kWh, PUE)
            from ..carbon.intensity import Intensity

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

    def metrics(self, values: dict[str, float], step: int | None = None, program_run: str | None = None) -> None:
        clean = {str(k): float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        if not clean:
            return
        t = time.time_ns()
        tags = self.tags("all")
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
    def finish(self, profile: Any = None, last: tuple[int, dict[str, float], dict[str, float]] | None = None,
               wait_s: float = FINISH_WAIT_S, totals: tuple[dict[str, float], dict[str, float]] | None = None
               ) -> dict[str, Any]:
        """The last points (from the finished profile: its program energy exactly, and its carbon; or the
        machine's and the program's `totals` per source), then at most `wait_s` for every sink together;
        returns what each sent and dropped (`summary`)."""
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
                    from ..analysis.carbon import carbon

                    fig = carbon(profile, self.pricing)  # the report's figures, to the last bit
            if totals is not None:
                self.emit(self._final_points(*totals, last, fig))
        finally:
            deadline = time.monotonic() + wait_s
            for ch in self.channels:
                ch.close(deadline)
        return self.summary()

    def _final_points(self, machine: dict[str, float], program: dict[str, float],
                      last: tuple[int, dict[str, float], dict[str, float]] | None, fig: Any = None) -> list[Point]:
        """The run's last points; its carbon priced by `fig` (the profile's CarbonFigures), else over the run's
        span of wall time."""
        now = time.time_ns()
        t_last, m_last, p_last = last if last is not None else (None, {}, {})
        dt = (now - t_last) / 1e9 if t_last is not None and now > t_last else 0.0
        points = []
        if fig is None:
            fig = self.span_carbon(self.started_wall_ns, now)
        for sid in machine:
            em, ep = machine[sid], program.get(sid, 0.0)
            pm = (em - m_last.get(sid, 0.0)) / dt if dt > 0 and sid in m_last else 0.0
            pp = (ep - p_last.get(sid, 0.0)) / dt if dt > 0 and sid in p_last else 0.0
            points.append(Point(MEASUREMENT, self.tags(sid), {"machine_power_watts": max(0.0, pm), "machine_energy_joules": em,
                                                                "program_power_watts": max(0.0, pp), "program_energy_joules": ep},
                                now))
            if fig is not None:  # carbon: an energy priced at an intensity, which is an estimate
                points.append(Point(f"{MEASUREMENT}_carbon", {**self.tags(sid), "method": "estimated"},
                                    {"machine_grams": fig.grams({sid: em}), "program_grams": fig.grams({sid: ep}),
                                     "intensity_g_per_kwh": float(fig.by_source.get(sid, fig.default_g_per_kwh)),
                                     "pue": float(fig.pue)}, now))
        return points

    def summary(self) -> dict[str, Any]:
        return {"run": self.run, "host": self.host, "sinks": [ch.report() for ch in self.channels]}


def _carbon_settings(options: Any) -> Any:
    """The report's carbon settings of the run's options (output/writer.carbon_settings: the intensity, an
    intensity time series read, the PUE); None where they cannot be had (options are checked before the run)."""
    try:
        from .writer import carbon_settings

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


def record_in_profile(profile: Any, summary: dict[str, Any]) -> None:
    """The export's account in the profile's meta, and a note where points were lost."""
    from ..facts.records import Note

    profile.meta["live_export"] = summary
    line = dropped_line(summary)
    if line is not None:
        profile.notes.append(Note("live-export", line.split(": ", 1)[1]))


def finish_run(export: LiveExport | None, profile: Any, say: bool, last: Any = None) -> None:
    """The drivers' end: last points, the bounded wait, the profile's account and its note, which the
    console summary prints as its one line (`say`: print the line on stderr here, where no summary will)."""
    if export is None:
        return
    try:
        summary = export.finish(profile, last)
    except Exception as exc:  # noqa: BLE001 - the export is never worth the run's outputs
        summary = {"run": export.run, "host": export.host, "sinks": [], "error": f"{type(exc).__name__}: {exc}"}
    if profile is not None:
        record_in_profile(profile, summary)
    line = dropped_line(summary)
    if line is not None and say:
        import sys

        print(line, file=sys.stderr, flush=True)


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
        self._metrics_at = 0
        self._metrics_offset = 0
        from .unit_metrics import RequestCounters

        self._requests = RequestCounters()

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

    def last(self) -> tuple[int, dict[str, float], dict[str, float]] | None:
        """(wall ns, machine J, program J) of the last figures sent: the final point's power is from them."""
        if self._last is None:
            return None
        t, m, p = self._last
        ids = self.ledger.source_ids
        return self.export.wall_ns(t), dict(zip(ids, m)), dict(zip(ids, p))

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
        self.export.emit(self.export.source_points(self.export.wall_ns(charged), list(led.source_ids), machine, program, pm, pp))

    def _windows(self, final: bool = False) -> None:
        led = self.ledger
        if len(led.windows) > self._seen and self.export.points:
            self._pending.extend(led.windows[self._seen:])
            self._seen = len(led.windows)
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
                continue  # a request: its route's counters, not a point of its own (output/unit_metrics.py)
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
                from ..facts.measurement import Measurement, fill_from_account

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
                self.export.metrics(rec["values"], rec.get("step"), rec.get("run"))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_nolock = _NoLock()


# -- the program's side ------------------------------------------------------------------------------
def program_mlflow_run() -> str | None:
    """The calling thread's active MLflow run, where the program has imported mlflow (never imported here)."""
    import sys

    mlflow = sys.modules.get("mlflow")
    if mlflow is None:
        return None
    try:
        active = mlflow.active_run()
    except Exception:  # noqa: BLE001 - a half-imported or stubbed mlflow is no run
        return None
    return active.info.run_id if active is not None else None


def log_metrics(values: dict[str, float], step: int | None = None) -> bool:
    """Send the program's own figures (name -> value; a forecast after each epoch) to every live sink of
    the run: InfluxDB and the pushgateway as `energyprof_metric` (step as a tag), MLflow as metrics at
    `step`. Never blocks and never raises; False where no live export runs (nothing was sent).

    In-process (`energy_profile(influx=...)`, `Monitor(...)`) they go on its threads; in a program under
    `python -m energyprof --influx ...` they go through the spool to the supervisor, which sends them."""
    try:
        export = _current
        run = program_mlflow_run()
        if export is not None and not export.finished:
            export.metrics(values, step, run)
            return True
        return _to_supervisor(values, step, run)
    except Exception:  # noqa: BLE001 - a figure is never worth the program's run
        return False


def _to_supervisor(values: dict[str, float], step: int | None, run: str | None) -> bool:
    import sys

    supervised = sys.modules.get("energyprof.agent.supervised")
    agent = supervised.current() if supervised is not None else None
    if agent is None or agent.config.get("live") != "1":
        return False
    clean = {str(k): float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    line = json.dumps({"values": clean, "step": step, "run": run}, separators=(",", ":")) + "\n"
    fd = os.open(os.path.join(agent.config["spool"], METRICS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())  # one write of a short line: whole, whoever else appends
    finally:
        os.close(fd)
    return True
