"""GPU kernels inside the program: the PyTorch profiler (Kineto) in cycles, each cycle's events read in
memory and reduced as it ends (agent/kernels/reduce.py), the reduced records handed to a sink (the
run's spool, or the in-process Profiler's fold). No trace file unless one is asked for.

Loaded only when the capture runs, in the program's main process, or by the in-process Profiler;
torch is imported when the profiler starts, never at import. Cycles:
- with steps marked (energyprof.torch.track, or the optimizer's step when the capture was turned on
  by default), ACTIVE steps of every EVERY are profiled (EVERY == ACTIVE: every step, each cycle
  reduced at its end), through the profiler's own schedule, ended in `on_trace_ready`;
- with no step marked, one cycle from the start to the program's exit.
The reduction, and any export, is energyprof's work: its CPU is charged to energyprof (the sampler
takes it out of the program's, agent/sampler.charge_own), and torch's profiler warnings and Kineto's
log lines stay off the program's stderr.
"""

from __future__ import annotations

import os
import _thread
import sys
import time

from .kernels.torch_compat import KINETO_LEVEL_SYMBOL, KINETO_QUIET, _Quiet, _watch_profiler_starts  # noqa: F401
from .kernels.torch_compat import pending_call

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from .kernels.reduce import Cycle

EXPORT_SUFFIX = ".kineto.json.gz"
WHOLE_RUN_STEPS = 10  # the whole run profiled: one cycle every this many marked steps
READ_BOUND_S = 30.0  # the program waits at most this long for a cycle's in-memory results to be read and reduced
# steps a window of the default capture profiles. Op times are wall times; a path's fastest run is taken op by op
# within each backward op (reduce.fastest_by_op), so a run the OS held spoils only the op it hit, and the fastest is
# kept over windows. Its cost is per event: a GPT-2 window's cost is ~20 ms plus ~45 ms a step (the recording, torch's
# stop, the read and the reduction), and a short run has only its first window (the budget spaces the rest). Beside
# two CPU hogs the three 1:2:4 branches read 1:1.89-2.33:3.33-4.23 with 3 steps and 1:2.06-2.37:4.09-4.68 with 6
# (5 runs each): more steps bought no steadier split.
AUTO_ACTIVE = 3
# The note when the program's own profiler holds energyprof's windows back (said once a run)
WAITING = ("--gpu-kernels: the program runs its own PyTorch profiler; energyprof's windows wait while it is on, "
           "and the steps it profiles are not in the kernel figures")


def clock_offset(rounds: int = 64, clock: Callable[[], int] = time.time_ns,
                 reference: Callable[[], int] = time.perf_counter_ns) -> tuple[int, int]:
    """(offset_ns, error_ns) with `clock() ~= reference() + offset_ns`, the error the half-width of
    the narrowest bracket seen: read `reference`, `clock`, `reference`, keep the tightest pair.

    The profiler stamps host events on the system (Unix) clock; energyprof stamps everything on
    perf_counter_ns. Reading both in a bracket bounds the offset by the bracket's width, typically
    well under a microsecond; the GPU's own timestamps are brought to the host clock by CUPTI /
    roctracer, whose error is theirs and is not added here."""
    best: tuple[int, int] | None = None
    for _ in range(max(1, rounds)):
        a = reference()
        c = clock()
        b = reference()
        half = (b - a) // 2
        if best is None or half < best[1]:
            best = (c - (a + half), half)
    assert best is not None
    return best


def _schedule(steps: str) -> tuple[int, int, int]:
    """EVERY:ACTIVE[:WINDOWS] as (every, active, windows; 0 = no limit). The options checked the
    spec before the run (setup/options.py parse_kernel_steps says what is allowed)."""
    nums = [int(p) for p in steps.split(":")]
    return nums[0], nums[1], nums[2] if len(nums) > 2 else 0




def _foreign_profiler() -> bool:
    """A PyTorch profiler is on (Kineto, legacy, ITT or NVTX) while energyprof's is not recording: the
    program's own. Asked only where energyprof's profiler is off (no session, or between windows)."""
    from .kernels.torch_compat import profiler_enabled

    return profiler_enabled()


