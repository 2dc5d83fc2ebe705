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
"""

from __future__ import annotations

import _thread
import os
import sys
import time
from types import CodeType, FrameType
from typing import Any, Callable

from .modules import candidate as _candidate
from .modules import is_wrapper as _is_wrapper
from .modules import module_of as _module_of
from .modules import stack_names as _stack_names
from .own_threads import start as start_own_thread
from .qualnames import learn, learn_function, qualname
from .units import units
from .wire import PROCESS_MARKER, THREAD_FRAME_PREFIX

_LEARN_NAMES = sys.version_info < (3, 11)  # 3.10's code objects have no co_qualname (qualnames.py)

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_RUNNER_FILES = {"<frozen runpy>", "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>"}
# energyprof files whose frames stand between user frames (wrappers): skipped, the stack goes on.
_TRANSPARENT = tuple(PACKAGE_DIR + p for p in (os.path.join("drive", "api.py"), "cli" + os.sep,
                                               "__main__.py", "torch.py", "integrations" + os.sep))

KEEP, SKIP, STOP = 0, 1, 2
FLUSH_NS = 20_000_000  # a SIGKILL loses at most this much of a spooled stream (one write each)
# A process whose main thread is blocked waiting for its child (subprocess's wait, a
# multiprocessing join) and that used no CPU meanwhile runs nothing to sample: it is sampled
# at this period until it moves (each wake costs tens of microseconds of CPU; a parent
# waiting for a followed child would otherwise cost ~1 % of that child's core).
CHILD_WAIT_S = 0.05
_CHILD_WAITS = {("subprocess.py", "_try_wait"), ("popen_fork.py", "poll")}

Frame = tuple[str, str, int]
_MP_BOOTSTRAP_FILES = tuple(os.sep + os.path.join("multiprocessing", f) for f in ("spawn.py", "forkserver.py"))

_STATM = "/proc/self/statm"
_HAVE_STATM = os.path.exists(_STATM)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_RDONLY = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
# Taken once, at import: what the program later does to `time` is its own business.
_sleep, _perf, _proc_ns, _own_ns = time.sleep, time.perf_counter_ns, time.process_time_ns, time.thread_time_ns
_clock_ns = getattr(time, "clock_gettime_ns", None)


# Samples inside backward() while the op capture records (agent/kernel_capture.py sets `_captured[0]` to a
# list, and takes it at the cycle's end): (sample number, perf ns). Bounded: past it, samples stay plain.
_captured: list[list[tuple[int, int]]] = []
_captured_base = [0]  # the first number of the current cycle's block (MAX_CAPTURED numbers a cycle)
MAX_CAPTURED = 4096
_ENGINE, _ENGINE_FILE = "_engine_run_backward", os.sep + os.path.join("autograd", "graph.py")

_charged = [0]  # CPU ns energyprof burnt on the program's threads (the kernel capture's reduction): its own
# The same, by the kernel id of the thread that burnt it (cumulative): a sampler takes each charge off
# that thread's CPU, not off the main thread's (a capture stepped on a training thread while the main
# thread waits in `join` burnt nothing there to take it from).
_charged_by: dict[int, int] = {}


def charge_own(ns: int) -> None:
    """Count `ns` of CPU, burnt on the calling program thread for energyprof, as energyprof's own: the
    samplers take it off that thread's CPU (at the next tick, or the next ones that hold enough of it)
    and add it to their own, so it leaves the program's figure for `[energyprof]`."""
    nid = _thread.get_native_id()
    _charged_by[nid] = _charged_by.get(nid, 0) + ns
    _charged[0] += ns


def _threading_table() -> dict[int, Any]:
    """ident -> Thread, when the program uses `threading` (never imported here)."""
    threading = sys.modules.get("threading")
    return getattr(threading, "_active", None) or {}


