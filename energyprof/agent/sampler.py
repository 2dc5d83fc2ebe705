"""The stack sampler that runs inside every profiled process.

One thread, started with the low-level `_thread` module so the program never sees it
(`threading.enumerate()`, `active_count()`, interpreter exit; it shows in /proc/PID/task
and in a faulthandler dump of all threads), reads every thread's stack each `interval`
with each thread's CPU time and the process's RSS, and hands them to a sink: the in-process
collector (decorator, `with` block) or a spool (`spool.py`) that the supervisor reads.

Standard library only and nothing of energyprof's outside `agent/`, so the bootstrap can
load it by path before the program's folder is on `sys.path`. `threading` is not imported
(a program that never imports it does not get it): threads are named from its table when the
program has one. The clocks and `time.sleep` are taken at import, so a program that patches
them (a test's mock, then a fork) never changes how the sampler waits or measures.

Its parts: `stacks.py` names a stack (which frames are the program's, under which node),
`thread_book.py` keeps the books of the program's threads (CPU clocks, groups, the ones that
end), `own_charge.py` takes energyprof's work on the program's threads off their CPU. Their
names are bound here at import: the per-tick loop looks each up once, as a global.
"""

from __future__ import annotations

import _thread
import os
import sys
import time
from types import CodeType, FrameType

from .modules import candidate as _candidate
from .modules import module_of as _module_of
from .modules import stack_names as _stack_names
from .own_charge import OwnCharge, _charged, _charged_by
from .own_charge import charge_own as charge_own  # the kernel capture finds it here (agent/kernel_capture.py)
from .own_threads import start as start_own_thread
from .qualnames import learn, qualname
from .stacks import KEEP, PACKAGE_DIR, STOP, Frame, View, filtered, frame_kind
from .units import running_codes, running_frames, running_threads, unit_of
from .thread_book import (
    ThreadBook, _code_of, _depart_310, _departures, _hook_departures, _hooked, _keep_active_hooked, _names, _outermost,
    _own_ns, _printable, _running, _starting, _targets, _threading_table, main_thread_ident
)

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

_LEARN_NAMES = sys.version_info < (3, 11)  # 3.10's code objects have no co_qualname (qualnames.py)

FLUSH_NS = 20_000_000  # a SIGKILL loses at most this much of a spooled stream (one write each)
# A process whose main thread is blocked waiting for its child (subprocess's wait, a
# multiprocessing join) and that used no CPU meanwhile runs nothing to sample: it is sampled
# at this period until it moves (each wake costs tens of microseconds of CPU; a parent
# waiting for a followed child would otherwise cost ~1 % of that child's core).
CHILD_WAIT_S = 0.05
_CHILD_WAITS = {("subprocess.py", "_try_wait"), ("popen_fork.py", "poll")}

_STATM = "/proc/self/statm"
_HAVE_STATM = os.path.exists(_STATM)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_RDONLY = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
# Taken once, at import: what the program later does to `time` is its own business.
_sleep, _perf, _proc_ns = time.sleep, time.perf_counter_ns, time.process_time_ns


# Samples inside backward() while the op capture records (agent/kernel_capture.py sets `_captured[0]` to a
# list, and takes it at the cycle's end): (sample number, the span its CPU was measured over: the last tick's
# perf ns, this tick's). Bounded: past it, samples stay plain.
_captured: list[list[tuple[int, int, int]]] = []
_captured_base = [0]  # the first number of the current cycle's block (MAX_CAPTURED numbers a cycle)
MAX_CAPTURED = 4096
_ENGINE, _ENGINE_FILE = "_engine_run_backward", os.sep + os.path.join("autograd", "graph.py")


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