def _charge_own(ns: int) -> None:
    """CPU burnt on a program thread for energyprof (the reduction, an export): energyprof's, not the program's."""
    sampler = sys.modules.get("energyprof.agent.sampler")
    charge = getattr(sampler, "charge_own", None)
    if charge is not None and ns > 0:
        charge(ns)


def _cuda_available() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a half-imported torch: the CPU's events only
        return False


def _take_captured() -> list[tuple[int, int, int]]:
    """The samples the sampler took inside backward() during the cycle now ending: (number, the span's start
    and end in perf ns)."""
    sampler = sys.modules.get("energyprof.agent.sampler")
    if sampler is None or not sampler._captured:
        return []
    box = sampler._captured.pop()
    sampler._captured_base[0] += sampler.MAX_CAPTURED  # a late sample of this cycle never takes a later one's number
    return list(box)


def _bounded(call: Callable[[], Any], bound_s: float) -> tuple[bool, Any, BaseException | None]:
    """`call()` on an own thread (agent/own_threads.py), waited for at most `bound_s`: (done, its result, what
    it raised). Not done: the thread is left to finish on its own; its result is dropped."""
    from .own_threads import start

    box: list[Any] = [None, None]
    finished = _thread.allocate_lock()
    finished.acquire()

    def run() -> None:
        try:
            box[0] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, never raised here
            box[1] = exc
        finally:
            finished.release()

    start(run)
    if not finished.acquire(timeout=max(0.001, bound_s)):
        return False, None, None
    return True, box[0], box[1]