# Threads that ended since the last tick: (native id, name, CPU ns at the end), appended by
# each ending thread itself (list.append is atomic), taken by the sampler at its next tick.
_departures: list[tuple[int, str, int]] = []
_departures_hooked = False
# id(Thread) -> the code it runs (its target's, else its class's run), noted by `start` on the
# starting thread: a thread that ends between two ticks was never seen running it, and by its end
# `threading` has dropped the target. Its CPU goes to that function, not to a bare thread node.
_codes: dict[int, CodeType] = {}
# native id -> that code, handed over by an ending thread (`_delete`, on the thread itself)
_targets: dict[int, CodeType] = {}
# ident -> name, for a thread caught just after `threading` dropped it (its last microseconds run
# after `_delete`): it still belongs to its group. An ident is reused as soon as its thread ends.
_names: dict[int, str] = {}
_running: list[Sampler] = []  # the samplers of this process that take departures (none: nothing is kept)


def _forget_after_fork() -> None:
    """Threads, samplers included, do not survive a fork: neither do their books."""
    _running.clear()
    _departures.clear()
    _targets.clear()
    _codes.clear()
    _names.clear()
    _charged[0] = 0  # the parent's work charged to energyprof is the parent's, not this child's
    _charged_by.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


class _Active(dict):  # type: ignore[type-arg]
    """3.10's `threading._active`: its `_bootstrap_inner` drops the ending thread from it itself,
    without `_delete`, so the drop is where the thread reports. Never on the program's stacks
    while its threads run (a wrapper of `_bootstrap_inner` would be)."""

    __slots__ = ()

    def __delitem__(self, ident: int) -> None:
        thread = self.get(ident)
        if thread is not None and ident == _thread.get_ident() and _depart_310 is not None:
            _depart_310(thread)
        dict.__delitem__(self, ident)


_depart_310: Callable[[Any], None] | None = None


def _keep_active_hooked() -> None:
    """On 3.10, `threading._active` is an `_Active` (again after a fork, which rebuilds it)."""
    threading = sys.modules.get("threading")
    lock = getattr(threading, "_active_limbo_lock", None)
    if lock is None or type(getattr(threading, "_active", None)) is not dict:
        return
    with lock:
        if type(threading._active) is dict:  # type: ignore[union-attr]
            threading._active = _Active(threading._active)  # type: ignore[union-attr]


def _hook_departures() -> None:
    """Have each `threading` thread report its CPU as it ends (`Thread._delete` runs last,
    on the thread itself): a thread shorter than a few intervals may end between two ticks,
    and a dead thread's clock can no longer be read."""
    global _departures_hooked
    _departures_hooked = True
    thread_cls = getattr(sys.modules.get("threading"), "Thread", None)
    original = getattr(thread_cls, "_delete", None)
    if original is None:
        return

    def _depart(self: Any) -> None:
        nid = getattr(self, "_native_id", None)
        code = _codes.pop(id(self), None)
        if nid is not None and _running:
            if isinstance(self._name, str):
                _names[_thread.get_ident()] = self._name
            if code is not None:
                _targets[nid] = code
            _departures.append((nid, self._name if isinstance(self._name, str) else "", _own_ns()))

    if sys.version_info >= (3, 11):
        def _delete(self: Any) -> None:
            _depart(self)
            original(self)

        thread_cls._delete = _delete  # type: ignore[union-attr]
    else:
        global _depart_310
        _depart_310 = _depart
        _keep_active_hooked()
    start = getattr(thread_cls, "start", None)
    if start is None:
        return

    def _start(self: Any) -> None:
        # On the starting (caller's) thread, so no frame of energyprof's is ever on the new
        # thread's stack for the program to see (a stack it prints, faulthandler's dump).
        if _running:
            target = getattr(self, "_target", None)
            func = target if getattr(target, "__code__", None) is not None else getattr(type(self), "run", None)
            code = getattr(func, "__code__", None)
            if isinstance(code, CodeType):
                learn_function(func)  # type: ignore[arg-type]
                _codes[id(self)] = code
        start(self)

    thread_cls.start = _start  # type: ignore[union-attr]


def _code_of(nid: int, thread: Any) -> CodeType | None:
    """The code a thread runs: noted as it started (live), or handed over as it ended."""
    return _targets.get(nid) or (_codes.get(id(thread)) if thread is not None else None)


