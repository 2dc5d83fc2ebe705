"""The agent of a supervised process: its sampler, its spool, and the window calls it serves.

The bootstrap calls `start_agent` in every Python process of a run of `python -m energyprof`.
What the program may call (`window`, `begin_window`, `end_window`, `measure`) is reached
through `energyprof.drive.profiler.active_profiler()`, which hands in the Measurement class:
nothing of energyprof's outside `agent/` is imported here (with `--mlflow` the supervisor logs the
windows; the program's process never imports MLflow for energyprof).
"""

from __future__ import annotations

import _thread
import os
import sys
import time
from typing import TYPE_CHECKING, Any

# Names, never `from . import wire`: in a package the bootstrap loaded by path, a fromlist
# on the package goes through __import__, which would import energyprof's top package.
from .wire import (
    ENV, LABEL_PENDING, REPLY_SUFFIX, SPAWN_MAIN, SPOOL_SUFFIX, alloc as alloc_line, end as end_line, exception as exception_line,
    gpu as gpu_line, header as header_line, io_edge as io_line, note as note_line, parse_replies, role as role_line,
    window_begin, window_end
)
from .hooks import install as install_hooks
from .qualnames import learn
from .sampler import HookSampler, Sampler, View, _perf, _sleep, charge_own, codes_of, filtered
from .spool import Spool

if TYPE_CHECKING:
    from types import FrameType