class KernelCapture:
    """torch.profiler in this process, in cycles, each reduced in memory as it ends and handed to `sink`
    (an object with `add(cycle)`, or the spool's writer). `steps` (EVERY:ACTIVE[:WINDOWS]): ACTIVE
    steps of every EVERY, at most WINDOWS times; None: the whole run, one cycle from the start to the
    first marked step, then cycles of WHOLE_RUN_STEPS steps (one cycle in all if no step is marked);
    `every`/`active` without `steps`: the capture on by default (nothing until the first step).
    `export`: a folder to also write each cycle's Chrome trace to (gzipped), for users who want the file."""

    def __init__(self, sink: Any, activities: Any = None, steps: str | None = None, export: str | None = None,
                 every: int | None = None, active: int | None = None, budget: float | None = None) -> None:
        self.sink = sink
        self.activities = activities
        sched = _schedule(steps) if steps else None
        self.every, self.active, self.windows = sched if sched else (every or 1, active or 1, 0)
        self.scheduled = sched is not None or every is not None  # only some steps profiled
        self.by_default = sched is None and every is not None  # on by default, not asked for
        self.skipped = 0  # steps held back while the program's own profiler was on
        self._on = False  # energyprof's profiler known to be recording (enabled in torch)
        self._own_call = False  # energyprof's profiler is being started, stepped or stopped
        self.budget = budget  # the capture's CPU at most this share of the loop's time: EVERY doubles past it
        self.read_bound_s = READ_BOUND_S
        self.export = export
        self.prof: Any = None
        self.steps = 0  # steps marked so far
        self.cycles = 0  # cycles reduced
        self.begun = 0  # cycles begun
        self.t_start = 0
        self.recording = False
        self.live = False
        self.stepped_by: str | None = None  # the first source of steps (the loop's track, or the optimizer)
        self.running: dict[Any, Any] = {}
        self.cost_ns = 0  # CPU spent reducing and exporting
        self.failed: str | None = None
        self.hook: Any = None  # the optimizer's post-step hook, when the capture was on by default
        self.hook_asked = False  # the hook's registration waits on the main thread (hook_when_safe)
        self.hook_asked_periods = 0  # the sampler's periods since it asked
        self.files: Any = None  # the profiler's file names -> full paths (agent/kernels/reduce.FullPaths)
        self._last_step = 0
        self._t_thread = 0  # the thread's CPU clock when the capture's current call began
        self._loop_ns = 0  # wall time of the steps outside cycles, for the cost budget
        self._loop_steps = 0
        self._rec_ns = 0  # wall time of the profiled steps (the profiler records ops and Python calls)
        self._rec_steps = 0
        self.package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
        self.pid = os.getpid()  # a forked child inherits this object, not the profiler's session

    def _ours(self) -> bool:
        if os.getpid() == self.pid:
            return True
        self.live, self.prof, self.hook = False, None, None  # a forked child's copy: left alone, never stopped
        return False

    # -- the profiler -------------------------------------------------------------------
    def _make(self, with_schedule: bool) -> Any:
        from torch.profiler import ProfilerActivity, profile

        acts = self.activities
        if acts is None:
            acts = [ProfilerActivity.CPU]
            if _cuda_available():  # ROCm builds report through the CUDA activity
                acts.append(ProfilerActivity.CUDA)
        kwargs: dict[str, Any] = {"activities": acts, "with_stack": True, "record_shapes": False,
                                  "on_trace_ready": self._ready}
        if with_schedule:
            kwargs["schedule"] = self._action
        return profile(**kwargs)

    def _action(self, step: int) -> Any:
        """The profiler's schedule, read at each step: EVERY may have grown since (the cost budget)."""
        from torch.profiler import ProfilerAction

        every, active = self.every, self.active
        if self.windows and step // every >= self.windows:
            return ProfilerAction.NONE
        # on by default, the first window comes early (steps 2..ACTIVE+1, after a warm-up step), so a short
        # run is profiled too; then one every EVERY steps
        pos = (step + (every - active - 2 if self.by_default and every > active + 1 else 0)) % every
        if every == active:
            return ProfilerAction.RECORD_AND_SAVE if pos == active - 1 else ProfilerAction.RECORD
        warm = every - active - 1  # one warm-up step before each window, where there is room
        if pos < warm:
            return ProfilerAction.NONE
        if pos == warm:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD_AND_SAVE if pos == every - 1 else ProfilerAction.RECORD

    def start(self) -> None:
        """Begin: the whole-run cycle at once; a scheduled capture waits for the first step. Never raises:
        a capture that cannot start is given up, with a note."""
        self.live = True
        import atexit

        atexit.register(self.stop)
        if not self.scheduled:
            try:
                if _foreign_profiler():
                    self._give_up("the program runs its own PyTorch profiler", stop=False)
                    return
                self._begin(with_schedule=False)
            except Exception as exc:  # noqa: BLE001 - the program goes on without the capture
                self._give_up(f"{type(exc).__name__}: {exc}")

    def _begin(self, with_schedule: bool) -> None:
        t = self._mark()
        t_wall = time.perf_counter_ns()
        with _Quiet():
            self.prof = self._make(with_schedule)  # imports torch.profiler (at the run's start: torch itself)
            self._note_start()
            if not with_schedule:
                # the profiled span starts before torch was imported: no kernel of this program can have
                # run meanwhile, so that time is the GPU's idle time, not where Python waited
                self.t_start = t_wall
            _watch_profiler_starts(self)  # before the start: its hook quiets Kineto's first start (_quiet_start)
            _Quiet.shadow()  # torch is imported now (the whole run's capture imports it here)
            self._own_call = True
            try:
                self.prof.start()
            finally:
                self._own_call = False
        self._on = not with_schedule or self._action(0).name.startswith("RECORD")
        self._spent(t)

    def _note_start(self) -> None:
        self.t_start = time.perf_counter_ns()
        self.recording = True
        self.begun += 1
        from .kernels.reduce import running_frames

        sampler = sys.modules.get("energyprof.agent.sampler")
        if sampler is not None:  # samples inside backward() from now on are kept for this cycle (sampler._captured)
            sampler._captured[:] = [[]]

        self.running = running_frames(sys._current_frames().values())

    def step(self, source: str = "track") -> None:
        """A step begins (energyprof.torch.track, or the optimizer's step): the profiler's cue. Never
        raises into the program: a capture that fails is stopped, with a note."""
        if not self.live or not self._ours():
            return
        try:
            self._step(source)
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt and SystemExit included: the capture's, not the program's
            self._give_up(f"{type(exc).__name__}: {exc}", in_hook=source == "optimizer")

    def _give_up(self, why: str, stop: bool = True, in_hook: bool = False) -> None:
        """The capture stopped for the rest of the run, with a note. Energyprof's own profiler is stopped
        only where it is known to be recording (`stop`): one that failed to start or step may have left
        the program's profiler as the one that is on, and stopping would end the program's. The optimizer
        hook stays (inert) when this runs inside it: torch is iterating its hooks then."""
        self.live = False
        self.failed = why
        prof, self.prof = self.prof, None
        if prof is not None and stop and self._on:
            try:
                self._stop_prof(prof)  # the open cycle reduced: energyprof's CPU, as on the normal stop path
            except BaseException:  # noqa: BLE001 - whatever it raises stays here
                pass
        self._on = False
        self.recording = False
        if not in_hook:
            self._remove_hook()
        self._note(f"--gpu-kernels: the PyTorch profiler capture stopped ({why}); kernels after this point are "
                   "left out, and the GPU figures from then on are where Python waited")

    def _note(self, text: str) -> None:
        """A line for the report, through the sink's `note` where it has one; never raises into the program."""
        note = getattr(self.sink, "note", None)
        if note is not None:
            try:
                note(text)
            except Exception:  # noqa: BLE001
                pass

    def _stop_prof(self, prof: Any, t0_thread: int | None = None) -> None:
        """Stop energyprof's profiler (on_trace_ready reduces the open cycle inside): kept off stderr, and its
        CPU (from `t0_thread`, else from now) charged to energyprof, whatever the stop raises."""
        t = self._mark() if t0_thread is None else t0_thread
        self._own_call = True
        try:
            with _Quiet():
                prof.stop()
        finally:
            self._own_call = False
            self._spent(t)

    def _program_starts(self) -> None:
        """A profiler is starting (torch's start hook): not energyprof's, and energyprof's records, so
        energyprof's window ends now (its cycle reduced) and the program's starts alone. On by default,
        the capture stops for the run; asked for, it waits until the program's profiler is off."""
        if self._own_call or not self.live or self.prof is None or not self._ours():
            return
        warming = getattr(getattr(self.prof, "current_action", None), "name", "") == "WARMUP"
        if not self._on and not warming:
            return  # between windows: nothing of energyprof's is prepared or on
        prof, self.prof = self.prof, None
        t = self._mark()
        if warming:
            self._note_start()  # a prepared window ends empty, now: its cycle spans no time of the program's
        self._on = False
        try:
            self._stop_prof(prof, t)  # on_trace_ready: the window so far reduced (a prepared one would be clobbered)
        except Exception:  # noqa: BLE001
            pass
        self.recording = False
        if self.by_default:
            self._give_up("the program runs its own PyTorch profiler", stop=False, in_hook=True)
        elif not self.skipped:
            self.skipped += 1
            self._note(WAITING)

    def _foreign(self) -> bool:
        """The program's own profiler is on, where energyprof's would start or prepare a window: on by
        default, the capture stops for the rest of the run (the program profiles itself); asked for
        (--gpu-kernels), the window waits, the schedule held where it is, until the program's is off."""
        if not _foreign_profiler():
            return False
        if self.by_default:
            self._give_up("the program runs its own PyTorch profiler", stop=False)
            return True
        if self.prof is not None and getattr(getattr(self.prof, "current_action", None), "name", "") == "WARMUP":
            self.prof = None  # its prepared session is the program's now: a fresh profiler once that one is off
        if not self.skipped:
            self._note(WAITING)
        self.skipped += 1
        return True

    def _step(self, source: str) -> None:
        if self.stepped_by is None:
            self.stepped_by = source
        elif source != self.stepped_by:
            return  # one source of steps: a tracked loop whose optimizer also steps counts each step once
        now = time.perf_counter_ns()
        if self._last_step:
            if not self.recording:
                self._loop_ns += now - self._last_step
                self._loop_steps += 1
            else:  # a profiled step: what it took beyond a plain one is the capture's cost too
                self._rec_ns += now - self._last_step
                self._rec_steps += 1
        self._last_step = now
        self.steps += 1
        if not self.scheduled and self.stepped_by == source and self.steps == 1:
            # the whole run, and steps are marked: the cycle since the start ends here, and from now
            # on each cycle is EVERY steps, reduced as it ends
            t = self._mark()
            prof, self.prof = self.prof, None
            try:
                if prof is not None:
                    self._stop_prof(prof, t)
            finally:
                self._on = False
            self.scheduled = True
            self.every = self.active = WHOLE_RUN_STEPS
        if self.prof is None:
            if self.scheduled and not self._foreign():
                self._begin(with_schedule=True)
                self.recording = self._action(0).name.startswith("RECORD")
                if not self.recording:
                    self.begun -= 1
            return
        t = self._mark()
        before = self.prof.current_action.name if hasattr(self.prof, "current_action") else ""
        step_num = getattr(self.prof, "step_num", None)
        following = self._action(step_num + 1).name if step_num is not None else ""
        if before == "NONE" and following == "NONE":
            self.prof.step()  # between windows: nothing starts or stops, nothing to keep off stderr
        else:
            if not before.startswith("RECORD") and self._foreign():
                self._spent(t)
                return  # a window would start beside the program's own profiler: not now
            self._own_call = True
            try:
                with _Quiet():
                    self.prof.step()
            finally:
                self._own_call = False
        after = self.prof.current_action.name if hasattr(self.prof, "current_action") else ""
        self._on = after.startswith("RECORD")
        if after.startswith("RECORD") and (not before.startswith("RECORD") or before == "RECORD_AND_SAVE"):
            self._note_start()
        self._spent(t)

    def _mark(self) -> int:
        self._t_thread = time.thread_time_ns()
        return self._t_thread

    def _spent(self, t0_thread: int) -> None:
        ns = time.thread_time_ns() - t0_thread
        self.cost_ns += ns
        _charge_own(ns)

    def _ready(self, prof: Any) -> None:
        """A cycle ended (on_trace_ready): its events reduced in memory and handed on. Called inside the
        profiler's step or stop, whose CPU `step` and `stop` charge to energyprof. The reads of torch's
        in-memory results and the reduction run on an own thread, the program's waiting at most
        `READ_BOUND_S` for them: past it the capture gives up (that thread is left to finish or not), and
        whatever they raise, KeyboardInterrupt and SystemExit included, stays here."""
        t_end = time.perf_counter_ns()
        self.recording = False
        samples = _take_captured()
        try:
            done, cycle, exc = _bounded(lambda: self._reduce(prof, t_end, samples), self.read_bound_s)
            if not done:
                self.running = {}
                self._give_up(f"reading the profiler's results took over {self.read_bound_s:g} s", stop=False,
                              in_hook=True)
                return
            if exc is not None:
                raise exc
            self.cycles += 1
            cycle.cost_ns = self.cost_ns + time.thread_time_ns() - self._t_thread
            self.sink.add(cycle)
            if self.export:
                path = os.path.join(self.export, f"{os.getpid()}.c{self.cycles}{EXPORT_SUFFIX}")
                prof.export_chrome_trace(path, use_python_export=True)
            from .kernels import torch_compat

            torch_compat.release_cycle(prof)
        except BaseException as exc:  # noqa: BLE001 - the program goes on; the report says the capture failed
            self.failed = f"{type(exc).__name__}: {exc}"
            self._note(f"--gpu-kernels: a profiler cycle could not be reduced ({self.failed}); its kernels are left out")
        finally:
            self.running = {}
        self._keep_to_budget()

    def _reduce(self, prof: Any, t_end: int, samples: list[tuple[int, int, int]]) -> Any:
        """The cycle's events read in memory and reduced (on the capture's own thread: its CPU charged to energyprof)."""
        t0 = time.thread_time_ns()
        try:
            from .kernels.reduce import FullPaths, reduce_events
            from .kernels import torch_compat
            from .modules import learn_from_frames

            offset, _ = clock_offset(rounds=8)
            events = torch_compat.events(prof)
            marks = torch_compat.module_marks(prof)
            if marks.any():  # the model's roots, from the running frames' locals: every module gets its path
                learn_from_frames(sys._current_frames().values())
            if self.files is None:
                self.files = FullPaths(sys.path)
            return reduce_events(events, unix_minus_perf=offset, t0=self.t_start, t1=t_end, running=self.running,
                                 package=self.package, files=self.files, modules=marks, backward=True,
                                 samples=samples)
        finally:
            ns = time.thread_time_ns() - t0
            self.cost_ns += ns
            _charge_own(ns)

    def _keep_to_budget(self) -> None:
        """A capture on by default costs at most `budget` of the loop's time: past it, windows come half
        as often (EVERY doubles). Its cost per cycle: the reduction's CPU, and what its profiled steps
        took beyond plain ones (on a CPU-bound loop the profiler's recording is most of it)."""
        if self.budget is None or not self._loop_steps or not self.cycles:
            return
        step_ns = self._loop_ns / self._loop_steps
        slower = max(0.0, self._rec_ns - step_ns * self._rec_steps)
        per_cycle = (self.cost_ns + slower) / self.cycles
        while per_cycle > self.budget * step_ns * self.every and self.every < 1 << 20:
            self.every *= 2

    def _remove_hook(self) -> None:
        """Take the optimizer's post-step hook off (never from inside it: torch is iterating its hooks)."""
        hook, self.hook = self.hook, None
        if hook is not None:
            try:
                hook.remove()
            except Exception:  # noqa: BLE001 - whatever torch says, the program goes on
                pass

    def stop(self) -> None:
        """Stop: the open cycle is reduced (once; atexit calls it again)."""
        if not self._ours():
            return
        self.live = False
        self._remove_hook()
        prof, self.prof = self.prof, None
        if prof is None:
            return
        if not self._on and _foreign_profiler():
            return  # the program's profiler is the one on: stopping energyprof's would end the program's
        try:
            self._stop_prof(prof)  # a cycle still recording ends here: on_trace_ready reduces it
        except BaseException as exc:  # noqa: BLE001 - at exit too: the program's outcome is its own
            self.failed = f"{type(exc).__name__}: {exc}"