def _printable(name: str) -> str:
    """Any text may name a thread; the report shows it as Python's repr would (a lone surrogate
    as \\udXXX) so no writer downstream can fail on it."""
    return name if name.isascii() else name.encode("utf-8", "backslashreplace").decode("utf-8")


def _starting(frame: FrameType) -> bool:
    """Whether a thread's stack is only `threading`'s frames and energyprof's hooks in them (it
    has not reached its target yet, or has left it)."""
    f: FrameType | None = frame
    while f is not None:
        name = f.f_code.co_filename
        if os.path.basename(name) != "threading.py" and name != __file__:
            return False
        f = f.f_back
    return True


def _outermost(frame: FrameType) -> CodeType:
    while frame.f_back is not None:
        frame = frame.f_back
    return frame.f_code


def _runs(code: CodeType) -> str:
    """A thread's name for the function it runs, when it has none of its own."""
    return qualname(code)


def thread_group(name: str) -> str:
    """What a thread runs, from its name: threads of one target or one numbered role share a node."""
    # "Thread-7 (burn_in_thread)": the name `threading` gives a thread started with a target.
    if name.startswith("Thread-") and name.endswith(")") and " (" in name:
        number, _, target = name[7:-1].partition(" (")
        if number.isdigit() and target:
            return target
    # "worker-3", "ThreadPoolExecutor-0_3", "Thread-4": one role's threads, numbered.
    base = name.rstrip("0123456789-_ .#")
    return base if base and base != name and name[len(base):].lstrip("-_ .#")[:1].isdigit() else name


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def main_thread_ident() -> int:
    threading = sys.modules.get("threading")
    return threading.main_thread().ident if threading is not None else _thread.get_ident()


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


