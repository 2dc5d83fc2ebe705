"""The live export's sinks, each sending one batch and raising on any failure, and the Channel that gives
each its bounded buffer and a thread of energyprof's own."""

from __future__ import annotations

import base64
import math
import threading
import time
from collections import deque
from typing import Any, Iterable

from ...agent.own_threads import Thread
from ...record import record
from ...setup.targets import influx_target, pushgateway_target, redacted
from .formats import MEASUREMENT, Point, exposition, line_protocol, metric_name

PERIOD_S = 1.0  # the figures' period; an idle sink's thread wakes this often
CAPACITY = 4096  # points (or MLflow items) a sink holds before the oldest are dropped
SEND_TIMEOUT_S = 1.0  # one request's socket timeout (connect, each read)
RETRY_S = 5.0  # a sink that failed waits this long before it sends again
BATCH = 500  # points per request


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
        self.url = redacted(url)  # what the profile, the page and stderr may show
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
        self.url = redacted(url)
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
        from .. import mlflow as ml

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
        self.thread = Thread(self._run)

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