class SpoolSink:
    """Reduced cycles as the spool's records (agent/wire.py), for the supervisor to fold."""

    def __init__(self, spool: Any) -> None:
        self.spool = spool
        self.paths: dict[Any, int] = {}  # launch path -> its id in this stream (grows with lines)

    def add(self, cycle: Cycle) -> None:
        from .wire import kernel_busy, kernel_counts, kernel_cycle, kernel_names, kernel_path

        lines = [kernel_cycle(cycle.t0, cycle.t1, cycle.records, cycle.cost_ns)]
        for (path, dev), fig in cycle.figures.items():
            kid = self.paths.get(path)
            if kid is None:
                kid = self.paths[path] = len(self.paths)
                lines.append(kernel_path(kid, path))
            lines.append(kernel_busy(kid, dev, cycle.bucket_ns, fig.busy))
            lines.append(kernel_names(kid, dev, fig.names))
        if cycle.counts:
            lines.append(kernel_counts(cycle.counts))
        for line in lines:  # one record an event: a failed write keeps the paths and drops the figures
            self.spool.event(line)

    def note(self, text: str) -> None:
        from .wire import note

        self.spool.event(note(text))


_capture: KernelCapture | None = None


def start_capture(spool: Any, steps: str | None = None, export: str | None = None, auto: bool = False) -> KernelCapture:
    """The agent's entry: start the profiler in this process (once). `auto`: turned on by default (the
    program uses CUDA through PyTorch): a few steps in every 100, the optimizer's steps as the cue,
    at most 1% of the loop's time."""
    global _capture
    if _capture is None:
        if auto:
            _capture = KernelCapture(SpoolSink(spool), every=100, active=AUTO_ACTIVE, export=export, budget=0.01)
        else:
            _capture = KernelCapture(SpoolSink(spool), steps=steps, export=export)
        _capture.start()
        if auto:
            hook_when_safe()  # on the sampler's thread: the hook itself is registered on the main thread
    return _capture