def filtered(codes: list[CodeType], names: list[str | None] | None = None) -> list[Frame]:
    """The frames of a stack (outermost first) that belong to the profile; `names`: a module's name for
    its `forward` frame (agent/modules.py), None elsewhere. torch's module-call wrappers go."""
    out: list[Frame] = []
    for i, c in enumerate(codes):
        kind = frame_kind(c.co_filename)
        if kind == STOP:
            break
        if kind == SKIP or _is_wrapper(c):
            continue
        given = names[i] if names is not None else None
        out.append((given or qualname(c), c.co_filename, c.co_firstlineno))
    return units(out)


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
        # A multiprocessing spawn or forkserver child: the frames that bring it to its target (`-c`'s
        # <module>, spawn_main, _serve_one) are left out, so its stacks read as a forked child's.
        self.mp_bootstrap = False

    def main(self, frames: list[Frame]) -> list[Frame]:
        if self.pid is None:
            return frames
        if self.fork_frames is None or self.parent is None:
            return [marker(self.pid), *self._own(frames)]
        fork = self.fork_frames
        if not frames:  # nothing of the program's running (shutting down): the process itself
            return [*self.parent.main(fork), marker(self.pid)]
        c = 0
        n = min(len(fork), len(frames))
        while c < n and fork[c] == frames[c]:
            c += 1
        return [*self.parent.main(frames[:c]), marker(self.pid), *self._own(frames[c:])]

    def _own(self, frames: list[Frame]) -> list[Frame]:
        k = 0
        if self.mp_bootstrap:
            while k < len(frames) and (frames[k][1] == "<string>" or frames[k][1].endswith(_MP_BOOTSTRAP_FILES)):
                k += 1
        return frames[k:]

    def thread(self, name: str, frames: list[Frame]) -> list[Frame]:
        head = [(f"{THREAD_FRAME_PREFIX}{thread_group(name)}]", "", 0)]
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
        if _threading_table() and not _departures_hooked:
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
        if table and not _departures_hooked:
            _hook_departures()
        elif _depart_310 is not None and type(table) is dict and table:
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
        for ident, frame in frames.items():
            if ident in own:
                continue
            if ident not in table and ident not in _names and ident != self.main_ident and _starting(frame):
                continue  # caught before `threading` lists it: none of its CPU measured yet, nothing of the program's run
            sid = self._stack_id(ident, frame, table)
            if _captured and frame.f_code.co_name == _ENGINE and frame.f_code.co_filename.endswith(_ENGINE_FILE):
                sid = self._captured_sample(sid, t1)
            cpu = deltas.get(ident, 0)
            if ident == self.main_ident:
                main_sample = (sid, cpu)
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
            sink.sample(sid, cpu, False)
        for nid, name, _ in departed:
            if counted.pop(nid, None) is None:  # it ran and ended between two ticks: never seen live
                self._count_thread(_printable(name))
        if len(counted) > len(live):
            alive = set(live)
            for key in [k for k in counted if k not in alive]:
                del counted[key]  # gone without a word (a `_thread` thread): its id may come back as another
        for nid, name, cpu in departed:
            # A thread that ended since the last tick: what it burnt after its last sample goes
            # to that sample's stack (a thread never sampled: to the function it ran, under its group).
            # A thread last caught in `threading`'s own frames (starting, or ending) ran its target
            # in between: that is where its CPU goes.
            sid = last_sid.pop(nid, None)
            code = _targets.pop(nid, None)
            if sid is None or (code is not None and sid in self._bootstrap_sids):
                sid = self.intern(self.view.thread(_printable(name), filtered([code]) if code is not None else []))
            sink.sample(sid, cpu, False)
        if main_sample is not None:
            sink.sample(main_sample[0], main_sample[1] + max(0, native), True)
        return d_proc - (self._taken - taken)

    def _forget_charges(self, departed: list[tuple[int, str, int]]) -> None:
        """An ended thread's charges, all read, are forgotten: a server that starts a thread per request
        would otherwise pile up one entry per thread id, copied at every tick that charges. Kept where
        the id charged again since it was read (a new thread reusing it): read at the next tick."""
        seen = self._charges_seen
        for nid, _name, _cpu in departed:
            if nid in seen and _charged_by.get(nid) == seen[nid]:
                _charged_by.pop(nid, None)
                del seen[nid]

    def _take_charges(self, deltas: dict[int, int], nids: dict[int, int], departed: list[tuple[int, str, int]],
                      native: int) -> tuple[int, list[tuple[int, str, int]]]:
        """Take the CPU charged to energyprof (`charge_own`) off the thread that burnt it: a thread with its
        own clock here loses it from its delta, the main thread (and a `_thread` thread, whose CPU is the
        main thread's here) from `native`; the tick's own figure holds the charge as it is read.

        A charge comes after the work, which may have spanned ticks that already gave that CPU to the
        thread's samples (they cannot be taken back): what a tick's CPU cannot cover stays owed and is
        taken from the same thread's next CPU, never more than it burns. Taken off another thread, or
        dropped at zero, it was counted twice: in energyprof's figure and in the program's samples. What
        a thread still owes as it ends, or at the end of the run, stays counted twice (the charge says
        how much, not when: the work's own ticks would need it as it runs). Edits `deltas` in place."""
        owed = self._owed
        seen = self._charges_seen
        self._charged_seen = _charged[0]  # read first: a charge made from here on is read again next tick
        now = dict(_charged_by)  # one copy (atomic)
        for nid, total in now.items():
            new = total - seen.get(nid, 0)
            if new > 0 and nid != self.native_id:  # the sampler's own thread: its clock holds it already
                owed[nid] = owed.get(nid, 0) + new
                self._charged_in += new
        self._charges_seen = now
        taken = 0
        if owed:
            for ident, nid in nids.items():
                debt = owed.get(nid)
                if debt and ident in deltas:
                    take = min(debt, max(0, deltas[ident]))
                    deltas[ident] -= take
                    taken += take
                    owed[nid] = debt - take
            if departed:
                kept = []
                for nid, name, cpu in departed:
                    take = min(owed.pop(nid, 0), max(0, cpu))
                    taken += take
                    kept.append((nid, name, cpu - take))
                departed = kept
            clocked = set(nids.values())
            for nid in [n for n in owed if n not in clocked]:
                if native <= 0:
                    break
                take = min(owed[nid], native)  # the main thread's, or a thread with no clock here
                native -= take
                taken += take
                owed[nid] -= take
            for nid in [n for n, debt in owed.items() if debt <= 0]:
                del owed[nid]
        self._taken += taken
        return native, departed

    def _thread_cpu_deltas(self, frames: dict[int, FrameType], table: dict[int, Any] | None = None, first: bool = False
                           ) -> tuple[dict[int, int], dict[int, int], list[tuple[int, str, int]]]:
        """CPU ns each thread burnt since the last tick, by ident; each thread's native id; and
        (native id, name, CPU) of the threads that ended meanwhile.

        Neither the main thread's clock nor the sampler's is read (a syscall each, every tick):
        the sampler's CPU is taken off the process's by the caller, and the main thread gets
        what is left. A thread `threading` does not know (started with `_thread`) has no native
        id here: its CPU stays in the process's and goes to the main thread's stack.
        """
        out: dict[int, int] = {}
        nids: dict[int, int] = {}
        departed: list[tuple[int, str, int]] = []
        if _clock_ns is None:
            return out, nids, departed
        if table is None:
            table = _threading_table()
        last = self._last_cpu
        seen: dict[int, int] = {}
        gone = set()
        while _departures:
            nid, name, final = _departures.pop()
            gone.add(nid)
            if not first:
                departed.append((nid, name, max(0, final - last.get(nid, 0))))
            else:  # it ended before this sampler's first reading: its CPU precedes the profile, but it ran in it
                _targets.pop(nid, None)
                self._count_thread(_printable(name))
        skip = (self.ident, self.main_ident)
        for ident in frames:
            if ident in skip:
                continue
            nid = getattr(table.get(ident), "native_id", None)
            if nid is None or nid in gone:
                continue
            try:
                now = _clock_ns(thread_clock_id(nid))
            except OSError:
                continue  # the thread has ended
            seen[nid] = now
            nids[ident] = nid
            if not first:
                out[ident] = now - last.get(nid, 0)
        self._last_cpu = seen  # ended threads drop out: a reused native id starts again from zero
        if len(self._last_sid) > 2 * len(seen) + 64:
            self._last_sid = {n: sid for n, sid in self._last_sid.items() if n in seen}
        return out, nids, departed

    def _target_sid(self, ident: int, code: CodeType, table: dict[int, Any]) -> int:
        name = getattr(table.get(ident), "_name", None) or _names.get(ident) or _runs(code)
        return self.intern(self.view.thread(_printable(name), filtered([code])))

    @staticmethod
    def _thread_name(ident: int, table: dict[int, Any], outermost: CodeType) -> str:
        """A thread's name as its stacks show it. One started with `_thread` (not `threading`) has
        none: it is known by what it runs, its outermost function, as the threads of one target are."""
        thread = table.get(ident)
        name = getattr(thread, "_name", None) if thread is not None else _names.get(ident)
        return _printable(name) if isinstance(name, str) else _runs(outermost)

    def _count_thread(self, name: str) -> int:
        """One more thread in `name`'s group; the group's head stack (its count goes to the sink)."""
        sid = self._group_sids.get(name)
        if sid is None:
            sid = self._group_sids[name] = self.intern(self.view.thread(name, []))
        n = self._thread_counts[sid] = self._thread_counts.get(sid, 0) + 1
        if self._count_sink is not None:
            self._count_sink(sid, n)
        return sid

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

    def _captured_sample(self, sid: int, t_ns: int) -> int:
        """A sample inside backward() while the op capture records: a stack of its own, `... > [backward] >
        [sample] k`, and its instant kept for the capture, which names the backward op running then
        (agent/kernels/reduce.py); the tree puts its joules on that op's forward path (core/backward.py)."""
        box = _captured[0]
        if len(box) >= MAX_CAPTURED:
            return sid
        k = len(box) + _captured_base[0]
        fids = self._fids.get(sid)
        if fids is None:
            return sid
        box.append((k, t_ns))
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
        self.sink.sample(sid, cpu - cpu0, True)
        self._last = (now, cpu)
        if self.watch is not None and self.watch():
            self.watch = None
        if now - self._flushed >= FLUSH_NS:
            self._flushed = now
            self.sink.flush()


