"""Profiler: start/stop a profile, name windows; owns the sampler, sensors and collector."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any, Iterator

from ..collect import probes
from ..core.ledger import Ledger
from ..core.tree import build_profile
from ..facts.measurement import Measurement
from ..facts.measurement import any_estimated
from ..facts.measurement import carbon_setting
from ..facts.measurement import fill_from_account
from ..collect.collector import Collector, LocalFeed, LocalSink, open_sources
from .preflight import preflight
from ..collect.probes import OwnClocks
from ..setup.options import Options
from .windows import AlreadyRunning
from ..facts.profile import Profile
from ..agent.frames import anchor_depth
from ..agent.sampler import HookSampler, Sampler, View
from ..agent.window_facts import PENDING
from .meta import checkpoint_header, run_meta, run_notes  # noqa: F401  (the drivers' shared run metadata)

_active_lock = threading.Lock()
WINDOW_WAIT_S = 0.5  # the longest a window's end waits for its energy to be charged
WINDOW_POLL_S = 0.002
_active: Profiler | None = None


def active_profiler() -> Any:
    """The profile running in this process: a `Profiler`, or inside a program run by
    `python -m energyprof` the sampler's agent (it has `window`, `begin_window` and
    `end_window`, which mark windows in the run's profile); None when nothing runs.

    A forked child has none: the profile belongs to its parent.
    """
    prof = _active
    if prof is not None and prof._pid == os.getpid():
        return prof
    supervised = sys.modules.get("energyprof.agent.supervised")
    agent = supervised.current() if supervised is not None else None
    if agent is not None and not supervised.bound():
        # The agent imports nothing of energyprof's: what its windows build is handed in here.
        supervised.bind(Measurement)
    return agent


def expand_output_paths(options: Options) -> Options:
    """`{rank}`, `{local_rank}`, `{node}` and `{pid}` in every output path, as this process sees them."""
    from ..engines.distributed import expand_outputs
    from ..setup.options import OUTPUTS

    return expand_outputs(options, os.environ, os.getpid(), (*OUTPUTS, "checkpoint"))


def _forget_after_fork() -> None:
    """In a forked child, a profile started by the parent is not this process's to stop."""
    global _active
    if _active is not None and _active._pid != os.getpid():
        _active = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _uses_cuda() -> bool:
    """Whether this process already uses CUDA (or ROCm) through torch; nothing imported to find out."""
    torch = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a half-imported torch
        return False