def _hook_optimizer(capture: KernelCapture) -> None:
    """Every optimizer's step marks a step (torch's global post-step hook), for a loop not tracked;
    the hook goes when the capture stops. Called on the program's thread only: the in-process Profiler's
    start (the program's own call, as registering a hook itself would be), or `_hook_on_main`; never from
    the sampler's thread (see `hook_when_safe`)."""
    optim = sys.modules.get("torch.optim.optimizer")
    if optim is None and "torch" in sys.modules:  # the program uses torch already: its optimizer module is cheap
        import importlib

        try:
            optim = importlib.import_module("torch.optim.optimizer")
        except Exception:  # noqa: BLE001 - no hook: steps come from a tracked loop only
            optim = None
    register = getattr(optim, "register_optimizer_step_post_hook", None)
    if register is not None:
        capture.hook = register(lambda *_a, **_k: step("optimizer"))


# the pending call on the main thread and the sampler's fallback: one registers. From `_thread`: importing
# `threading` on the sampler's thread would make that thread the program's main one (3.10: exit then hangs)
_HOOK_LOCK = _thread.allocate_lock()


def hook_when_safe() -> None:
    """The capture on by default starts on the sampler's thread (the program was just seen using CUDA), maybe
    while the program is inside optimizer.step() running torch's global post-step hooks: a hook inserted
    into that dict then makes the program's loop raise ("OrderedDict mutated during iteration"). A copy of
    the dict swapped in instead would break the program's own hooks' handles (their remove() would act on
    the old dict). So the hook is registered on the program's main thread, between two of its bytecodes
    (CPython's pending call, Py_AddPendingCall), and only where no thread is inside an optimizer's step
    then (`_hook_on_main`); otherwise the sampler asks again at its next period (agent/supervised.py).
    A main thread that runs no bytecode for a whole period (it waits in `join()` while another thread
    trains) never runs a pending call: then, at the next period, the hook is registered here on the
    sampler's thread, once a look at every thread's stack finds none inside a step (the few bytecodes
    between that look and the insertion are the window left).
    Nothing is asked where the capture is not on by default, is stopped, or already has its hook."""
    cap = _capture
    if cap is None or not cap.by_default or not cap.live or cap.hook is not None or not cap._ours():
        return
    if cap.hook_asked:
        if cap.hook_asked_periods < 1:  # the main thread gets one period to run the pending call
            cap.hook_asked_periods += 1
            return
        # Never waits, and imports nothing under the lock (the main thread may be importing the optimizer's
        # module, and its pending call waits on this lock): the next period tries again.
        if "torch.optim.optimizer" not in sys.modules or not _HOOK_LOCK.acquire(blocking=False):
            return
        try:  # the pending call may run at the same time: one hook only
            if cap.live and cap.hook is None and not _in_optimizer_step():
                _hook_optimizer(cap)
        finally:
            _HOOK_LOCK.release()
        return
    cap.hook_asked_periods = 0
    try:
        cap.hook_asked = True
        if not pending_call(_hook_on_main):
            cap.hook_asked = False  # CPython's queue is full: asked again at the next period
    except Exception:  # noqa: BLE001 - no ctypes (another Python): steps come from a tracked loop only
        cap.hook_asked = True


