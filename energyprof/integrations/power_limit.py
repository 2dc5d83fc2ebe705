"""An online power-limit optimizer in the training loop, with Zeus's callback names.

For each candidate limit, from the highest down in `step_w` steps: `warmup_steps` steps at that limit,
then one window of `profile_steps` steps whose energy (counter difference) and time are measured with
a synchronise at both edges. Then the objective picks a limit from the windows and it stays set.

Knob-generic: it drives `Knob` objects (a GPU's NVML power limit by default; a RAPL limit or the CPU's
maximum frequency for CPU training) and reads energy from a callable (the knobs' own counters by
default). Under DDP (torch.distributed initialised) each window's energy is summed and its time maxed
over the ranks, so every rank chooses the same limit, and `Cost` is given the real world size.

A knob it cannot read, range or set is found at construction (it sets the current value back, which
needs the same privilege as any other value): one warning line and the optimizer does nothing, or a
`KnobError` with `strict=True`. Never a failure mid-training. Every change goes through this process's
keeper (knobs/keeper.py): at `on_train_end`, leaving a `with` block, or a normal exit the originals are
restored in this process (or the chosen one kept with `keep=True`); after a signal's default action,
`os._exit` or kill -9 the keeper's process restores them.

Everything it needs is in place before its first window opens (the profile's hooks imported and
bound at construction), and a window's edges are read after the profile's window opens and before it
closes, at the same instants when the clock is the default: the time the optimizer chooses from is
the window's time in the profile.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
import warnings
from typing import Any, Callable, Sequence

from ..analysis.optimize import Energy, Objective
from ..knobs import keeper as _keeper
from ..knobs.base import Knob, KnobError

WINDOW_PREFIX = "power_limit"


def _default_sync() -> None:
    torch = sys.modules.get("torch")  # a program that has not imported torch has no CUDA work to wait for
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - a broken CUDA state is the program's to report, not ours
            pass


def _distributed() -> Any:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def candidates(low: float, high: float, step_w: float) -> list[float]:
    """From `high` down in `step_w` steps, never below `low`."""
    out, lim = [], high
    while lim >= low - 1e-9:
        out.append(round(lim, 6))
        lim -= step_w
    return out


def _collective_device(dist: Any, torch: Any) -> Any:
    """NCCL reduces only CUDA tensors; gloo and MPI take CPU ones."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class PowerLimitOptimizer:
    def __init__(self, objective: Objective | None = None, warmup_steps: int = 10, profile_steps: int = 40,
                 step_w: float = 25.0, gpus: Sequence[int] | None = None, keep: bool = False,
                 knobs: Sequence[Knob] | None = None, energy: Callable[[], float] | None = None,
                 clock: Callable[[], float] = time.perf_counter, sync: Callable[[], None] | None = None,
                 binding: Any = None, strict: bool = False, profiler: Any = None) -> None:
        if warmup_steps < 0 or profile_steps < 1 or step_w <= 0:
            raise ValueError("warmup_steps >= 0, profile_steps >= 1 and step_w > 0 are required")
        self.objective = objective if objective is not None else Energy()
        self.warmup_steps, self.profile_steps, self.step_w, self.keep = warmup_steps, profile_steps, step_w, keep
        self._clock, self._sync, self._profiler = clock, sync or _default_sync, profiler
        self.windows: dict[float, tuple[float, float]] = {}  # limit -> (energy J, time s), all ranks
        self.optimal_limit_w: float | None = None
        self.state = "warmup"
        self.enabled = False
        self.disabled_reason: str | None = None
        self.knobs: list[Knob] = []
        self._closed = False
        self._keeper = _keeper.shared()
        self._active: Callable[[], Any] = (lambda: profiler) if profiler is not None else _no_profile
        error: KnobError | None = None
        try:
            self._setup(gpus, knobs, energy, binding)
        except KnobError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - an energy reader or knob of the user's: one line, not a traceback
            error = KnobError(f"{type(exc).__name__}: {exc}")
        if not self._all_ranks_ready(error is None) and error is None:
            error = KnobError("another rank cannot set its limit, so no rank changes its limit (ranks measure together)")
        if error is not None:
            self.disabled_reason = str(error)
            self._restore()
            if strict:
                raise error
            warnings.warn(f"energyprof PowerLimitOptimizer disabled: {error}", RuntimeWarning, stacklevel=2)
            return
        self.enabled = True
        self._index = 0
        self._steps = 0
        self._start: tuple[float, float] | None = None
        self._open_window: str | None = None
        if profiler is None:
            # The profile's hooks are imported, and under `python -m energyprof` bound, now: imported at the first
            # window's start they cost 28-93 ms of a 0.67 s window (a V100's 250 W window read 0.69-0.77 s).
            from ..drive.profiler import active_profiler

            self._active = active_profiler
            active_profiler()
        atexit.register(self.close)
        self._apply(self.candidates[0])

    def _setup(self, gpus: Sequence[int] | None, knobs: Sequence[Knob] | None,
               energy: Callable[[], float] | None, binding: Any) -> None:
        if knobs is None:
            from ..knobs.nvml import NvmlPowerLimit

            if gpus is None:  # under DDP each rank drives the GPU it trains on
                gpus = [int(os.environ.get("LOCAL_RANK", "0"))]
            knobs = [NvmlPowerLimit(i, binding=binding) for i in gpus]
        if not knobs:
            raise KnobError("no knob to drive")
        self.knobs = list(knobs)
        if energy is None:
            if not all(hasattr(k, "energy_j") for k in self.knobs):
                raise KnobError("no energy reader: pass energy= (a callable returning joules) for these knobs")
            energy = lambda: sum(k.energy_j() for k in self.knobs)  # noqa: E731
        self._energy = energy
        ranges = [k.range() for k in self.knobs]
        low, high = max(r.low for r in ranges), min(r.high for r in ranges)
        if low > high:
            raise KnobError("the knobs share no common range")
        self.max_limit_w = high
        self.candidates = candidates(low, high, self.step_w)
        for k in self.knobs:  # the privilege check: set the value it has (the same call any limit needs)
            self._keeper.set(k, k.read(), owner=self)
        self._energy()

    # -- Zeus's callbacks ---------------------------------------------------------------------
    def on_epoch_begin(self) -> None:
        pass

    def on_epoch_end(self) -> None:
        """An epoch that ends mid-window discards that window: the next epoch warms up and measures it again."""
        if self.enabled and self.state == "profiling":
            self._end_profiler_window({"discarded": 1.0})
            self._start = None
            self.state, self._steps = "warmup", 0

    def on_step_begin(self) -> None:
        if self.enabled and self.state != "optimal":
            self._guarded(self._step_begin)

    def on_step_end(self) -> None:
        if self.enabled and self.state != "optimal":
            self._guarded(self._step_end)

    def _guarded(self, fn: Callable[[], None]) -> None:
        """A reader or knob that fails mid-training (a GPU lost) stops the optimizer, never the training."""
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            self.enabled, self.disabled_reason = False, f"{type(exc).__name__}: {exc}"
            warnings.warn(f"energyprof PowerLimitOptimizer stopped: {self.disabled_reason}", RuntimeWarning, stacklevel=3)
            self.close()

    def _step_begin(self) -> None:
        if self.state == "warmup" and self._steps >= self.warmup_steps:
            self._sync()
            t0 = self._begin_profiler_window()  # first: the profile's own work stays outside the measured span
            self._start = (self._energy(), t0)
            self.state, self._steps = "profiling", 0

    def _step_end(self) -> None:
        self._steps += 1
        if self.state == "profiling" and self._steps >= self.profile_steps:
            self._sync()
            t1 = self._now()
            e1 = self._energy()
            assert self._start is not None
            energy, elapsed = self._reduce(e1 - self._start[0], self._elapsed(self._start[1], t1))
            limit = self.candidates[self._index]
            self.windows[limit] = (energy, elapsed)
            facts = {"limit_w": limit, "window_energy_j": energy, "window_time_s": elapsed,
                     "world_size": float(self.world_size())}
            self._index += 1
            self._steps = 0
            if self._index < len(self.candidates):
                self._end_profiler_window(facts, t1)
                self.state = "warmup"
                self._apply(self.candidates[self._index])
            else:
                self.optimal_limit_w = self.objective.choose(self.windows, self.max_limit_w, self.world_size())
                self._end_profiler_window({**facts, "chosen_w": self.optimal_limit_w}, t1)  # the last carries the choice
                self._apply(self.optimal_limit_w)
                self.state = "optimal"

    def on_train_end(self) -> None:
        self.close()

    # -- the rest ------------------------------------------------------------------------------
    def _reduce(self, energy: float, elapsed: float) -> tuple[float, float]:
        dist = _distributed()
        if dist is None:
            return energy, elapsed
        import torch

        device = _collective_device(dist, torch)
        e = torch.tensor([energy], dtype=torch.float64, device=device)
        t = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(e, op=dist.ReduceOp.SUM)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(e.item()), float(t.item())

    def _all_ranks_ready(self, ready: bool) -> bool:
        """Under DDP every rank must drive its knob, or none: a window's all-reduce needs them all."""
        dist = _distributed()
        if dist is None:
            return ready
        import torch

        flag = torch.tensor([1 if ready else 0], dtype=torch.int64, device=_collective_device(dist, torch))
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def world_size(self) -> int:
        dist = _distributed()
        return int(dist.get_world_size()) if dist is not None else 1

    def _apply(self, limit: float) -> None:
        for k in self.knobs:
            try:
                self._keeper.set(k, limit, owner=self)
            except KnobError as exc:  # checked at construction; if it fails now, stop, never crash training
                self.enabled, self.disabled_reason = False, str(exc)
                warnings.warn(f"energyprof PowerLimitOptimizer stopped: {exc}", RuntimeWarning, stacklevel=3)
                self.close()
                return

    def _now(self) -> float:
        """A window's edge: with the default clock, perf_counter_ns, the profile's own clock, handed to the
        profile as its mark, so the window's time is one figure in the optimizer and in the profile."""
        return time.perf_counter_ns() if self._clock is time.perf_counter else self._clock()

    def _elapsed(self, t0: float, t1: float) -> float:
        return (t1 - t0) / 1e9 if self._clock is time.perf_counter else t1 - t0

    def _begin_profiler_window(self) -> float:
        """Open the profile's window and read the start edge after it (the profile's work stays outside)."""
        prof = self._active()
        if prof is None:
            return self._now()
        self._open_window = f"{WINDOW_PREFIX}:{self.candidates[self._index]:g}W"
        if self._clock is time.perf_counter:  # one clock: the window starts at the optimizer's own edge
            t0 = self._now()
            prof.begin_window(self._open_window, t_ns=int(t0))
            return t0
        prof.begin_window(self._open_window)
        return self._now()

    def _end_profiler_window(self, facts: dict[str, float], t1: float | None = None) -> None:
        """End the profile's window with what the optimizer measured (kept as the window's `loop` facts):
        a window cut by an epoch's end says `discarded`, and the report leaves it out of the sweep. `t1`: the
        end the optimizer read, given to the profile as its mark where the clock is the default."""
        prof = self._active()
        if prof is not None and self._open_window is not None:
            t_ns = int(t1) if t1 is not None and self._clock is time.perf_counter else None
            prof.end_window(self._open_window, facts=facts, t_ns=t_ns)  # drive/windows.py: Profiler and Monitor alike
        self._open_window = None

    def table(self) -> list[dict[str, Any]]:
        """Each measured limit's window (energy and time, measured) and which one was chosen."""
        return [{"limit_w": lim, "energy_j": e, "time_s": t, "chosen": lim == self.optimal_limit_w}
                for lim, (e, t) in sorted(self.windows.items(), reverse=True)]

    def close(self) -> None:
        """Restore the original values (or keep the chosen one with keep=True). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self.keep and self.state == "optimal" and self.enabled:
            self._keeper.release(self)
            return
        self._restore()

    def _restore(self) -> None:
        for line in self._keeper.restore(owner=self):  # at exit: said, never raised
            print(f"energyprof: {line}", file=sys.stderr)

    def __enter__(self) -> "PowerLimitOptimizer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _no_profile() -> Any:
    return None
