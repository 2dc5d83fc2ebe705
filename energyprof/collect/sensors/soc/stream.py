"""One long-running child tool per run, its output parsed on a thread of its own.

A tool such as tegrastats or powermetrics prints a reading every interval until it is
killed. Starting it once per reading would block for an interval each time (CodeCarbon's
one-shot powermetrics call takes about a second), so the stream starts it once, a reader
thread turns each record into power per channel for a PowerIntegrator, and sensor reads are
lookups that never wait on the tool. The thread is a `_thread` one, so a profiled program
never sees it; the tool runs in its own session, so a Ctrl-C at the terminal reaches the
program and not the tool.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, IO, Iterable, Iterator, Mapping

from ....agent import own_threads
from ..base import ChannelSensor, Discovery, PowerIntegrator

FIRST_READING_S = 5.0  # how long discovery waits for the tool's first reading
_RUNNING: set[int] = set()  # the pids of the tools running now (an in-process profile leaves them out of the program's children)


def tool_pids() -> set[int]:
    return set(_RUNNING)


class Reading:
    """One record of a tool: watts per channel, instantaneous or (`mean`) the mean over the
    interval that ends now: the tool's `elapsed_ns` when it states one, else since its last record."""

    __slots__ = ("watts", "mean", "elapsed_ns")

    def __init__(self, watts: Mapping[str, float], mean: bool = False, elapsed_ns: int | None = None) -> None:
        self.watts = dict(watts)
        self.mean = mean
        self.elapsed_ns = elapsed_ns


if TYPE_CHECKING:
    Parser = Callable[[IO[bytes]], Iterator[Reading]]


class SharedStream:
    """Readings that one producer (a child tool, a polling thread) feeds into one PowerIntegrator,
    shared by the channel sensors: the last sensor closed stops the producer."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.integrator = PowerIntegrator()
        self.failed: str | None = None  # why the stream stopped before it was closed
        self._users = 0
        self._lock = threading.Lock()
        self._closed = False

    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users <= 0
        if last:
            self.close()

    def close(self) -> None:
        self._closed = True

    def wait_first(self, timeout_s: float = FIRST_READING_S) -> str | None:
        """None once a reading came in; else why not (the producer failed, or gave nothing in time)."""
        if not self.integrator.first.wait(timeout_s):
            return f"{self.name} printed no reading within {timeout_s:g} s"
        if self.integrator.readings == 0:
            time.sleep(0.05)  # let the producer's last words arrive
            return self.failed or f"{self.name} ended without a reading"
        return None


class ToolStream(SharedStream):
    """A child tool whose records feed the stream."""

    def __init__(self, argv: list[str], parse: Parser, name: str) -> None:
        super().__init__(name)
        self.argv = argv
        self.stderr_tail = b""
        self._stderr_done = threading.Event()
        self._parse = parse
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
        _RUNNING.add(self.proc.pid)
        own_threads.start(self._pump)
        own_threads.start(self._drain_stderr)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        try:
            for reading in self._parse(self.proc.stdout):
                t = time.perf_counter_ns()
                if reading.mean:
                    self.integrator.add_mean(t, reading.elapsed_ns, reading.watts)
                else:
                    self.integrator.add_instant(t, reading.watts)
        except Exception as exc:  # noqa: BLE001 - a record the parser cannot read ends the stream, said once
            self.failed = f"{self.name}: unreadable output ({type(exc).__name__}: {exc})"
        finally:
            if not self._closed and self.failed is None:  # why, before anyone waiting is told it ended
                try:
                    code: int | None = self.proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:  # its output closed, the process lingers
                    code = None
                self._stderr_done.wait(1.0)  # its last words, for the note
                self.failed = f"{self.name} stopped (exit status {code})" + self._stderr_line()
            self.integrator.end()
            self.integrator.first.set()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        try:
            for line in self.proc.stderr:
                self.stderr_tail = (self.stderr_tail + line)[-400:]
        except (OSError, ValueError):  # closed under it at the end of the run
            pass
        finally:
            self._stderr_done.set()

    def _stderr_line(self) -> str:
        text = self.stderr_tail.decode("utf-8", "replace").strip().splitlines()
        return f": {text[-1]}" if text else ""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.proc.poll() is None:
            # SIGKILL, not SIGTERM: the supervisor blocks SIGTERM before it starts any tool, and a
            # child inherits that mask; the tools only print readings, so there is nothing to flush.
            try:
                self.proc.kill()
                self.proc.wait(timeout=5.0)
            except (OSError, subprocess.TimeoutExpired):
                pass
        _RUNNING.discard(self.proc.pid)
        for fh in (self.proc.stdout, self.proc.stderr):
            try:
                if fh is not None:
                    fh.close()
            except OSError:
                pass


def find_tool(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The tool's path on PATH (a stand-in of the same name is found the same way)."""
    return shutil.which(name, path=(env or os.environ).get("PATH"))


def lines(stream: IO[bytes]) -> Iterable[str]:
    for raw in stream:
        yield raw.decode("utf-8", "replace")


def channel_sensors(stream: Any, name: str, period_s: float, found: Discovery, detail: dict[str, Any],
                    components: Callable[[str], str], what: str = "rail") -> Discovery:
    """One sensor per channel the first reading showed, `other` (the total less its parts) last."""
    watts = stream.integrator.last_watts()
    ids = sorted(w for w in watts if w != "other") + (["other"] if "other" in watts else [])
    if not ids:
        stream.close()
        found.notes.append(f"{name}: its output holds no power reading")
        return found
    for sid in ids:
        d = dict(detail)
        d[what] = "the total less its measured parts" if sid == "other" else sid
        found.sensors.append(ChannelSensor(stream, sid, id=sid, component="soc" if sid == "other" else components(sid),
                                           method="measured", sensor=name, detail=d, update_period_s=period_s,
                                           tier="integrated"))
    found.notes.append(f"{name}: {len(ids)} source(s), read every {period_s:g} s: {', '.join(ids)}")
    return found


def from_tool(name: str, argv: list[str], parse: Parser, period_s: float, detail: dict[str, Any],
              components: Callable[[str], str], what: str = "rail", step: str | None = None) -> Discovery:
    """Start the tool once, wait for its first reading, and make one sensor per channel; or a
    note and the step that would enable it (`step`, else: run the tool by hand to see why)."""
    found = Discovery()
    stream = ToolStream(argv, parse, name)
    why = stream.wait_first()
    if why is not None:
        stream.close()
        step = step or f"run `{' '.join(argv)}` to see why"
        found.missing[name] = f"{why}; {step}"
        found.notes.append(f"{name}: {why}. {step}")
        return found
    return channel_sensors(stream, name, period_s, found, {"tool": argv[0], **detail}, components, what)