class Profiler:
    """Profile a region of a program. `start()`, run, `stop()` returns the Profile.

    Only one profile runs at a time in a process: a second `start()` raises, and the
    decorator treats a nested call as part of the profile already running. In a child
    forked while a profile ran, `stop()` returns None: the parent writes the profile.
    """

    def __init__(self, options: Options | None = None, **kwargs: Any) -> None:
        self.options = options if options is not None else Options.from_kwargs(kwargs)
        self.profile: Profile | None = None
        self._collector: Collector | None = None
        self._feed: LocalFeed | None = None
        self._sampler: Any = None
        self._ledger: Ledger | None = None
        self._kernels: Any = None  # the PyTorch profiler's capture (gpu_kernels=True, or on by default)
        self._fold: Any = None  # its reduced cycles
        self._io: Any = None  # collect/io.py: this process's I/O and the disks', each tick and at each window's edges
        self._discovery_notes: list[str] = []
        self._notes: list[dict[str, Any]] = []
        self._started_wall = 0.0
        self._pid = os.getpid()
        self._peak_reset = False
        self._tracemalloc_started = False
        self.target: str | None = None
        self.argv: list[str] = list(sys.argv)
        self._window_lock = threading.Lock()
        self._windows_begun = 0
        self._carbon = carbon_setting(self.options)
        self._live: Any = None  # influx=, pushgateway=, mlflow=: the live export (output/live/) and its watch
        self._watch: Any = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self, target: str | None = None, _anchor: int | None = None) -> Profiler:
        global _active
        with _active_lock:
            if active_profiler() is not None:
                raise AlreadyRunning("an energyprof profile is already running in this process")
            _active = self
        self._pid = os.getpid()
        try:
            self._start(target, _anchor if _anchor is not None else anchor_depth(sys._getframe(1)))
        except BaseException:
            self._teardown()
            if self._live is not None:
                self._live.finish(None, wait_s=0.0)
            with _active_lock:
                _active = None
            raise
        return self

    def _start(self, target: str | None, anchor: int) -> None:
        o = self.options = expand_output_paths(self.options)
        preflight(o)  # the same file-system checks as the command line: outputs writable, trace readable
        found, self._ledger = open_sources(o)
        self._discovery_notes = found.notes
        self.target = target or self.target
        self._ledger.note_process(os.getpid(), parent_pid=os.getppid(), command=" ".join(self.argv)[:200],
                                  role="main")
        own = OwnClocks()
        self._feed = LocalFeed(self._ledger, own, children=o.children, rss=o.memory != "off",
                               rss_children=o.memory_children)
        from ..collect.io import IoRecorder

        # what `python -m energyprof` records: /proc/PID/io and the disks (io="off": nothing read)
        self._io = IoRecorder(lambda: self._pid, off=o.io == "off")
        self._collector = Collector(
            found.sensors, self._feed, o.sensor_interval, own,
            sensor_timeout_s=o.sensor_timeout, checkpoint=self._checkpoint_header,
            checkpoint_path=o.checkpoint, checkpoint_interval_s=o.checkpoint_interval, extras=[self._io],
        )
        self._started_wall = time.time()
        self._start_live(own)
        if o.gpu_kernels or (o.gpu_kernels is None and _uses_cuda()):
            self._start_kernels()
        self._cuda_sync()
        self._peak_reset = bool(o.peak_reset and o.memory != "off" and probes.reset_peak())
        alloc = False
        if o.memory == "exact":
            import tracemalloc

            if tracemalloc.is_tracing():
                self._notes.append({"kind": "memory-exact", "message": "memory=exact is off: the program runs"
                                    " tracemalloc itself, and energyprof leaves it alone"})
            else:
                tracemalloc.start(1)
                self._tracemalloc_started = alloc = True
        self._collector.start()
        kind = HookSampler if o.sampler == "pyinstrument" else Sampler
        self._sampler = kind(LocalSink(self._feed), o.interval, View(anchor=anchor), rss=o.memory != "off",
                             alloc=alloc, own_idents=own.idents)
        self._sampler.start()

    def _start_live(self, own: OwnClocks) -> None:
        """influx=, pushgateway=, mlflow=: the live export's threads (their CPU is energyprof's), fed from
        the collector's tick; MLflow is imported here, once, before the program's first window."""
        o = self.options
        if not (o.influx or o.pushgateway or o.mlflow):  # nothing of the export's is imported without them
            return
        from ..output.live.export import LedgerWatch, LiveExport

        assert self._collector is not None and self._ledger is not None
        self._live = LiveExport(self.options, own=own, started_wall=self._started_wall)
        self._live.carbon = self._carbon
        self._watch = LedgerWatch(self._live, self._ledger, self.options.idle, self._collector._lock)
        self._collector.extras.append(self._watch)

    def _start_kernels(self) -> None:
        """The PyTorch profiler in this process until stop, each cycle reduced in memory into a fold
        (torch imported here, lazily): with gpu_kernels=True, or by default where the program already
        uses CUDA through torch (a few steps in every 100, cued by its optimizer's steps)."""
        from ..agent.kernel_capture import AUTO_ACTIVE, KernelCapture, register
        from ..core.gpu_tree import KernelFold

        o = self.options
        self._fold = KernelFold()
        if o.gpu_kernels:
            self._kernels = KernelCapture(self._fold, steps=o.gpu_kernel_steps, export=o.gpu_kernel_trace)
        else:
            self._kernels = KernelCapture(self._fold, every=100, active=AUTO_ACTIVE, budget=0.01)
        self._kernels.start()
        register(self._kernels)  # energyprof.torch.track's steps reach it
        if not o.gpu_kernels:
            from ..agent.kernel_capture import _hook_optimizer

            _hook_optimizer(self._kernels)

    def _stop_kernels(self) -> None:
        """The last cycle reduced into the fold before the tree is built."""
        cap = self._kernels
        if cap is None:
            return
        from ..agent.kernel_capture import register

        register(None)
        try:
            cap.stop()
        except Exception as exc:  # noqa: BLE001 - the profile stands without the last cycle
            self._notes.append({"kind": "gpu-kernels", "message": f"the PyTorch profiler could not stop: {exc}"})
        if cap.failed:
            self._notes.append({"kind": "gpu-kernels", "message": f"the kernel capture failed: {cap.failed}"})

    def _teardown(self) -> None:
        """Stop whatever was started; each step on its own, so one failing stops the rest."""
        if self._kernels is not None and self._kernels.live:
            try:
                self._stop_kernels()
            except Exception:  # noqa: BLE001
                pass
        if self._sampler is not None:
            try:
                self._sampler.stop()
            except Exception:  # noqa: BLE001
                pass
        if self._collector is not None:
            try:
                self._collector.stop()
            except Exception:  # noqa: BLE001
                pass
        if self._tracemalloc_started:
            self._tracemalloc_started = False
            try:
                import tracemalloc

                tracemalloc.stop()
            except Exception:  # noqa: BLE001
                pass

    def stop(self, exit_status: dict[str, Any] | None = None, *, keep_checkpoint: bool = False) -> Profile | None:
        """End the profile and build it; None in a forked child (its parent's profile).
        `keep_checkpoint`: the caller removes it once the profile's facts are on disk
        (`outputs.write_outputs(..., checkpoint=)`), so a failing view cannot lose the run."""
        global _active
        if self._collector is None or self._ledger is None:
            raise RuntimeError("Profiler.stop() called before start()")
        if self._pid != os.getpid():
            return None
        peak = None
        allocations: list[Any] = []
        try:
            self._cuda_sync()
            self._stop_kernels()
            peak = probes.read_peak() if self._peak_reset else None
            if self._tracemalloc_started and isinstance(self._sampler, Sampler):
                import tracemalloc

                self._sampler.stop()
                if tracemalloc.is_tracing() and tracemalloc.get_traceback_limit() == 1:
                    allocations = self._sampler.allocations()
                else:
                    self._tracemalloc_started = False  # the program's now: left alone
                    self._notes.append({"kind": "memory-exact", "message": "memory=exact is off: the program"
                                        " runs tracemalloc itself, and energyprof leaves it alone"})
        except Exception as exc:  # noqa: BLE001 - a failed sync or read still ends the profile
            self._notes.append({"kind": "stop", "message": f"while stopping: {type(exc).__name__}: {exc}"})
        finally:
            try:
                self._teardown()
            finally:
                with _active_lock:
                    if _active is self:
                        _active = None
        if allocations:
            table = self._ledger.stacks
            self._ledger.add_allocations(os.getpid(), [(table.frame_id(fr) if fr else None, size)
                                                       for fr, size in allocations])
        if self._watch is not None:
            self._watch.final()
        self.profile = self._build(exit_status, peak)
        if self._live is not None:  # the last points from the profile; at most FINISH_WAIT_S for the servers
            from ..output.live.export import finish_run

            self.profile = finish_run(self._live, self.profile, not self.options.quiet and not self.options.summary,
                                      self._watch.history(), self._watch.end_ns())
        if not keep_checkpoint:
            self._collector.remove_checkpoint()
        return self.profile

    @property
    def running(self) -> bool:
        return _active is self

    # -- windows -----------------------------------------------------------------------
    def begin_window(self, name: str, index: int | None = None, t_ns: int | None = None, edge_io: bool = True) -> None:
        """`t_ns`: the start the caller read itself (perf_counter_ns; the power-limit optimizer's edge);
        `edge_io` False: no I/O counters read at the edge (a web request's, 20 us an edge)."""
        self._begin(name, index, t_ns, edge_io)

    def _begin(self, name: str, index: int | None, t_ns: int | None = None, edge_io: bool = True) -> int:
        """Queue a window's start; returns its place in the ledger's list (the feed keeps the order)."""
        if self._feed is None:
            return -1
        self._cuda_sync()
        with self._window_lock:
            k = self._windows_begun
            if name != PENDING:  # a web request's window is a unit of work: the ledger's book keeps it, not its list
                self._windows_begun += 1
            t = self._feed.begin_window(name, index, t_ns)
        if edge_io:
            self._io_edge(t)
        return k

    def end_window(self, name: str | None = None, facts: dict[str, float] | None = None,
                   t_ns: int | None = None, edge_io: bool = True) -> None:
        """End the last window opened under `name`; `facts`: numbers measured about the span
        (a tracked loop's pipeline time in a DataLoader worker), kept with it in the profile; `t_ns`: the
        end the caller read itself (perf_counter_ns); `edge_io` as for `begin_window`."""
        if self._feed is not None:
            self._cuda_sync()
            t = self._feed.end_window(name, facts, t_ns)
            if edge_io:
                self._io_edge(t)

    def _io_edge(self, t_ns: int) -> None:
        """The I/O counters at a window's edge, read now on the program's thread (about 20 us): a window's
        bytes are their differences at its edges, not figures interpolated between the collector's ticks.
        That CPU is energyprof's (sampler.charge_own), not the program's, as under `python -m energyprof`;
        nothing is read where I/O is off (io="off") or not on this system."""
        if self._io is not None and self._io.available:
            from ..agent.sampler import charge_own

            t0 = time.thread_time_ns()
            try:
                self._io.read_edge(t_ns)
            except Exception:  # noqa: BLE001 - an I/O figure is never worth the program's run
                pass
            finally:
                charge_own(time.thread_time_ns() - t0)

    def _cuda_sync(self) -> None:
        """With sync="cuda", wait for launched GPU work so a boundary holds all its energy."""
        if self.options.sync == "cuda":
            from .cuda import cuda_sync

            cuda_sync()

    @contextlib.contextmanager
    def window(self, name: str, index: int | None = None) -> Iterator[Measurement]:
        """Mark a window; the `Measurement` it yields is filled when the block ends, at the first
        read of one of its figures (see `_settle`: that read may wait up to WINDOW_WAIT_S)."""
        m = Measurement(name=name, index=index)
        if self._feed is None:
            m.energy_j = m.program_energy_j = None
            m.complete, m.note = False, "no profile was running"
            yield m
            return
        k = self._begin(name, index)
        try:
            yield m
        finally:
            self.end_window(name)
            m.defer(lambda m: self._settle(k, m))  # the wait is paid only by code that reads m
            if self._live is not None:  # MLflow logs it on energyprof's thread, which pays the wait for m's figures
                from ..agent.mlflow_run import active_run_id

                self._live.window_block(m, name, index, active_run_id())

    def _settle(self, k: int, m: Measurement) -> None:
        """Wait (at most WINDOW_WAIT_S) until the ledger has charged every interval the window
        overlaps (the next sensor tick and a stack sample past it), then copy its figures."""
        led = self._ledger
        assert led is not None
        deadline = time.perf_counter() + WINDOW_WAIT_S
        w = None
        while True:
            w = led.windows[k] if len(led.windows) > k else None
            if (w is not None and w.done) or not self.running or time.perf_counter() >= deadline:
                break
            time.sleep(WINDOW_POLL_S)
        if w is None:
            m.energy_j = m.program_energy_j = None
            m.complete, m.note = False, "the window never reached the ledger"
            return
        with self._collector_lock():
            account = led.account(w)
        fill_from_account(m, account, self.options.idle, *self._carbon)
        if not m.complete:
            m.note = f"not every interval of the window was charged within {WINDOW_WAIT_S:g} s: figures so far"

    def measure(self) -> Measurement:
        """The run's totals so far: every interval charged up to now (not the one in progress)."""
        m = Measurement(name="<run>")
        led = self._ledger
        if led is None:
            m.energy_j = m.program_energy_j = None
            m.complete, m.note = False, "no profile was started"
            return m
        with self._collector_lock():
            charged = led.charged_ns or 0
            prog = led.program_energy(self.options.idle)  # the ledger's public figure, not its tallies
            self._fill(m, max(0, charged - (led.first_ns or charged)) / 1e9, led.total, prog)
        return m

    def _fill(self, m: Measurement, time_s: float, energy: list[float], program: list[float]) -> None:
        led = self._ledger
        assert led is not None
        m.time_s = time_s
        m.energy_j = {sid: float(v) for sid, v in zip(led.source_ids, energy)}
        m.program_energy_j = {sid: float(v) for sid, v in zip(led.source_ids, program)}
        m.estimated = any_estimated(led.sources)
        m.intensity_g_per_kwh, m.pue = self._carbon

    def _collector_lock(self) -> Any:
        return self._collector._lock if self._collector is not None else contextlib.nullcontext()

    # -- results -----------------------------------------------------------------------
    def _meta(self, exit_status: dict[str, Any] | None) -> dict[str, Any]:
        meta = run_meta(self.options, self.target or "<program>", self.argv, self._started_wall, os.getpid(),
                        self._discovery_notes, exit_status or {"status": "completed"})
        from ..engines.distributed import rank_info

        rank = rank_info(os.environ)
        if rank is not None:  # one rank of several: its profile says which, so the ranks can be joined
            meta["distributed"] = rank.to_meta(reader=False)
        return meta

    def _checkpoint_header(self) -> dict[str, Any]:
        assert self._ledger is not None
        return checkpoint_header(self._meta({"status": "checkpoint"}), self.options, self._notes, self._ledger)

    def _build(self, exit_status: dict[str, Any] | None, peak: int | None = None) -> Profile:
        assert self._ledger is not None and self._collector is not None
        assert self._feed is not None
        children = sorted(self._feed.child_processes.values(), key=lambda c: c["pid"])
        from ..collect.kernels.capture import kernel_split

        # the kernels reduced in this process, split before the tree is built: samples and kernels build it together
        split, gpu_notes = kernel_split(self._fold, self._ledger, self._collector,
                                        mode=self.options.gpu_kernels)
        return build_profile(self._ledger, self.options.idle, self._meta(exit_status),
                             notes=[*run_notes(self.options, [*self._collector.notes, *self._notes]), *gpu_notes],
                             peak_rss_exact_bytes=peak, child_processes=children, gpu=split,
                             io=None if self._io is None else self._io.fact(self._ledger.first_ns))
