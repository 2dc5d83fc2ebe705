"""The stack sampler that runs inside every profiled process.

One thread, started with the low-level `_thread` module so the program never sees it
(`threading.enumerate()`, `active_count()`, interpreter exit), reads every thread's stack
each `interval` with each thread's CPU time and the process's RSS, and hands them to a
sink: the in-process collector (decorator, `with` block) or an append-only spool file
that the supervisor reads (`python -m energyprof`).

This module imports nothing but the standard library and no module of energyprof, so the
bootstrap can load it by path before the program's folder is on `sys.path`: a `csv.py` or
`html.py` beside a script can never stand in for a module it needs. Everything it uses
later is imported here, at load time.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any, Callable

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_RUNNER_FILES = {"<frozen runpy>", "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>"}
# energyprof files whose frames stand between user frames (wrappers): skipped, the stack goes on.
_TRANSPARENT = tuple(PACKAGE_DIR + p for p in ("api.py", "cli" + os.sep, "__main__.py", "torch.py", "integrations" + os.sep))

KEEP, SKIP, STOP = 0, 1, 2
THREAD_FRAME_PREFIX = "[thread "
# A followed child's stacks carry this frame (line = its pid) where its process node goes:
# the supervisor puts the node, and for a spawned child the stack that started it, there.
PROCESS_MARKER = "[process]"
FLUSH_NS = 20_000_000  # a SIGKILL loses at most this much of a spooled stream (one write each)
SEGMENT_BYTES = 8 << 20  # a spool goes on in a new file past this; the reader deletes what it has read

Frame = tuple[str, str, int]

_HAVE_STATM = os.path.exists("/proc/self/statm")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def frame_kind(filename: str) -> int:
    """KEEP a user frame; SKIP a runner or wrapper frame; STOP at energyprof's internals.

    Time inside the profiler's own machinery (stopping, a window boundary) belongs to the
    user frame that called it, so the stack is cut there rather than showing threading
    joins and collector code as the program's functions.
    """
    if filename.startswith(PACKAGE_DIR):
        return SKIP if filename.startswith(_TRANSPARENT) else STOP
    if filename in _RUNNER_FILES or os.path.basename(filename) == "runpy.py":
        return SKIP
    return KEEP


def thread_clock_id(native_id: int) -> int:
    """Linux's CPU clock id for a thread id (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)).

    Computed from the kernel thread id rather than through pthread_getcpuclockid, which
    would dereference a pthread handle that may already be freed when the thread has ended;
    reading this clock for a finished thread just fails with EINVAL.
    """
    return ((~native_id) << 3) | 6


def marker(pid: int) -> Frame:
    return (PROCESS_MARKER, "", pid)


def filtered(codes: list[CodeType]) -> list[Frame]:
    """The frames of a stack (outermost first) that belong to the profile."""
    out: list[Frame] = []
    for c in codes:
        kind = frame_kind(c.co_filename)
        if kind == STOP:
            break
        if kind == SKIP:
            continue
        out.append((getattr(c, "co_qualname", c.co_name), c.co_filename, c.co_firstlineno))
    return out


def codes_of(frame: FrameType | None) -> list[CodeType]:
    codes: list[CodeType] = []
    while frame is not None:
        codes.append(frame.f_code)
        frame = frame.f_back
    codes.reverse()
    return codes


class View:
    """How a process names its stacks: cut at the anchor, or put under its process node.

    The main process of a run (or an in-process profile) reports its frames as they are. A
    followed child reports them with its marker: a forked child after the frames it shares
    with its parent (the stack that forked it, as the parent names it), a spawned child at
    the root (the supervisor places it under the stack that started it).
    """

    def __init__(self, anchor: int = 0, pid: int | None = None, fork_frames: list[Frame] | None = None,
                 parent: View | None = None) -> None:
        self.anchor = anchor
        self.pid = pid  # None: no process node (the main process)
        self.fork_frames = fork_frames
        self.parent = parent

    def main(self, frames: list[Frame]) -> list[Frame]:
        if self.pid is None:
            return frames
        if self.fork_frames is None or self.parent is None:
            return [marker(self.pid), *frames]
        fork = self.fork_frames
        if not frames:  # nothing of the program's running (shutting down): the process itself
            return [*self.parent.main(fork), marker(self.pid)]
        c = 0
        n = min(len(fork), len(frames))
        while c < n and fork[c] == frames[c]:
            c += 1
        return [*self.parent.main(frames[:c]), marker(self.pid), *frames[c:]]

    def thread(self, name: str, frames: list[Frame]) -> list[Frame]:
        head = [(f"{THREAD_FRAME_PREFIX}{name}]", "", 0)]
        if self.pid is None:
            return [*head, *frames]
        if self.fork_frames is None or self.parent is None:
            return [marker(self.pid), *head, *frames]
        return [*self.parent.main(self.fork_frames), marker(self.pid), *head, *frames]


class Sampler:
    """Samples every thread's stack each `interval_s` and reports to `sink`.

    The sink gets `frame(fid, frame)` and `stack(sid, fids)` once per new entry, then per
    tick `tick(t0, t1, process_cpu, own_cpu, rss)` followed by `sample(sid, cpu, main)` for
    each thread, and `flush()` at most every FLUSH_NS.
    """

    def __init__(self, sink: Any, interval_s: float, view: View | None = None, rss: bool = True,
                 alloc: bool = False, own_idents: set[int] | None = None, main_ident: int | None = None,
                 every_second: Callable[[], None] | None = None) -> None:
        self.sink = sink
        self.interval_s = interval_s
        self.view = view or View()
        self.rss = rss and _HAVE_STATM
        self.alloc = alloc
        self.own_idents = own_idents if own_idents is not None else set()
        self.main_ident = main_ident if main_ident is not None else threading.main_thread().ident
        self._frame_ids: dict[Frame, int] = {}
        self._stack_ids: dict[tuple[int, ...], int] = {}
        self._sid_cache: dict[tuple[int, ...], int] = {}
        self._codes: dict[int, CodeType] = {}  # keeps code objects alive so ids stay unique
        self._clocks: dict[int, int | None] = {}
        self._last_cpu: dict[int, int] = {}
        self._stop = False
        self._done = _thread.allocate_lock()
        self._statm: int | None = None
        self.own_cpu_ns = 0
        self.ident: int | None = None
        self.failed: BaseException | None = None
        self.every_second = every_second  # called on the sampler's thread, soon after start, then once a second

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        if self.rss:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._done.acquire()
        try:
            _thread.start_new_thread(self._run, ())
        except BaseException:
            self._done.release()
            raise

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after one last sample and a flush; wait at most `timeout` seconds."""
        self._stop = True
        if self._done.acquire(timeout=timeout):
            self._done.release()
        if self._statm is not None:
            try:
                os.close(self._statm)
            except OSError:
                pass
            self._statm = None

    @property
    def running(self) -> bool:
        return self._done.locked()

    def _rss(self) -> int:
        """This process's RSS from /proc/self/statm (kept open: one pread a sample); 0 where unreadable."""
        if self._statm is None:
            return 0
        try:
            return int(os.pread(self._statm, 128, 0).split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return 0

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.ident = _thread.get_ident()
            self.own_idents.add(self.ident)
            perf, proc_ns, own_ns = time.perf_counter_ns, time.process_time_ns, time.thread_time_ns
            prev_t, prev_proc = perf(), proc_ns()
            self._thread_cpu_deltas(sys._current_frames())
            last_flush = last_second = prev_t
            # The periodic check (does this process use CUDA yet?) starts every 50 ms and backs
            # off to once a second: a trainer that starts CUDA at once is known at once.
            period = 50_000_000
            sleep, interval = time.sleep, self.interval_s
            while True:
                stopping = self._stop
                if not stopping:
                    sleep(interval)
                now = perf()
                frames = sys._current_frames()
                proc = proc_ns()
                self.own_cpu_ns = own_ns()
                self._one(prev_t, now, frames, proc - prev_proc, proc)
                del frames
                prev_t, prev_proc = now, proc
                if stopping or self._stop:
                    break
                if now - last_flush >= FLUSH_NS:
                    self.sink.flush()
                    last_flush = now
                if self.every_second is not None and now - last_second >= period:
                    last_second = now
                    period = min(2 * period, 1_000_000_000)
                    self.every_second()
            self.sink.flush()
        except BaseException as exc:  # noqa: BLE001 - a sampler failure must never reach the program
            self.failed = exc
        finally:
            self._done.release()

    def _one(self, t0: int, t1: int, frames: dict[int, FrameType], d_proc: int, proc: int) -> None:
        deltas = self._thread_cpu_deltas(frames)
        native = d_proc - sum(deltas.values())
        rss = self._rss()
        sink = self.sink
        sink.tick(t0, t1, proc, self.own_cpu_ns, rss)
        main_sample = None
        own = self.own_idents
        for ident, frame in frames.items():
            if ident in own:
                continue
            sid = self._stack_id(ident, frame)
            cpu = deltas.get(ident, 0)
            if ident == self.main_ident:
                main_sample = (sid, cpu)
                continue
            sink.sample(sid, cpu, False)
        if main_sample is not None:
            sink.sample(main_sample[0], main_sample[1] + max(0, native), True)

    def _thread_cpu_deltas(self, frames: dict[int, FrameType]) -> dict[int, int]:
        """CPU ns each thread (own threads included) burnt since the last tick."""
        out: dict[int, int] = {}
        clocks = self._clocks
        last = self._last_cpu
        for ident in frames:
            clk = clocks.get(ident, -1)
            if clk == -1:
                clk = clocks[ident] = self._clock_for(ident)
            if clk is None:
                continue
            try:
                now = time.clock_gettime_ns(clk)
            except OSError:
                clocks[ident] = None
                continue
            prev = last.get(ident)
            last[ident] = now
            if prev is not None:
                out[ident] = now - prev
        return out

    def _clock_for(self, ident: int) -> int | None:
        if ident == self.ident:
            native: int | None = _thread.get_native_id()
        else:
            thread = threading._active.get(ident)  # type: ignore[attr-defined]
            native = getattr(thread, "native_id", None)
        if native is None or not hasattr(time, "clock_gettime_ns"):
            return None
        return thread_clock_id(native)

    def _stack_id(self, ident: int, frame: FrameType) -> int:
        codes: list[CodeType] = []
        f: FrameType | None = frame
        while f is not None:
            codes.append(f.f_code)
            f = f.f_back
        key = (ident == self.main_ident, *map(id, codes))
        sid = self._sid_cache.get(key)  # type: ignore[arg-type]
        if sid is None:
            for c in codes:
                self._codes[id(c)] = c
            codes.reverse()
            if ident == self.main_ident:
                frames = self.view.main(filtered(codes[self.view.anchor:]))
            else:
                thread = threading._active.get(ident)  # type: ignore[attr-defined]
                frames = self.view.thread(str(getattr(thread, "name", ident)), filtered(codes))
            sid = self.intern(frames)
            self._sid_cache[key] = sid  # type: ignore[index]
        return sid

    def allocations(self) -> list[tuple[Frame | None, int]]:
        """memory=exact: bytes tracemalloc still traces, per function (None: a function
        never sampled), from a snapshot at the end; energyprof's own allocations left out."""
        import tracemalloc

        if not tracemalloc.is_tracing():
            return []
        snap = tracemalloc.take_snapshot().filter_traces([
            tracemalloc.Filter(False, PACKAGE_DIR + "*"),
            tracemalloc.Filter(False, tracemalloc.__file__),
        ])
        where: dict[tuple[str, int], Frame] = {}
        for code in list(self._codes.values()):
            frame = (getattr(code, "co_qualname", code.co_name), code.co_filename, code.co_firstlineno)
            for _, _, line in code.co_lines():
                if line is not None:
                    where.setdefault((code.co_filename, line), frame)
        out: dict[Frame | None, int] = {}
        for stat in snap.statistics("lineno"):
            tb = stat.traceback[0]
            key = where.get((tb.filename, tb.lineno))
            out[key] = out.get(key, 0) + stat.size
        return list(out.items())

    def intern(self, frames: list[Frame]) -> int:
        ids = []
        fids = self._frame_ids
        for fr in frames:
            fid = fids.get(fr)
            if fid is None:
                fid = fids[fr] = len(fids)
                self.sink.frame(fid, fr)
            ids.append(fid)
        key = tuple(ids)
        sid = self._stack_ids.get(key)
        if sid is None:
            sid = self._stack_ids[key] = len(self._stack_ids)
            self.sink.stack(sid, key)
        return sid


class HookSampler(Sampler):
    """`--sampler pyinstrument`: pyinstrument's C profile hook on the main thread calls back
    every `interval`, on the program's thread; the same sinks, views and interning.

    Precise and async-aware, but it runs on every Python call and sees the main thread
    only. `subscribe` is not documented pyinstrument API; it is pinned to 5.x.
    """

    def start(self) -> None:
        from pyinstrument.stack_sampler import get_stack_sampler

        if self.rss:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._hook = get_stack_sampler()
        self._last = (time.perf_counter_ns(), time.process_time_ns())
        self._flushed = self._last[0]
        self._cache: dict[tuple[str, ...], int] = {}
        self._hook.subscribe(self._on_sample, desired_interval=self.interval_s, use_async_context=False)

    def stop(self, timeout: float = 5.0) -> None:
        try:
            self._hook.unsubscribe(self._on_sample)
        except Exception:  # noqa: BLE001 - already gone (an exception tore the hook down)
            pass
        self.sink.flush()

    @property
    def running(self) -> bool:
        return False

    def _on_sample(self, call_stack: list[str], time_since_last_sample: float, async_state: Any) -> None:
        now, cpu = time.perf_counter_ns(), time.process_time_ns()
        key = tuple(call_stack)
        sid = self._cache.get(key)
        if sid is None:
            frames: list[Frame] = []
            for ident in call_stack[1 + self.view.anchor:]:  # [0] is pyinstrument's <thread> pseudo-frame
                parts = ident.split("\x01")[0].split("\x00")
                file = parts[1] if len(parts) > 1 else ""
                kind = frame_kind(file)
                if kind == STOP:
                    break
                if kind == KEEP:
                    line = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0
                    frames.append((parts[0] if parts else "?", file, line))
            sid = self._cache[key] = self.intern(self.view.main(frames))
        rss = self._rss()
        t0, cpu0 = self._last
        self.sink.tick(t0, now, cpu, 0, rss)
        self.sink.sample(sid, cpu - cpu0, True)
        self._last = (now, cpu)
        if now - self._flushed >= FLUSH_NS:
            self._flushed = now
            self.sink.flush()


# -- the spool: one append-only file per process, read by the supervisor --------------------
def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


class Spool:
    """Records as text lines, written with one os.write per flush (a SIGKILL loses only the
    unflushed tail; a half-written last line is ignored by the reader). Past SEGMENT_BYTES the
    stream goes on in `PATH.1`, `PATH.2`, ... (an `R` record names the next file), so the
    reader can delete what it has read and a long run holds little on disk."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = self._open(path)
        self._file = self._identity(self.fd)
        self.buf: list[str] = []
        self._lock = _thread.allocate_lock()  # windows come from program threads
        self._size = 0
        self._segment = 0

    @staticmethod
    def _open(path: str) -> int:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)

    @staticmethod
    def _identity(fd: int) -> tuple[int, int]:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino

    def write(self, line: str) -> None:
        self.buf.append(line)

    def frame(self, fid: int, fr: Frame) -> None:
        self.buf.append(f"F\t{fid}\t{_esc(fr[0])}\t{_esc(fr[1])}\t{fr[2]}\n")

    def stack(self, sid: int, fids: tuple[int, ...]) -> None:
        self.buf.append(f"K\t{sid}\t{','.join(map(str, fids))}\n")

    def tick(self, t0: int, t1: int, proc: int, own: int, rss: int) -> None:
        self.buf.append(f"T\t{t0}\t{t1}\t{proc}\t{own}\t{rss}\n")

    def sample(self, sid: int, cpu: int, main: bool) -> None:
        self.buf.append(f"s\t{sid}\t{cpu}\t{1 if main else 0}\n")

    def event(self, line: str) -> None:
        with self._lock:
            self.buf.append(line)

    def flush(self) -> None:
        with self._lock:
            buf, self.buf = self.buf, []
        if not buf:
            return
        data = "".join(buf).encode("utf-8", "surrogateescape")
        try:
            self._size += len(data)
            if self._size >= SEGMENT_BYTES:
                self._segment += 1
                name = f"{self.path}.{self._segment}"
                fd = self._open(name)
                data += f"R\t{os.path.basename(name)}\n".encode()
                self._write(data)
                os.close(self.fd)
                self.fd, self._size, self._file = fd, 0, self._identity(fd)
            else:
                self._write(data)
        except OSError:
            pass

    def _write(self, data: bytes) -> None:
        try:
            same = self._identity(self.fd) == self._file
        except OSError:
            same = False
        if not same:
            # The program closed our descriptor (daemonising code does): never write into
            # whatever file now has its number; open the spool again by name.
            current = f"{self.path}.{self._segment}" if self._segment else self.path
            self.fd = self._open(current)
            self._file = self._identity(self.fd)
        while data:
            n = os.write(self.fd, data)
            data = data[n:]

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


# -- the agent: the sampler and spool of one followed process ---------------------------------
class Agent:
    """What the bootstrap leaves in a profiled process: a sampler, a spool, window calls.

    `energyprof.profiler.active_profiler()` returns it inside a program run by the
    supervisor, so `window`, `begin_window` and `end_window` (and `energyprof.torch`) mark
    windows in the run's profile.
    """

    def __init__(self, config: dict[str, str], view: View, forked: bool) -> None:
        self.config = config
        self.pid = os.getpid()
        self.view = view
        self.forked = forked
        name = f"{self.pid}-{time.perf_counter_ns()}.spool"
        self.spool = Spool(os.path.join(config["spool"], name))
        kind = HookSampler if config.get("sampler") == "pyinstrument" and not forked else Sampler
        self.sampler = kind(self.spool, float(config.get("interval", "0.005")), view,
                            rss=config.get("memory", "rss") != "off", alloc=config.get("memory") == "exact",
                            main_ident=_thread.get_ident() if forked else None, every_second=self._check_gpu)
        self._gpu = False
        self.sync = config.get("sync") == "cuda"
        self._note_tracing = False
        self._t_start = time.perf_counter_ns()
        self.replies = _Replies(config, self.pid)

    def start(self, label: str = "") -> None:
        env = os.environ
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as fh:
                cmd = " ".join(a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a)
        except OSError:
            cmd = " ".join(sys.argv)
        self.spool.write(f"H\t{self.pid}\t{os.getppid()}\t{time.perf_counter_ns()}\t{1 if self.forked else 0}\t"
                         f"{env.get('RANK', '')}\t{env.get('LOCAL_RANK', '')}\t{_esc(label)}\t{_esc(cmd)}\n")
        self.spool.flush()  # the supervisor learns of this process at once
        self.sampler.start()

    def stop(self, exc: BaseException | None = None) -> None:
        self.sampler.stop()
        if self.sampler.failed is not None:
            err = self.sampler.failed
            self.note(f"the sampler of process {self.pid} stopped early: {type(err).__name__}: {err}")
        if exc is not None and not isinstance(exc, SystemExit):
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.spool.event(f"E\t{time.perf_counter_ns()}\t{_esc(text)}\n")
        if self.sampler.alloc:
            tm = sys.modules.get("tracemalloc")
            if tm is None or not tm.is_tracing() or tm.get_traceback_limit() != 1:
                self.note("memory=exact is off: the program runs tracemalloc itself, and energyprof leaves it alone")
            else:
                for fr, size in self.sampler.allocations():
                    if fr is None:
                        self.spool.event(f"A\t\t\t0\t{size}\n")
                    else:
                        self.spool.event(f"A\t{_esc(fr[0])}\t{_esc(fr[1])}\t{fr[2]}\t{size}\n")
        self.spool.event(f"Z\t{time.perf_counter_ns()}\n")
        self.spool.flush()

    def _check_gpu(self) -> None:
        """Say once that this process uses CUDA (through torch), so GPU energy goes to it."""
        if self._gpu:
            return
        torch = sys.modules.get("torch")
        try:
            used = torch is not None and torch.cuda.is_initialized()
        except Exception:  # noqa: BLE001 - a half-imported torch
            used = False
        if used:
            self._gpu = True
            self.spool.event(f"G\t{time.perf_counter_ns()}\n")

    def note(self, message: str) -> None:
        self.spool.event(f"N\t{_esc(message)}\n")

    # -- the Profiler-like surface the program may use -----------------------------------
    def begin_window(self, name: str, index: int | None = None) -> int:
        """Mark a window's start; returns its time (perf_counter_ns), as the profile will hold it."""
        self._cuda_sync()
        t = time.perf_counter_ns()
        self.spool.event(f"W\tb\t{t}\t{_esc(str(name))}\t{'' if index is None else int(index)}\n")
        return t

    def end_window(self, name: str | None = None, reply: bool = False, facts: dict[str, float] | None = None) -> int:
        """Mark a window's end; with `reply`, the supervisor writes its figures back (`_Replies`);
        `facts`: numbers measured about the span (a tracked loop's pipeline time), kept with it."""
        self._cuda_sync()
        t = time.perf_counter_ns()
        more = "\t" + ";".join(f"{_esc(str(k))}={float(v)!r}" for k, v in facts.items()) if facts else ""
        self.spool.event(f"W\te\t{t}\t{_esc('' if name is None else str(name))}\t{'r' if reply else ''}{more}\n")
        return t

    def window(self, name: str, index: int | None = None) -> Any:
        return _Window(self, name, index)

    def measure(self) -> Any:
        """The run so far, as far as this process can know it: its time only (the supervisor
        holds the energy; windows get theirs back)."""
        from ..measurement import Measurement

        return Measurement(name="<run>", time_s=(time.perf_counter_ns() - self._t_start) / 1e9, energy_j=None,
                           program_energy_j=None, complete=False,
                           note="under `python -m energyprof` the run's energy is the supervisor's: use windows")

    @property
    def running(self) -> bool:
        return _agent is self

    def _cuda_sync(self) -> None:
        if self.sync:
            torch = sys.modules.get("torch")
            try:
                if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - a boundary is never worth the program's run
                pass


class _Window:
    """A window of a supervised program. Its energy is charged by the supervisor, from sensors
    read once for the whole job; once charged, the supervisor writes the window's figures back
    (`reply_windows`), and the Measurement takes them on the first read of a figure, waiting
    at most REPLY_WAIT_S for them."""

    def __init__(self, agent: Agent, name: str, index: int | None) -> None:
        self.agent, self.name, self.index = agent, name, index
        self._t0 = 0

    def __enter__(self) -> Any:
        from ..measurement import Measurement

        self.m = Measurement(name=str(self.name), index=self.index)
        self._t0 = self.agent.begin_window(self.name, self.index)
        return self.m

    def __exit__(self, *exc: Any) -> None:
        t0, t1 = self._t0, self.agent.end_window(self.name, reply=True)
        self.m.time_s = (t1 - t0) / 1e9
        self.m.defer(lambda m: self.agent.replies.fill(m, t0, t1))
        if self.agent.config.get("mlflow") == "1":  # live, in this process: the program's active run
            try:
                from ..integrations.mlflow import log_window

                log_window(self.m, self.name, self.index)
            except Exception as exc:  # noqa: BLE001 - logging is never worth the program's run
                self.agent.note(f"a window could not be logged to MLflow: {type(exc).__name__}: {exc}")


REPLY_SUFFIX = ".windows"
REPLY_WAIT_S = 1.0  # more hops than in-process: the spool flush (20 ms), a tick, the release of its samples
REPLY_POLL_S = 0.005
SUPERVISED_NOTE = ("the supervisor had not charged this window within {wait:g} s: its figures are in the saved"
                   " profile (energyprof.Monitor measures windows in the program itself)")


def window_reply(ledger: Any, w: dict[str, Any]) -> str:
    """One charged window's figures as a line of `<spool>/<pid>.windows` (the supervisor writes it)."""
    def row(values: list[float]) -> str:
        return ",".join(repr(float(v)) for v in values)

    estimated = any(src.get("method") == "estimated" for src in ledger.sources)
    return (f"{w['start_ns']}\t{w['end_ns']}\t{1 if estimated else 0}\t{','.join(ledger.source_ids)}\t"
            f"{row(w['energy'])}\t{row(w.get('program') or [])}\t{row(w.get('program_all') or [])}\n")


class _Replies:
    """This process's side of the window back-channel: reads the supervisor's lines as they come."""

    def __init__(self, config: dict[str, str], pid: int) -> None:
        self.path = os.path.join(config.get("spool", ""), f"{pid}{REPLY_SUFFIX}")
        self.share = config.get("idle", "share") == "share"
        carbon = config.get("carbon", "")
        try:
            g, pue = (float(x) for x in carbon.split(","))
            self.carbon: tuple[float | None, float] = (g, pue)
        except ValueError:
            self.carbon = (None, 1.0)
        self.offset = 0
        self.seen: dict[tuple[int, int], list[str]] = {}

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        for line in data[:end].decode("utf-8", "replace").split("\n"):
            f = line.split("\t")
            if len(f) == 7:
                self.seen[(int(f[0]), int(f[1]))] = f[2:]

    def fill(self, m: Any, t0: int, t1: int) -> None:
        deadline = time.perf_counter() + REPLY_WAIT_S
        while (t0, t1) not in self.seen:
            self._read()
            if (t0, t1) in self.seen or time.perf_counter() >= deadline:
                break
            time.sleep(REPLY_POLL_S)
        f = self.seen.pop((t0, t1), None)
        if f is None:
            m.energy_j = m.program_energy_j = None
            m.complete, m.note = False, SUPERVISED_NOTE.format(wait=REPLY_WAIT_S)
            return
        ids = f[1].split(",") if f[1] else []

        def joules(text: str) -> dict[str, float]:
            return dict(zip(ids, (float(x) for x in text.split(",")))) if text else {}

        m.estimated = f[0] == "1"
        m.energy_j = joules(f[2])
        m.program_energy_j = joules(f[3] if self.share else f[4])
        m.intensity_g_per_kwh, m.pue = self.carbon
        m.complete = True


_agent: Agent | None = None
_fork_hook = False


def current() -> Agent | None:
    """The agent of this process (None in a forked child of an unfollowed process)."""
    a = _agent
    return a if a is not None and a.pid == os.getpid() else None


def start_agent(config: dict[str, str]) -> Agent:
    """Start sampling this process for the supervisor (called by the bootstrap)."""
    global _agent, _fork_hook
    main = config.get("parent") == str(os.getppid())
    if config.get("follow", "1") != "1":
        _unfollow_children()
    view = View() if main else View(pid=os.getpid())
    agent = Agent(config, view, forked=False)
    if config.get("memory") == "exact":
        import tracemalloc

        if not tracemalloc.is_tracing():
            tracemalloc.start(1)
    _agent = agent
    agent.start()
    import atexit

    atexit.register(_at_exit)
    if config.get("follow", "1") == "1" and not _fork_hook:
        os.register_at_fork(after_in_child=_after_fork_child)
        _fork_hook = True
    return agent


def _unfollow_children() -> None:
    """--no-follow: the program's children start without a sampler (as without energyprof)."""
    env = os.environ
    env.pop("ENERGYPROF_AGENT", None)
    boot = os.path.join(PACKAGE_DIR, "agent", "_boot")
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if os.path.normpath(p) != boot]
    if any(parts):
        env["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        env.pop("PYTHONPATH", None)


def _at_exit() -> None:
    a = current()
    if a is not None:
        a.stop(getattr(sys, "last_exc", None) or getattr(sys, "last_value", None))


def _after_fork_child() -> None:
    """A forked child: a fresh sampler and spool (threads do not survive fork)."""
    global _agent
    parent = _agent
    if parent is None:
        return
    _agent = None
    parent.spool.buf = []  # the parent's to write, not this copy's
    if isinstance(parent.sampler, HookSampler):
        try:
            parent.sampler._hook.unsubscribe(parent.sampler._on_sample)
        except Exception:  # noqa: BLE001
            pass
    try:
        codes = codes_of(sys._getframe(1))
        label = _dataloader_label(sys._getframe(1))
        view = View(pid=os.getpid(), fork_frames=filtered(codes), parent=parent.view)
        agent = Agent(parent.config, view, forked=True)
        _agent = agent
        agent.start(label)
    except Exception:  # noqa: BLE001 - never break the program's fork
        _agent = None


def _dataloader_label(frame: FrameType | None) -> str:
    """`[DataLoader worker N]` when this fork starts a torch DataLoader worker."""
    while frame is not None:
        if frame.f_code.co_name in ("start", "_launch", "_Popen", "__init__") and "multiprocessing" in frame.f_code.co_filename:
            proc = frame.f_locals.get("process_obj") or frame.f_locals.get("self")
            target = getattr(proc, "_target", None)
            if getattr(target, "__name__", "") == "_worker_loop" and "torch" in getattr(target, "__module__", ""):
                try:
                    names = target.__code__.co_varnames
                    kwargs = getattr(proc, "_kwargs", {}) or {}
                    wid = kwargs["worker_id"] if "worker_id" in kwargs else proc._args[names.index("worker_id")]
                    return f"[DataLoader worker {int(wid)}]"
                except (ValueError, IndexError, TypeError, KeyError):
                    return "[DataLoader worker]"
        frame = frame.f_back
    return ""