class Agent:
    """What the bootstrap leaves in a profiled process: a sampler, a spool, window calls.

    `energyprof.drive.profiler.active_profiler()` returns it inside a program run by the
    supervisor, so `window`, `begin_window` and `end_window` (and `energyprof.torch`) mark
    windows in the run's profile.
    """

    def __init__(self, config: dict[str, str], view: View, forked: bool) -> None:
        self.config = config
        self.pid = os.getpid()
        self.view = view
        self.forked = forked
        name = f"{self.pid}-{_perf()}{SPOOL_SUFFIX}"
        self.spool = Spool(os.path.join(config["spool"], name))
        kind = HookSampler if config.get("sampler") == "pyinstrument" and not forked else Sampler
        self.sampler = kind(self.spool, float(config.get("interval", "0.01")), view,
                            rss=config.get("memory", "rss") != "off", alloc=config.get("memory") == "exact",
                            main_ident=_thread.get_ident() if forked else None, every_second=self._every_period)
        self._gpu = False
        self.kernels_auto = False  # the kernel capture starts once the program uses CUDA (on by default)
        self.sync = config.get("sync") == "cuda"
        self._t_start = _perf()
        self._stopped = False
        self._tail_written = False  # stop() ran to its end (a SIGTERM in the middle of it waits for it)
        self.replies = _Replies(config, self.pid)
        self._io: Any = None  # the window edges' I/O reader (`_io_edge`), made at the first edge: None, or False for none

    def start(self, label: str = "") -> None:
        env = os.environ
        try:
            fd = os.open(f"/proc/{self.pid}/cmdline", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                raw = os.read(fd, 1 << 16)
            finally:
                os.close(fd)
            cmd = " ".join(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a)
        except OSError:
            cmd = " ".join(sys.argv)
        if not self.forked and SPAWN_MAIN in cmd:
            label = LABEL_PENDING  # a multiprocessing spawn child: what it runs comes through a pipe, later
        if label == LABEL_PENDING:
            self.sampler.watch = self._learn_role
            self.view.mp_bootstrap = True
        self.spool.write(header_line(self.pid, os.getppid(), _perf(), self.forked, env.get("RANK", ""),
                                     env.get("LOCAL_RANK", ""), label, cmd))
        if self.sampler.rss and not self.forked:
            # The RSS before the program's first line, read here on its own thread: the sampler's thread
            # may first run after the program has begun, and what its first function took would be the
            # baseline. A forked child's sampler reads it at once (its parent's pages are its start).
            t = _perf()
            self.spool.tick(t - 1, t, time.process_time_ns(), 0, self.sampler._rss())
        self.spool.flush()  # the supervisor learns of this process at once
        self.sampler.start()

    def _learn_role(self) -> bool:
        """On the sampler's thread, each tick until it knows: a spawn or forkserver child's role, once
        multiprocessing made it the process object it unpickled (`BaseProcess._bootstrap`)."""
        proc = getattr(sys.modules.get("multiprocessing.process"), "_current_process", None)
        if proc is None or type(proc).__name__ == "_MainProcess":
            return False
        self.spool.event(role_line(_role_of(proc)))
        return True

    def stop(self, exc: BaseException | None = None) -> None:
        """The stream's tail: the last sample, what it knows at the end, the end record (once)."""
        if self._stopped:
            return
        self._stopped = True
        capture = getattr(sys.modules.get("energyprof.agent.kernel_capture"), "_capture", None)
        if capture is not None and getattr(capture, "live", False):
            try:
                capture.stop()  # its last cycle reduced into the stream before the end record
            except Exception:  # noqa: BLE001 - the stream ends all the same
                pass
        self.sampler.stop()
        if self.sampler.failed is not None:
            err = self.sampler.failed
            self.note(f"the sampler of process {self.pid} stopped early: {type(err).__name__}: {err}")
        if exc is not None and not isinstance(exc, SystemExit):
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.spool.event(exception_line(_perf(), text))
        if self.sampler.alloc:
            tm = sys.modules.get("tracemalloc")
            if tm is None or not tm.is_tracing() or tm.get_traceback_limit() != 1:
                self.note("memory=exact is off: the program runs tracemalloc itself, and energyprof leaves it alone")
            else:
                for fr, size in self.sampler.allocations():
                    self.spool.event(alloc_line(*(fr or ("", "", 0)), size))
        self.spool.event(end_line(_perf()))
        self.spool.flush()
        self._tail_written = True

    def _every_period(self) -> None:
        """The sampler thread's slow duties (every 50 ms, backing off to every second)."""
        if _term is not None:
            _term.rescue()
        self._check_gpu()
        if self.kernels_auto and not self._gpu and _torch_loaded():
            self.kernels_auto = False  # once: the capture on by default waits for the optimizer's first step
            _start_kernel_capture(self, self.config, auto=True)
        capture = sys.modules.get("energyprof.agent.kernel_capture")
        if capture is not None:  # the capture on by default: its optimizer hook, registered once safe
            capture.hook_when_safe()

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
            self.spool.event(gpu_line(_perf()))
            if self.kernels_auto:  # the capture on by default: the program uses CUDA through torch
                _start_kernel_capture(self, self.config, auto=True)

    def note(self, message: str) -> None:
        self.spool.event(note_line(message))

    _mlflow_run: str | None = None

    def note_mlflow_run(self) -> None:
        """--mlflow: the supervisor logs each window() block (on its own thread: MLflow's work is never the
        program's), into the program's active run if it has one. That run is this thread's, known only
        here, and only where the program imported mlflow itself: written down in the spool when it
        changes (`<pid>.mlflow-run`), before the window's end record, so the supervisor finds it there."""
        mlflow = sys.modules.get("mlflow")
        if mlflow is None:
            return
        try:
            active = mlflow.active_run()
            run = active.info.run_id if active is not None else ""
        except Exception:  # noqa: BLE001 - a stubbed or half-imported mlflow is no run
            return
        if run == (self._mlflow_run or "") or (not run and self._mlflow_run is None):
            return
        self._mlflow_run = run
        try:
            path = os.path.join(self.config["spool"], f"{self.pid}.mlflow-run")
            fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
            try:
                os.write(fd, run.encode())
            finally:
                os.close(fd)
            os.replace(path + ".tmp", path)
        except OSError:
            pass  # the window goes to energyprof's run

    # -- the Profiler-like surface the program may use -----------------------------------
    def begin_window(self, name: str, index: int | None = None, t_ns: int | None = None) -> int:
        """Mark a window's start; returns its time (perf_counter_ns), as the profile will hold it; `t_ns`:
        the start the caller read itself (the power-limit optimizer's edge)."""
        self._cuda_sync()
        t = _perf() if t_ns is None else int(t_ns)
        self.spool.event(window_begin(t, str(name), index))
        self._io_edge(t)
        return t

    def end_window(self, name: str | None = None, reply: bool = False, facts: dict[str, float] | None = None,
                   t_ns: int | None = None) -> int:
        """Mark a window's end; with `reply`, the supervisor writes its figures back (`_Replies`);
        `facts`: numbers measured about the span (a tracked loop's pipeline time), kept with it; `t_ns`: the
        end the caller read itself."""
        self._cuda_sync()
        t = _perf() if t_ns is None else int(t_ns)
        self.spool.event(window_end(t, None if name is None else str(name), reply, facts))
        self._io_edge(t)
        return t

    def _io_edge(self, t: int) -> None:
        """The I/O counters at a window's edge, read now (this process's /proc/self/io, then the disks the
        supervisor counts): a window's bytes are their differences at its own edges, not figures
        interpolated between the supervisor's ticks. About 20-35 us an edge, on the program's thread: that
        CPU is charged to energyprof (sampler.charge_own), not the program. The two reads still add to the
        program's rchar and syscr (two calls, a few hundred bytes an edge). Nothing is read where --io is off
        or the system has no such counters: the supervisor then hands no disks (`io_disks`) to the program."""
        if self._io is False:
            return
        t0 = time.thread_time_ns()
        try:
            self._io_read(t)
        finally:
            charge_own(time.thread_time_ns() - t0)

    def _io_read(self, t: int) -> None:
        io = self._io
        if io is None:
            names = self.config.get("io_disks")
            if names is None or not os.path.exists("/proc/self/io"):
                self._io = False
                return
            from .iostat import reading

            io = self._io = (reading, frozenset(n for n in names.split(",") if n))
        elif io is False:
            return
        proc, disks = io[0](io[1])
        if proc is not None or disks:
            self.spool.event(io_line(t, proc, disks))

    def window(self, name: str, index: int | None = None, reply_wait_s: float | None = None) -> Any:
        """`reply_wait_s`: the longest the first read of a figure waits for the supervisor's reply
        (REPLY_WAIT_S unless given: a budget's check waits longer, rather than go unchecked)."""
        return _Window(self, name, index, REPLY_WAIT_S if reply_wait_s is None else float(reply_wait_s))

    def measure(self) -> Any:
        """The run so far, as far as this process can know it: its time only (the supervisor
        holds the energy; windows get theirs back)."""
        return _handed["measurement"](name="<run>", time_s=(_perf() - self._t_start) / 1e9, energy_j=None,
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
    at most `wait_s` (REPLY_WAIT_S) for them."""

    def __init__(self, agent: Agent, name: str, index: int | None, wait_s: float) -> None:
        self.agent, self.name, self.index, self.wait_s = agent, name, index, wait_s
        self._t0 = 0

    def __enter__(self) -> Any:
        self.m = _handed["measurement"](name=str(self.name), index=self.index)
        self._t0 = self.agent.begin_window(self.name, self.index)
        return self.m

    def __exit__(self, *exc: Any) -> None:
        if self.agent.config.get("mlflow") == "1":  # the supervisor logs the block, into the program's run if any
            self.agent.note_mlflow_run()
        t0, t1 = self._t0, self.agent.end_window(self.name, reply=True)
        self.m.time_s = (t1 - t0) / 1e9
        self.m.defer(lambda m: self.agent.replies.fill(m, t0, t1, self.wait_s))


SIGTERM_LOCK_WAIT_S = 0.5
REPLY_WAIT_S = 1.0  # more hops than in-process: the spool flush (20 ms), a tick, the release of its samples
REPLY_POLL_S = 0.005
SUPERVISED_NOTE = ("the supervisor had not charged this window within {wait:g} s: its figures are in the saved"
                   " profile (energyprof.Monitor measures windows in the program itself)")


class _Replies:
    """This process's side of the window back-channel: reads the supervisor's lines as they come."""

    def __init__(self, config: dict[str, str], pid: int) -> None:
        self.path = os.path.join(config.get("spool", ""), f"{pid}{REPLY_SUFFIX}")
        carbon = config.get("carbon", "")
        try:
            g, pue = (float(x) for x in carbon.split(","))
            self.carbon: tuple[float | None, float] = (g, pue)
        except ValueError:
            self.carbon = (None, 1.0)
        self.offset = 0
        self.seen: dict[tuple[int, int], Any] = {}
        # Windows end in any of the program's threads: two reads from one offset would both move
        # it past what they read, and the lines after it were skipped.
        self._lock = _thread.allocate_lock()

    def _read(self) -> None:
        with self._lock:
            self._read_locked()

    def _read_locked(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return
        try:
            data = os.pread(fd, 1 << 24, self.offset)
        except OSError:
            return
        finally:
            os.close(fd)
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        self.seen.update(parse_replies(data[:end + 1]))

    def fill(self, m: Any, t0: int, t1: int, wait_s: float | None = None) -> None:
        if wait_s is None:
            wait_s = REPLY_WAIT_S  # read at the call: the module's figure as it stands then
        deadline = _perf() + int(wait_s * 1e9)
        while (t0, t1) not in self.seen:
            self._read()
            if (t0, t1) in self.seen or _perf() >= deadline:
                break
            _sleep(REPLY_POLL_S)
        with self._lock:
            f = self.seen.pop((t0, t1), None)
        if f is None:
            m.energy_j = m.program_energy_j = None
            m.complete, m.note = False, SUPERVISED_NOTE.format(wait=wait_s)
            return
        m.estimated, m.energy_j, m.program_energy_j = f  # the program's part under the run's policy, as the supervisor chose
        m.intensity_g_per_kwh, m.pue = self.carbon
        m.complete = True


_agent: Agent | None = None
_handed: dict[str, Any] = {}


def bound() -> bool:
    return "measurement" in _handed


def bind(measurement: Any) -> None:
    """Hand in what the window calls build: the Measurement class. `energyprof.drive.profiler` does
    it, in the program, where energyprof is imported anyway."""
    _handed["measurement"] = measurement


def current() -> Agent | None:
    """The agent of this process (None in a forked child of an unfollowed process)."""
    a = _agent
    return a if a is not None and a.pid == os.getpid() else None


def can_serve(spool: str) -> bool:
    """The spool is an absolute folder of this user's that no one else may read (mkdtemp's 0700).

    Anything else (a run that has ended and removed it, a relative path from a relative
    TMPDIR, a folder someone else made) is not a run to report to: the process runs unsampled.
    """
    if not os.path.isabs(spool):
        return False
    try:
        st = os.stat(spool)
    except OSError:
        return False
    return st.st_uid == os.getuid() and st.st_mode & 0o077 == 0 and (st.st_mode & 0o170000) == 0o040000


def start_agent(config: dict[str, str]) -> Agent | None:
    """Start sampling this process for the supervisor (called by the bootstrap); None where
    there is no run to serve."""
    global _agent
    if not can_serve(config.get("spool", "")):
        return None
    main = config.get("parent") == str(os.getppid())
    if config.get("follow", "1") != "1":
        _unfollow_children()
    view = View() if main else View(pid=os.getpid())
    try:
        agent = Agent(config, view, forked=False)
    except OSError:
        return None  # no spool file (a full disk, a folder removed just now): the supervisor measures it from /proc
    if config.get("memory") == "exact":
        import tracemalloc

        if not tracemalloc.is_tracing():
            tracemalloc.start(1)
    _agent = agent
    agent.start()
    from .autoload import install as autoload

    autoload()  # energyprof's pytest plugin, a batched generate's rows, the web servers' requests: as imported
    if main and config.get("gpu_kernels") == "1":
        _start_kernel_capture(agent, config)
    elif main and config.get("gpu_kernels") == "auto":
        agent.kernels_auto = True  # started by the sampler's check once the program uses CUDA through torch
    if config.get("memory") == "exact":
        _write_tail_on_sigterm()
    import atexit

    atexit.register(_at_exit)
    install_hooks(_before_exit, _after_fork_child if config.get("follow", "1") == "1" else None)
    return agent


def _torch_loaded() -> bool:
    """torch imported, its optimizer module whole (not a program half-way through `import torch`)."""
    optim = sys.modules.get("torch.optim.optimizer")
    return (getattr(optim, "register_optimizer_step_post_hook", None) is not None
            and getattr(sys.modules.get("torch"), "__version__", None) is not None)


def _start_kernel_capture(agent: Agent, config: dict[str, str], auto: bool = False) -> None:
    """The PyTorch profiler in the program's main process: with --gpu-kernels at once, or on by
    default once the program uses CUDA through torch (`auto`; a few steps in every 100, cued by the
    optimizer's steps). Loaded only then (that module imports torch when the profiler starts)."""
    try:
        if auto:
            from .kernels.torch_compat import untested

            why = untested()
            if why is not None:
                agent.note(why)
                return
        from .kernel_capture import start_capture

        start_capture(agent.spool, config.get("gpu_kernel_steps") or None, config.get("gpu_kernel_trace") or None,
                      auto=auto)
    except Exception as exc:  # noqa: BLE001 - the program runs all the same, GPU energy by wall time
        agent.note(f"--gpu-kernels: the PyTorch profiler could not start ({type(exc).__name__}: {exc}); "
                   "GPU energy stays charged by wall time")


def _unfollow_children() -> None:
    """--no-follow: the program's children start without a sampler (as without energyprof)."""
    env = os.environ
    env.pop(ENV, None)
    boot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if os.path.normpath(p) != boot]
    if any(parts):
        env["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        env.pop("PYTHONPATH", None)


def _at_exit() -> None:
    a = current()
    if a is not None:
        a.stop(getattr(sys, "last_exc", None) or getattr(sys, "last_value", None))


def _before_exit() -> None:
    """os._exit: a forked worker's way out writes its tail first."""
    a = current()
    if a is not None:
        a.stop()


def _write_tail_on_sigterm() -> None:
    """--memory exact: a process ended by SIGTERM (Pool.terminate ends its workers so, at the end
    of every `with Pool() as pool:`) writes its allocation records first, then dies of the same
    signal. Only where SIGTERM has its default action: a handler of the program's is left alone.

    A Python handler runs in the main thread between bytecodes: a SIGTERM caught just before the
    main thread blocks in C (a pool worker taking its queue's lock, which Pool.terminate holds for
    good) waits for ever, where the default action would have ended the process. So where the
    program has no wakeup fd of its own, the signal also writes a byte to one of energyprof's, and
    the sampler thread, seeing it with the handler still not run, sends the signal again to the main
    thread alone: that interrupts the blocking call, and the handler runs."""
    global _term
    try:
        import signal

        now = signal.getsignal(signal.SIGTERM)
        if now is not signal.SIG_DFL and now is not _on_sigterm:  # a forked child has its parent's
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
        inherited, _term = _term, None  # a forked child's copy of its parent's pipe: its own, anew
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if old != -1 and (inherited is None or old != inherited.write):  # the program's own: left as it was
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return
        if inherited is not None:
            os.close(inherited.read)
            os.close(inherited.write)
        _term = _TermRescue(r, w, _thread.get_ident())
    except (ImportError, ValueError, OSError, AttributeError):  # not the main thread; no SIGTERM here
        pass


class _TermRescue:
    """The wakeup fd's two ends and the main thread, for the sampler thread to rescue a SIGTERM
    the main thread has not handled (see `_write_tail_on_sigterm`)."""

    __slots__ = ("read", "write", "main", "seen")

    def __init__(self, read: int, write: int, main: int) -> None:
        self.read, self.write, self.main = read, write, main
        self.seen = False  # a SIGTERM came, and its handler has had one period to run

    def rescue(self) -> None:
        try:
            came = b"\x0f" in os.read(self.read, 512)  # the wakeup fd carries each caught signal's number
        except OSError:  # nothing to read
            came = False
        if self.seen:
            import signal

            signal.pthread_kill(self.main, signal.SIGTERM)
        elif came:
            self.seen = True


_term: _TermRescue | None = None  # set where --memory exact's SIGTERM handler is energyprof's


def _on_sigterm(signum: int, frame: Any) -> None:
    import signal

    global _term
    _term = None
    signal.signal(signum, signal.SIG_DFL)
    a = current()
    if a is not None and a._stopped and not a._tail_written:
        # The process was already on its way out (os._exit, atexit) writing its tail, in this
        # thread, under this handler: let it finish and leave as it was leaving.
        return
    # The sampler thread holds the spool's lock for a moment at each flush; an event this very
    # thread was writing holds it for good: then, after a bounded wait, the tail is lost, never the exit.
    lock = a.spool._lock if a is not None else None
    if a is not None and lock is not None and lock.acquire(True, SIGTERM_LOCK_WAIT_S):
        lock.release()
        try:
            a.stop()
        except BaseException:  # noqa: BLE001, S110 - the signal's end is the program's, whatever happens here
            pass
    os.kill(os.getpid(), signum)  # the default action: the process ends as it would have


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
        learn(sys._getframe(1))
        codes = codes_of(sys._getframe(1))
        label = _dataloader_label(sys._getframe(1))
        view = View(pid=os.getpid(), fork_frames=filtered(codes), parent=parent.view)
        agent = Agent(parent.config, view, forked=True)
        _agent = agent
        agent.start(label)
        if parent.config.get("memory") == "exact":
            _write_tail_on_sigterm()
    except Exception:  # noqa: BLE001 - never break the program's fork
        _agent = None


# A pool's workers run one function (the pool's loop): one node for them all, named by their role.
_POOL_WORKERS = {("multiprocessing.pool", "worker"): "[processes: pool worker]",
                 ("concurrent.futures.process", "_process_worker"): "[processes: process pool worker]",
                 # a Dask nanny's worker process (distributed.process.AsyncProcess): its command line names nothing
                 ("distributed.process", "_run"): "[processes: dask worker]"}


def _role_of(proc: Any) -> str:
    """A multiprocessing process object's node label: its pool's role, `[DataLoader worker N]`, else none."""
    target = getattr(proc, "_target", None)
    pool = _POOL_WORKERS.get((getattr(target, "__module__", ""), getattr(target, "__name__", "")))
    if pool is not None:
        return pool
    if getattr(target, "__name__", "") == "_worker_loop" and "torch" in getattr(target, "__module__", ""):
        try:
            names = target.__code__.co_varnames
            kwargs = getattr(proc, "_kwargs", {}) or {}
            wid = kwargs["worker_id"] if "worker_id" in kwargs else proc._args[names.index("worker_id")]
            return f"[DataLoader worker {int(wid)}]"
        except (ValueError, IndexError, TypeError, KeyError, AttributeError):
            return "[DataLoader worker]"
    return ""


def _dataloader_label(frame: FrameType | None) -> str:
    """`[DataLoader worker N]` when this fork starts a torch DataLoader worker; a pool's role when it
    starts a multiprocessing or concurrent.futures pool worker; LABEL_PENDING in a child of the
    forkserver, which learns what it runs after the fork."""
    while frame is not None:
        code = frame.f_code
        if code.co_name in ("start", "_launch", "_Popen", "__init__") and "multiprocessing" in code.co_filename:
            proc = frame.f_locals.get("process_obj") or frame.f_locals.get("self")
            label = _role_of(proc)
            if label:
                return label
        if code.co_name == "main" and code.co_filename.endswith(os.path.join("multiprocessing", "forkserver.py")):
            return LABEL_PENDING
        frame = frame.f_back
    return ""