def _hook_on_main(_arg: Any) -> int:
    """On the main thread, between two of its bytecodes: the optimizer's hook registered unless a thread is
    inside an optimizer's step (its frames in torch/optim/optimizer.py: the hooks may be running). Raises
    nothing (C called it; what it raised would be printed on the program's stderr and lost); a Ctrl-C
    that lands in here is handed back to the program."""
    try:
        t0 = time.thread_time_ns()
        cap = _capture
        if cap is not None:
            with _HOOK_LOCK:
                cap.hook_asked = False
                if cap.live and cap.hook is None and cap._ours() and not _in_optimizer_step():
                    _hook_optimizer(cap)
        _charge_own(time.thread_time_ns() - t0)
    except KeyboardInterrupt:
        import _thread

        _thread.interrupt_main()
    except BaseException:  # noqa: BLE001 - never into the program
        pass
    return 0


_OPTIMIZER_FILE = os.sep + os.path.join("torch", "optim", "optimizer.py")


def _in_optimizer_step() -> bool:
    """Some thread runs code of torch/optim/optimizer.py (its step wrapper runs the hooks' loops). Exact for
    the main thread, which runs this; a program stepping optimizers on other threads as well is covered as
    far as a look at their stacks goes (one could enter a step in the few bytecodes before the insertion)."""
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_filename.endswith(_OPTIMIZER_FILE):
                return True
            frame = frame.f_back
    return False


def register(capture: KernelCapture | None) -> None:
    """The in-process Profiler's capture, so that marked steps reach it (None: unset)."""
    global _capture
    _capture = capture


def step(source: str = "track") -> None:
    """A training step begins (energyprof.torch.track calls this): the scheduled profiler's cue."""
    try:
        if _capture is not None:
            _capture.step(source)
    except BaseException:  # noqa: BLE001 - never into the program (KernelCapture.step already stops on failure)
        pass