class Sampler(ThreadBook, OwnCharge):
    """Samples every thread's stack each `interval_s` and reports to `sink`.

    The sink gets `frame(fid, frame)` and `stack(sid, fids)` once per new entry, then per
    tick `tick(t0, t1, process_cpu, own_cpu, rss)` followed by `sample(sid, cpu, main)` for
    each thread, and `flush()` at most every FLUSH_NS.

    Thread CPU clocks are keyed by the kernel's thread id, never by `ident`: Python reuses an
    ident as soon as its thread ends, and a clock cached under it would read the dead thread.
    A thread's clock starts at zero when the thread starts, so the CPU a new thread burnt
    before its first sample is its own, not the main thread's.
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
        self.main_ident = main_ident if main_ident is not None else main_thread_ident()
        self._frame_ids: dict[Frame, int] = {}
        self._stack_ids: dict[tuple[int, ...], int] = {}
        self._sid_cache: dict[tuple[int, ...], int] = {}
        self._fids: dict[int, tuple[int, ...]] = {}  # stack id -> its frame ids
        self._codes: dict[int, CodeType] = {}  # keeps code objects alive so ids stay unique
        self._last_cpu: dict[int, int] = {}  # native thread id -> its CPU clock at the last tick
        self._last_sid: dict[int, int] = {}  # native thread id -> the stack it ran at its last sample
        self._bootstrap_sids: set[int] = set()  # a thread's stacks that are only `threading`'s frames
        self._unit_sids: set[int] = set()  # stacks that may run a web request (agent/units.py): their samples say which
        self._stop = False
        self._done = _thread.allocate_lock()
        self._wake = _thread.allocate_lock()  # released by stop(): ends a CHILD_WAIT_S wait at once
        self._wake.acquire()
        self._statm: int | None = None
        self._statm_id: tuple[int, int] | None = None
        self.own_cpu_ns = 0  # this thread's CPU plus the CPU charged to energyprof since it started
        self._charges_seen: dict[int, int] = {}  # `_charged_by` as this sampler last read it
        self._owed: dict[int, int] = {}  # kernel thread id -> CPU ns charged to energyprof not yet taken off it
        self._taken = 0  # charged CPU ns taken off the program's threads so far
        self._charged_in = 0  # charged CPU ns read so far (what is not taken yet is owed)
        self._charged_seen = 0  # `_charged` as this sampler last read it (no change: no charge to read)
        self.ident: int | None = None
        self.native_id: int | None = None
        self.failed: BaseException | None = None
        self.every_second = every_second  # called on the sampler's thread, soon after start, then once a second
        # Threads per group node (`[threads: T xN]`): each thread is counted once, when first seen
        # running or, if it ended between two ticks, as it departs. A live thread is keyed by its
        # kernel id (`ident` where it has none), forgotten once it is gone, so a reused id counts again.
        self._counted: dict[Any, int] = {}  # live thread's key -> its group's head stack
        self._thread_counts: dict[int, int] = {}  # group's head stack (local sid) -> threads so far
        self._group_sids: dict[str, int] = {}  # thread name -> its group's head stack
        self._count_sink = getattr(sink, "threads", None)
        # Called each tick until it returns True (a spawned multiprocessing child learning its role).
        self.watch: Callable[[], bool] | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._done.acquire()
        # From now on, not from this thread's first tick: a thread the program starts at once (and that
        # may end before that tick) is noted as it starts and reports as it ends.
        if _threading_table() and not _hooked:
            _hook_departures()
        _running.append(self)
        try:
            start_own_thread(self._run)
        except BaseException:
            _running.remove(self)
            self._done.release()
            raise

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after one last sample and a flush; wait at most `timeout` seconds."""
        self._stop = True
        try:
            self._wake.release()
        except RuntimeError:  # released already
            pass
        if self._done.acquire(timeout=timeout):
            self._done.release()
            self._close_statm()

    @property
    def running(self) -> bool:
        return self._done.locked()

    def _rss(self) -> int:
        """This process's RSS from /proc/self/statm; 0 where unreadable.

        The descriptor is kept (one pread a sample) but checked before each use: the program
        may close any descriptor and get the number back for a file of its own, which is then
        never read here, and never closed (the number is forgotten, not closed)."""
        if not self.rss:
            return 0
        fd = self._statm
        try:
            if fd is None or _identity(fd) != self._statm_id:
                fd = self._statm = os.open(_STATM, _RDONLY)
                self._statm_id = _identity(fd)
            return int(os.pread(fd, 128, 0).split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            self._statm = None
            return 0

    def _close_statm(self) -> None:
        fd, self._statm = self._statm, None
        try:
            if fd is not None and _identity(fd) == self._statm_id:
                os.close(fd)
        except OSError:
            pass

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.ident = _thread.get_ident()
            self.native_id = _thread.get_native_id()
            self.own_idents.add(self.ident)
            if self not in _running:
                _running.append(self)
            prev_t, prev_proc = _perf(), _proc_ns()
            self._charged_seen = _charged[0]
            self._charges_seen = dict(_charged_by)  # charged before this sampler ran: not its to take
            own_thread = self.own_cpu_ns = _own_ns()
            if self.view.pid is not None and prev_proc > self.own_cpu_ns:
                # A followed child's CPU before this thread ran (its interpreter's start-up; for a fork, the
                # at-fork hooks) is its own: its process node's, just before the first tick, where its clock
                # enters the job's CPU. Otherwise no sample would carry it.
                self.sink.tick(prev_t - 1, prev_t, prev_proc, self.own_cpu_ns, self._rss())
                self.sink.sample(self.intern(self.view.main([])), prev_proc - self.own_cpu_ns, True)
            self._thread_cpu_deltas(sys._current_frames(), first=True)
            _departures.clear()
            last_flush = last_second = prev_t
            # The periodic check (does this process use CUDA yet?) starts every 50 ms and backs
            # off to once a second: a trainer that starts CUDA at once is known at once.
            period = 50_000_000
            interval = self.interval_s
            waiting = False
            while True:
                stopping = self._stop
                if not stopping:
                    if waiting:
                        self._wake.acquire(timeout=CHILD_WAIT_S)
                    else:
                        _sleep(interval)
                now = _perf()
                frames = sys._current_frames()
                proc = _proc_ns()
                before, own_thread = own_thread, _own_ns()
                # The program's CPU with what it burnt for energyprof still in: `_one` takes that off
                busy = self._one(prev_t, now, frames, proc - prev_proc - (own_thread - before), proc, own_thread)
                if self.watch is not None and self.watch():
                    self.watch = None
                main = frames.get(self.main_ident)
                waiting = (interval < CHILD_WAIT_S and 100 * busy < now - prev_t and main is not None
                           and (os.path.basename(main.f_code.co_filename), main.f_code.co_name) in _CHILD_WAITS)
                del frames, main
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
            if self in _running:
                _running.remove(self)
            if not _running:
                _departures.clear()
            self._done.release()

    def _one(self, t0: int, t1: int, frames: dict[int, FrameType], d_proc: int, proc: int, own_thread: int) -> int:
        """One tick: `d_proc` is the process's CPU since the last one less this thread's; returns the
        program's (less what it burnt for energyprof)."""
        table = _threading_table()
        if table and not _hooked:
            _hook_departures()
        elif _depart_310 and type(table) is dict and table:
            _keep_active_hooked()
            table = _threading_table()
        deltas, nids, departed = self._thread_cpu_deltas(frames, table)
        native = d_proc - sum(deltas.values()) - sum(cpu for _, _, cpu in departed)
        taken = self._taken
        if self._owed or _charged[0] != self._charged_seen:
            native, departed = self._take_charges(deltas, nids, departed, native)
        if departed and _charged_by:
            self._forget_charges(departed)
        self.own_cpu_ns = own_thread + self._charged_in
        rss = self._rss()
        sink = self.sink
        sink.tick(t0, t1, proc, self.own_cpu_ns, rss)
        main_sample = None
        own = self.own_idents
        last_sid = self._last_sid
        counted = self._counted
        live: list[Any] = []
        unit_sids = self._unit_sids
        for ident, frame in frames.items():
            if ident in own:
                continue
            if ident not in table and ident not in _names and ident != self.main_ident and _starting(frame):
                continue  # caught before `threading` lists it: none of its CPU measured yet, nothing of the program's run
            sid = self._stack_id(ident, frame, table)
            if _captured and frame.f_code.co_name == _ENGINE and frame.f_code.co_filename.endswith(_ENGINE_FILE):
                sid = self._captured_sample(sid, t0, t1)
            cpu = deltas.get(ident, 0)
            unit = unit_of(ident, frame) if sid in unit_sids else running_threads.get(ident, -1) if running_threads else -1
            if ident == self.main_ident:
                main_sample = (sid, cpu, unit)
                continue
            nid = nids.get(ident)
            # A thread past its `_delete` (its last microseconds) was counted when seen or as it departed.
            if nid is not None or ident in table or ident not in _names:
                # Keyed by its kernel id even with no clock read this tick: a thread between its
                # departure and `threading` dropping it is live here and departed below, counted once.
                known = nid if nid is not None else getattr(table.get(ident), "native_id", None)
                key = known if known is not None else ("ident", ident)
                live.append(key)
                if key not in counted:
                    counted[key] = self._count_thread(self._thread_name(ident, table, _outermost(frame)))
            if nid is not None:
                code = _code_of(nid, table.get(ident))
                if cpu > 0 and code is not None and sid in self._bootstrap_sids:
                    # Caught in `threading`'s own frames (starting, or ending) with CPU since the last
                    # tick: that CPU ran its target in between.
                    sid = self._target_sid(ident, code, table)
                last_sid[nid] = sid
            if unit < 0:
                sink.sample(sid, cpu, False)
            else:
                sink.sample(sid, cpu, False, unit)
        self._departed(departed, live)
        if main_sample is not None:
            sid, cpu, unit = main_sample
            if unit < 0:
                sink.sample(sid, cpu + max(0, native), True)
            else:
                sink.sample(sid, cpu + max(0, native), True, unit)
        return d_proc - (self._taken - taken)

    def _departed(self, departed: list[tuple[int, str, int]], live: list[Any]) -> None:
        """The threads that ended since the last tick: counted (once), and their last CPU sampled."""
        counted, last_sid, sink = self._counted, self._last_sid, self.sink
        for nid, name, _ in departed:
            if counted.pop(nid, None) is None:  # it ran and ended between two ticks: never seen live
                self._count_thread(_printable(name))
        if len(counted) > len(live):
            alive = set(live)
            for key in [k for k in counted if k not in alive]:
                del counted[key]  # gone without a word (a `_thread` thread): its id may come back as another
        for nid, name, cpu in departed:
            # What it burnt after its last sample goes to that sample's stack (a thread never sampled: to the
            # function it ran, under its group). A thread last caught in `threading`'s own frames (starting,
            # or ending) ran its target in between: that is where its CPU goes.
            sid = last_sid.pop(nid, None)
            code = _targets.pop(nid, None)
            if sid is None or (code is not None and sid in self._bootstrap_sids):
                sid = self.intern(self.view.thread(_printable(name), filtered([code]) if code is not None else []))
            sink.sample(sid, cpu, False)

    def _stack_id(self, ident: int, frame: FrameType, table: dict[int, Any] | None = None) -> int:
        if _LEARN_NAMES:
            learn(frame)
        codes: list[CodeType] = []
        mods: list[FrameType] | None = None  # frames that may run a module's forward (named by its path)
        candidate = _candidate
        f: FrameType | None = frame
        while f is not None:
            code = f.f_code
            codes.append(code)
            if candidate(code):
                if mods is None:
                    mods = []
                mods.append(f)
            f = f.f_back
        main = ident == self.main_ident
        name = None
        if not main:
            name = self._thread_name(ident, table if table is not None else _threading_table(), codes[-1])
        key: tuple[Any, ...] = (main, name, *map(id, codes))
        held: list[Any] = []
        if mods is not None:  # two instances of one class run the same code: the modules are in the key
            held = [_module_of(m) for m in mods]
            key += tuple(map(id, held))
        sid = self._sid_cache.get(key)
        if sid is None:
            for c in codes:
                self._codes[id(c)] = c
            codes.reverse()
            names = _stack_names(codes, mods, held) if mods is not None else None
            if main:
                anchor = self.view.anchor
                frames = self.view.main(filtered(codes[anchor:], names[anchor:] if names is not None else None))
            else:
                own_frames = filtered(codes, names)
                # `threading`'s bootstrap is the same for every thread: the group's functions start at its target.
                k = 0
                while k < len(own_frames) - 1 and os.path.basename(own_frames[k][1]) == "threading.py":
                    k += 1
                if k < len(own_frames) and os.path.basename(own_frames[k][1]) != "threading.py":
                    own_frames = own_frames[k:]
                frames = self.view.thread(name, own_frames)  # type: ignore[arg-type]
            sid = self.intern(frames)
            if running_codes and any(id(c) in running_codes for c in codes):
                # a stack that may run a web request on an event loop: its samples say which (a thread a request
                # holds, a WSGI server's or a pool worker's, says so whatever its stack)
                self._unit_sids.add(sid)
            if not main and all(os.path.basename(f[1]) == "threading.py" for f in own_frames):
                self._bootstrap_sids.add(sid)
            self._sid_cache[key] = sid
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
            frame = (qualname(code), code.co_filename, code.co_firstlineno)
            for _, _, line in code.co_lines():
                if line is not None:
                    where.setdefault((code.co_filename, line), frame)
        out: dict[Frame | None, int] = {}
        for stat in snap.statistics("lineno"):
            tb = stat.traceback[0]
            key = where.get((tb.filename, tb.lineno))
            out[key] = out.get(key, 0) + stat.size
        return list(out.items())

    def _captured_sample(self, sid: int, t0_ns: int, t1_ns: int) -> int:
        """A sample inside backward() while the op capture records: a stack of its own, `... > [backward] >
        [sample] k`, and the span its CPU was measured over kept for the capture, which names the backward ops
        that ran in it (agent/kernels/reduce.py); the tree puts its joules on their forward paths by their time
        in the span (core/backward.py)."""
        box = _captured[0]
        if len(box) >= MAX_CAPTURED:
            return sid
        k = len(box) + _captured_base[0]
        fids = self._fids.get(sid)
        if fids is None:
            return sid
        box.append((k, t0_ns, t1_ns))
        extra = []
        for fr in (("[backward]", "", 0), ("[sample]", "", k)):
            fid = self._frame_ids.get(fr)
            if fid is None:
                fid = self._frame_ids[fr] = len(self._frame_ids)
                self.sink.frame(fid, fr)
            extra.append(fid)
        key = fids + tuple(extra)
        new = self._stack_ids.get(key)
        if new is None:
            new = self._stack_ids[key] = len(self._stack_ids)
            self._fids[new] = key
            self.sink.stack(new, key)
        return new

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
            self._fids[sid] = key
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

        self._hook = get_stack_sampler()
        self._last = (_perf(), _proc_ns())
        self._flushed = self._last[0]
        self._cache: dict[tuple[str, ...], int] = {}
        self._hook.subscribe(self._on_sample, desired_interval=self.interval_s, use_async_context=False)

    def stop(self, timeout: float = 5.0) -> None:
        try:
            self._hook.unsubscribe(self._on_sample)
        except Exception:  # noqa: BLE001 - already gone (an exception tore the hook down)
            pass
        self.sink.flush()
        self._close_statm()

    @property
    def running(self) -> bool:
        return False

    def _on_sample(self, call_stack: list[str], time_since_last_sample: float, async_state: Any) -> None:
        now, cpu = _perf(), _proc_ns()
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
        # called on the program's thread, inside its stack: the request running there, if any (agent/units.py)
        unit = unit_of(_thread.get_ident(), sys._getframe()) if running_frames or running_threads else -1
        if unit < 0:
            self.sink.sample(sid, cpu - cpu0, True)
        else:
            self.sink.sample(sid, cpu - cpu0, True, unit)
        self._last = (now, cpu)
        if self.watch is not None and self.watch():
            self.watch = None
        if now - self._flushed >= FLUSH_NS:
            self._flushed = now
            self.sink.flush()


