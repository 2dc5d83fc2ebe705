"""PyTorch: CUDA synchronisation, named windows, and a training-loop breakdown per step.

    import energyprof.torch as ept

    for epoch in range(epochs):
        with ept.window("epoch", epoch):
            for x, y in ept.track(loader):      # each step split into wait, pipeline and compute
                ...

Everything here works without a running profile (the loop just runs, and `track` still
times each step) and without CUDA. torch itself is never imported by energyprof: these
functions look for it in `sys.modules`, because a program that has not imported torch has
no CUDA work to wait for, and importing it would cost seconds.

The breakdown. `track(loader)` times, per step, the loop's *wait* in the loader's `next()`
and the time from that batch's arrival until the loop asks for the next one (*compute*),
minus any part the loop marked as `preprocess`. The three are contiguous, so they add up to
the step's wall time. Each phase is also a profiler window (`<name>.fetch` for the wait,
`<name>.preprocess`, `<name>.compute`, index = step number counted across epochs), so each
has its own energy. The data pipeline's own work (*fetch + preprocess*) is measured where it
runs: inside `next()` with no workers (it is the wait), and in each DataLoader worker
otherwise: `track` hands the loader's workers a timed collate function and a timed
`worker_init_fn` for its own passes only, each worker times the dataset read plus collate of
every batch and ships the figure back with the batch, and the loop unwraps it before the
program sees the batch. The fetch stall is computed from these in `analysis.training`.

The forecast. With the number of epochs known (`track(loader, epochs=N)`, or `--expect-epochs N` of
`python -m energyprof`) and a profile running, each pass is a window `<name>.pass`, and after each pass
but the last the tracker predicts the N passes' total energy (the program's), time and carbon with an
interval (`analysis.forecast.forecast_facts`), prints it on stderr as one line of energyprof's (after
epochs 1, 2, 3 and then every tenth of the run; `quiet` prints none) and keeps it in the profile as a
zero-length window `<name>.forecast` whose facts are the figures (`facts.records.Forecast`). Reading a
pass's energy waits for its last sensor reading (about one sensor period; under the supervisor, its reply),
between passes, outside every pass's window.

FLOPs. Asked for with `flops=True` (and `model`), with a profile running, the program's first step runs
under torch's `FlopCounterMode`: the FLOPs of that step as it ran (forward, backward and the optimizer step; the counter
counts matrix products, convolutions and attention) are kept on its compute window (`flops`), with the
device the model's parameters are on (`cuda_device`, -1 for the CPU): `energyprof estimate` fits energy
per step on them. The counter slows that one step (Python sees each operator). Never counted where
torch.compile is in use (torch.compile called in the process, or the model compiled): a dispatch mode around a step turns
compilation off for the whole run and makes torch warn on the program's stderr. Off by default: `model`
alone keeps the parameter count only, and leaves the program's steps as they run.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from ..record import asdict, record
from ..analysis.training import breakdown, loop_breakdown, stall_s
from ..facts.measurement import Measurement
from ..drive.profiler import Profiler
from ..drive.profiler import active_profiler
from ..drive.cuda import cuda_sync
from ..drive.cuda import gpu_memory

__all__ = ["cuda_sync", "gpu_memory", "window", "track", "TrackedLoader", "StepRecord", "breakdown"]


# -- windows ------------------------------------------------------------------------------
@contextlib.contextmanager
def window(name: str, index: int | None = None, profiler: Any = None) -> Iterator[Measurement]:
    """`profiler.window(name, index)` on the given (a Profiler or a Monitor) or running profiler,
    yielding its Measurement; with none running, a Measurement of the time only.

    Lets a training script mark epochs unconditionally and still run without energyprof.
    """
    prof = profiler if profiler is not None else active_profiler()
    if prof is None:
        m = Measurement(name=name, index=index, energy_j=None, program_energy_j=None, complete=False,
                        note="no energyprof profile was running")
        t0 = time.perf_counter_ns()
        try:
            yield m
        finally:
            m.time_s = (time.perf_counter_ns() - t0) / 1e9
        return
    with prof.window(name, index) as m:
        yield m


# -- the data pipeline's work, timed inside each DataLoader worker -------------------------------
class _TimedBatch(NamedTuple):
    """A batch as a worker ships it to a tracked loop: the batch, the worker's time on it, its id.

    A named tuple, so the loader's pin-memory thread rebuilds it with the batch pinned."""

    batch: Any
    work_s: float | None
    worker: int


_batch_started: list[int] = []  # in a worker: when the current batch's dataset read began


class _TimedInit:
    """The loader's worker_init_fn, then a timer on the worker's copy of a map-style dataset.

    DataLoader's fetcher reads a batch through `dataset.__getitems__` when the dataset has one
    (an instance attribute counts), so setting it on the worker's own copy times the read
    without touching the program's dataset object."""

    def __init__(self, inner: Callable[[int], Any] | None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        if self.inner is not None:
            self.inner(worker_id)
        info = sys.modules["torch"].utils.data.get_worker_info()
        dataset = getattr(info, "dataset", None)
        if dataset is None or not hasattr(type(dataset), "__getitem__"):
            return  # an iterable-style dataset: its read is not timed (the collate still is)
        original = getattr(dataset, "__getitems__", None)

        def timed_read(indices: Any) -> Any:
            _batch_started[:] = [time.perf_counter_ns()]
            return original(indices) if original else [dataset[i] for i in indices]

        with contextlib.suppress(AttributeError, TypeError):  # __slots__ or a read-only type
            dataset.__getitems__ = timed_read


class _TimedCollate:
    """The loader's collate_fn, returning the batch with the worker's time on it."""

    def __init__(self, inner: Callable[[Any], Any]) -> None:
        self.inner = inner

    def __call__(self, data: Any) -> Any:
        started = _batch_started.pop() if _batch_started else None
        batch = self.inner(data)
        info = sys.modules["torch"].utils.data.get_worker_info()
        if info is None:  # the main process: nothing to ship
            return batch
        work = (time.perf_counter_ns() - started) / 1e9 if started is not None else None
        return _TimedBatch(batch, work, int(info.id))


def _loop_facts(meta: dict[str, Any], counts: dict[str, float] | None = None) -> dict[str, float] | None:
    """What the saved profile keeps of a step's batch: the worker's time on it (the pipeline),
    which worker, of how many, and whether it waited for that worker to start; `counts`: the
    batch's samples (and, on a pass's first step, the model's parameters)."""
    facts = dict(counts or {})
    if meta.get("workers") and meta.get("pipeline_s") is not None:
        facts.update({"pipeline_s": float(meta["pipeline_s"]), "worker": float(meta.get("worker", -1)),
                      "workers": float(meta["workers"]), "startup": 1.0 if meta.get("startup") else 0.0})
    return facts or None


def batch_samples(batch: Any) -> int | None:
    """The samples in a batch: the first dimension of its first tensor (or array), looked for in
    tuples, lists and dicts as DataLoaders collate them; None when there is none."""
    todo = [batch]
    while todo:
        x = todo.pop(0)
        shape = getattr(x, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, (list, tuple)):
            todo.extend(x)
    return None


def parameter_count(model: Any) -> int | None:
    """A torch module's parameters (each counted once, as `sum(p.numel())` over `model.parameters()`)."""
    try:
        return int(sum(p.numel() for p in model.parameters()))
    except Exception:  # noqa: BLE001 - not a module: no count
        return None


def _end_with_facts(prof: Any, name: str, facts: dict[str, float] | None) -> None:
    """End the window, with the facts where the profiler keeps them (a Monitor does not)."""
    if facts is not None and "facts" in inspect.signature(prof.end_window).parameters:
        prof.end_window(name, facts=facts)
    else:
        prof.end_window(name)


def _workers(loader: Any) -> int:
    """The loader's worker count when it is a torch DataLoader, else 0 (the loop loads)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(loader, torch.utils.data.DataLoader):
        return 0
    return int(loader.num_workers or 0)


# -- the training-loop breakdown -------------------------------------------------------------
@record
class StepRecord:
    """One step as `track` timed it (perf_counter seconds; wait, preprocess, compute are contiguous)."""

    step: int
    epoch: int  # which pass over the loader (0-based)
    wait_s: float  # blocked in next()
    preprocess_s: float  # marked with tracked.preprocess(), in the loop
    compute_s: float
    pipeline_s: float | None = None  # fetch + preprocess in the pipeline, where it ran (None: not measured)
    workers: int = 0
    worker: int | None = None  # the worker that built this batch
    startup: bool = False  # a step whose batch waited for a worker of this pass to start
    startup_s: float = 0.0  # time iter(loader) took to start them (on the startup step)
    gpu_allocated_bytes: int | None = None
    gpu_peak_bytes: int | None = None  # the allocator's peak during this step

    @property
    def time_s(self) -> float:
        return self.wait_s + self.preprocess_s + self.compute_s

    @property
    def stall_s(self) -> float | None:
        if self.pipeline_s is None or self.startup:
            return None
        return stall_s(self.pipeline_s, self.preprocess_s, self.compute_s, self.workers)


class TrackedLoader:
    """An iterable over `loader` that times each step and marks its phases as windows."""

    def __init__(self, loader: Iterable[Any], profiler: Profiler | None = None, name: str = "step",
                 gpu_memory: bool = True, optimizer: Any = None, model: Any = None,
                 dataset: str | None = None, epochs: int | None = None, flops: bool = False) -> None:
        self.loader = loader
        self.count_flops = bool(flops)  # the first step under FlopCounterMode, asked for only
        self.optimizer = optimizer  # Zeus's callbacks (a PowerLimitOptimizer): called per pass and per step
        self.model = model  # its parameter count is kept with the first step of each pass
        self.dataset = dataset  # the page-cache residency of the files under it, at each pass's start and end
        self.cache: list[dict[str, Any]] = []
        self.name = name
        self._profiler = profiler
        self.gpu_memory = gpu_memory
        self.steps: list[StepRecord] = []
        self.end_waits_s: list[float] = []  # per pass: the final next() that found no more data
        self.passes = 0
        self._next_step = 0
        self._pre_ns = 0
        self._pre_open: int | None = None
        self._current: int | None = None
        self._own_iterator: Any = None  # persistent workers started by a tracked pass
        self.epochs = epochs  # passes the run will make (None: the run's --expect-epochs, if any)
        self.forecasts: list[dict[str, float]] = []  # after each finished pass but the last (analysis.forecast)
        self._passes_done: list[tuple[float | None, float, int]] = []  # per finished pass: energy, time, pass
        self._load_at_start: tuple[int, int, int] | None = None  # `_machine_load` as the first pass began
        self._pass_facts: dict[str, Any] = {}  # carbon setting and whether any energy was estimated
        self._flop_mode: Any = None  # FlopCounterMode around the first step, while it runs
        self.flops: float | None = None  # the first step's FLOPs (FlopCounterMode), once counted

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, attr: str) -> Any:  # dataset, batch_size, sampler, ... pass through
        if attr == "loader":
            raise AttributeError(attr)
        return getattr(self.loader, attr)

    def _prof(self) -> Profiler | None:
        return self._profiler if self._profiler is not None else active_profiler()

    def _iterate(self, workers: int) -> tuple[Iterator[Any], bool]:
        """iter(loader), with timed workers for this pass only; (iterator, whether workers started).

        The program's own loader keeps its collate_fn and worker_init_fn; with persistent
        workers the tracked passes keep their own set, so a plain `for b in loader` elsewhere
        never sees a timed batch."""
        loader: Any = self.loader
        if not workers:
            return iter(loader), False
        persistent = bool(getattr(loader, "persistent_workers", False))
        saved = (loader.collate_fn, loader.worker_init_fn)
        theirs = loader.__dict__.get("_iterator")
        started = not persistent or self._own_iterator is None
        try:
            loader.collate_fn = _TimedCollate(saved[0])
            loader.worker_init_fn = _TimedInit(saved[1])
            if persistent:
                loader.__dict__["_iterator"] = self._own_iterator
            it = iter(loader)
        finally:
            loader.collate_fn, loader.worker_init_fn = saved
            if persistent:
                self._own_iterator = loader.__dict__.get("_iterator")
                loader.__dict__["_iterator"] = theirs
        return it, started

    def __iter__(self) -> Iterator[Any]:
        name, prof = self.name, self._prof()
        epoch = self.passes
        self.passes += 1
        workers = _workers(self.loader)
        pass_window = self._begin_pass(prof, epoch)
        t0 = time.perf_counter_ns()
        it, started = self._iterate(workers)
        startup_ns = time.perf_counter_ns() - t0
        fetch_w, compute_w = f"{name}.fetch", f"{name}.compute"
        t_batch: int | None = None  # when the current batch arrived
        wait_ns = 0
        step = -1
        first = True
        booted: set[int] = set()  # workers whose first batch of this pass has arrived
        first_step = True
        # --watch-cache PATH reaches the program as collect/pagecache.WATCH_ENV (read only while profiled)
        dataset = self.dataset or (os.environ.get("ENERGYPROF_WATCH_CACHE") if prof is not None else None)
        measured_end = False
        self._residency(prof, dataset, epoch, "start")
        meta: dict[str, Any] = {}
        if self.optimizer is not None:
            self.optimizer.on_epoch_begin()
        try:
            while True:
                t = time.perf_counter_ns()
                if t_batch is not None:
                    arrived, t_batch = t_batch, None
                    self._finish_step(prof, compute_w, step, epoch, wait_ns, t - arrived, meta)
                step = self._next_step
                kernels = sys.modules.get("energyprof.agent.kernel_capture")  # --gpu-kernel-steps' cue, if loaded
                if kernels is not None:
                    kernels.step()
                if prof is not None:
                    prof.begin_window(fetch_w, step)
                try:
                    batch = next(it)
                except StopIteration:
                    t_end = time.perf_counter_ns()
                    if prof is not None:
                        prof.end_window(fetch_w)
                    self.end_waits_s.append((t_end - t) / 1e9)
                    measured_end = True
                    self._residency(prof, dataset, epoch, "end")
                    self._end_pass(prof, pass_window, epoch, complete=True)
                    pass_window = None
                    return
                t_batch = time.perf_counter_ns()
                wait_ns = t_batch - t
                meta = {"workers": workers, "startup": bool(first and started and workers),
                        "startup_s": startup_ns / 1e9 if first and started and workers else 0.0}
                if type(batch) is _TimedBatch:
                    batch, meta["pipeline_s"], meta["worker"] = batch
                    # each new worker's first batch waits for that worker to boot: start-up too
                    meta["startup"] = started and meta["worker"] not in booted
                    booted.add(meta["worker"])
                elif not workers:
                    meta["pipeline_s"] = wait_ns / 1e9  # loading happens inside next()
                first = False
                self._next_step += 1
                self._current, self._pre_ns = step, 0
                if prof is not None:
                    counts: dict[str, float] = {}
                    n = batch_samples(batch)
                    if n is not None:
                        counts["samples"] = float(n)
                    if first_step and self.model is not None:
                        params = parameter_count(self.model)
                        if params is not None:
                            counts["parameters"] = float(params)
                    first_step = False
                    _end_with_facts(prof, fetch_w, _loop_facts(meta, counts))
                    prof.begin_window(compute_w, step)
                if self.optimizer is not None:
                    self.optimizer.on_step_begin()
                if (self.count_flops and prof is not None and self.model is not None and self.flops is None
                        and self._flop_mode is None):
                    self._flop_mode = _start_flop_count(self.model)
                yield batch
        finally:
            # the loop broke out, raised, or the generator was closed: end the open step
            if t_batch is not None:
                self._finish_step(prof, compute_w, step, epoch, wait_ns, time.perf_counter_ns() - t_batch, meta)
            self._current = None
            if not measured_end:  # a pass that broke out early ends here: its residency too
                self._residency(prof, dataset, epoch, "end")
            if pass_window is not None:  # a pass cut short: its window ends, no forecast counts it
                self._end_pass(prof, pass_window, epoch, complete=False)
            if self.optimizer is not None:
                self.optimizer.on_epoch_end()

    # -- the forecast (analysis/forecast.py): a window per pass, a prediction after each ---------------
    def _expected(self, prof: Any) -> int | None:
        """The passes the run will make: `epochs=`, else the run's --expect-epochs (None: no forecast)."""
        if self.epochs is not None:
            return int(self.epochs)
        n = _run_setting(prof, "expect_epochs", "epochs")
        return int(n) if n else None

    def _begin_pass(self, prof: Any, epoch: int) -> Any:
        """Open the pass's window when a forecast is wanted: (context, Measurement), else None."""
        if prof is None or not self._expected(prof) or not hasattr(prof, "window"):
            return None
        if not self._passes_done:
            self._load_at_start = _machine_load()
        try:
            cm = prof.window(f"{self.name}.pass", epoch)
            return cm, cm.__enter__()
        except Exception:  # noqa: BLE001 - a forecast is never worth the program's run
            return None

    def _end_pass(self, prof: Any, opened: Any, epoch: int, complete: bool) -> None:
        if opened is None:
            return
        cm, m = opened
        try:
            cm.__exit__(None, None, None)
        except Exception:  # noqa: BLE001
            return
        n = self._expected(prof)
        if not complete or not n:
            return
        try:
            self._forecast(prof, m, epoch, n)
        except Exception:  # noqa: BLE001 - a forecast is never worth the program's run
            pass

    def _forecast(self, prof: Any, m: Measurement, epoch: int, n: int) -> None:
        from ..analysis.forecast import forecast_facts

        # reading a figure waits (bounded) for the pass's last sensor reading: between passes, in no pass
        energy = m.program_total_j
        self._passes_done.append((energy, float(m.time_s), epoch))
        if m.estimated:
            self._pass_facts["estimated"] = True
        if m.intensity_g_per_kwh is not None:
            self._pass_facts["carbon"] = (m.intensity_g_per_kwh, m.pue)
        k = len(self._passes_done)
        if k >= n:
            return  # the run is done: its outcome is in the profile
        energies = [e for e, _, _ in self._passes_done]
        times = [t for _, t, _ in self._passes_done]
        first = self._passes_done[0][2]
        step_times = [s.time_s for s in self.steps if s.epoch == first] if k == 1 else []
        g, pue = self._pass_facts.get("carbon", (None, 1.0))
        period = _run_setting(prof, "sensor_interval", "sensor_interval")
        others = _others_share(self._load_at_start, _machine_load()) if k == 1 else 0.0
        facts = forecast_facts(energies if all(e is not None for e in energies) else None, times, n, step_times,
                               g, pue, bool(self._pass_facts.get("estimated")), sensor_period_s=float(period or 0.0),
                               others_share=others)
        facts = {k2: v for k2, v in facts.items() if math.isfinite(v)}
        self.forecasts.append(facts)
        w = f"{self.name}.forecast"
        prof.begin_window(w, k)
        _end_with_facts(prof, w, facts)
        # one line per run, not per rank: a distributed job's other ranks keep theirs in the profile only
        if _should_print(k, n) and _run_setting(prof, "quiet", "quiet") not in (True, "1") \
                and os.environ.get("RANK", "0") in ("", "0"):
            _stderr_line(forecast_line(self.name, facts))
        send_epoch_metrics(self.name, k, facts)

    def _flop_facts(self) -> dict[str, float] | None:
        """The first step's FLOPs and the model's device, once its counter is stopped (None: not counted)."""
        mode, self._flop_mode = self._flop_mode, None
        if mode is None:
            return None
        counted = _stop_flop_count(mode)
        if counted is None:
            self.flops = -1.0  # tried: not again
            return None
        self.flops, shares = counted
        return {"flops": self.flops, "cuda_device": float(_model_device(self.model)),
                **{f"flop_share_{k}": v for k, v in shares.items()}}

    def _residency(self, prof: Profiler | None, dataset: str | None, epoch: int, when: str) -> None:
        """The dataset's page-cache residency now, kept on the tracker and, as a zero-length window's facts
        (`<name>.cache.start|end`, index = pass), in the profile: the training table reads them per epoch,
        the windows table leaves them out."""
        if dataset is None:
            return
        from ..collect import pagecache

        if not pagecache.supported():
            return
        r = pagecache.residency(dataset)
        self.cache.append({"epoch": epoch, "when": when, **r})
        if prof is not None and r["fraction"] is not None:
            prof.begin_window(f"{self.name}.cache.{when}", epoch)
            _end_with_facts(prof, f"{self.name}.cache.{when}",
                            {"residency": float(r["fraction"]), "bytes": float(r["bytes"]), "files": float(r["files"]),
                             "sampled": float(r["sampled"] or 0)})

    def _finish_step(self, prof: Profiler | None, compute_w: str, step: int, epoch: int, wait_ns: int,
                     since_batch_ns: int, meta: dict[str, Any]) -> None:
        if self._pre_open is not None:  # a preprocess block left open: close it now
            self._pre_ns += time.perf_counter_ns() - self._pre_open
            self._pre_open = None
        if prof is not None:
            _end_with_facts(prof, compute_w, self._flop_facts())
        mem = gpu_memory() if self.gpu_memory else None
        if mem is not None:
            with contextlib.suppress(Exception):
                sys.modules["torch"].cuda.reset_peak_memory_stats()
        pre_ns = min(self._pre_ns, since_batch_ns)
        self.steps.append(StepRecord(
            step=step, epoch=epoch, wait_s=wait_ns / 1e9, preprocess_s=pre_ns / 1e9,
            compute_s=(since_batch_ns - pre_ns) / 1e9, **meta,
            gpu_allocated_bytes=mem["allocated_bytes"] if mem else None,
            gpu_peak_bytes=mem["peak_bytes"] if mem else None,
        ))
        self._current = None
        if self.optimizer is not None:
            self.optimizer.on_step_end()

    @contextlib.contextmanager
    def preprocess(self) -> Iterator[None]:
        """Mark the part of a step that prepares the batch in the loop (augmentation, `.to(device)`).

        It is taken out of the step's compute time and counted in the stall in full (the
        loop's own preprocessing overlaps nothing)."""
        step = self._current
        prof = self._prof()
        if step is None:
            yield
            return
        if prof is not None:
            prof.begin_window(f"{self.name}.preprocess", step)
        t = self._pre_open = time.perf_counter_ns()
        try:
            yield
        finally:
            if self._pre_open is not None:
                self._pre_ns += time.perf_counter_ns() - t
                self._pre_open = None
            if prof is not None:
                prof.end_window(f"{self.name}.preprocess")

    def records(self) -> list[dict[str, Any]]:
        """The steps as plain dicts, for `analysis.training` (and `breakdown(profile, steps=...)`)."""
        return [dict(asdict(s), time_s=s.time_s, stall_s=s.stall_s) for s in self.steps]

    def summary(self, warmup: int = 0) -> dict[str, Any]:
        """Per-pass wait, pipeline, compute and stall with start-up rows (timings; no energy: see `breakdown`)."""
        return {"name": self.name, **loop_breakdown(self.records(), warmup), "steps": self.records()}


# -- the forecast and FLOPs: run settings, the line, counting ----------------------------------------
def _run_setting(prof: Any, option: str, agent_key: str) -> Any:
    """A run option as the running profile holds it: a Profiler's or Monitor's Options, or under
    `python -m energyprof` the agent's configuration (numbers as floats, `quiet` as "1")."""
    options = getattr(prof, "options", None)
    if options is not None:
        return getattr(options, option, None)
    config = getattr(prof, "config", None)
    raw = config.get(agent_key) if isinstance(config, dict) else None
    if not raw or option == "quiet":
        return raw or None
    try:
        return float(raw)
    except ValueError:
        return None


def _should_print(k: int, n: int) -> bool:
    """After epochs 1, 2 and 3, then every tenth of the run: a long run's stderr is not a forecast log."""
    return k <= 3 or k % max(1, n // 10) == 0


def _stderr_line(text: str) -> None:
    """One line of energyprof's on the process's standard error (the descriptor: the program's sys.stderr may
    be its own object), never on its stdout."""
    with contextlib.suppress(OSError):
        os.write(2, (text + "\n").encode("utf-8", "replace"))


def send_epoch_metrics(loop: str, epoch: int, metrics: dict[str, float]) -> bool:
    """The forecast after each epoch to the run's live sinks (MLflow metrics, InfluxDB, a Prometheus
    pushgateway) as `forecast.<loop>.<figure>` at step = epochs done, through the live export's
    `energyprof.log_metrics` (which never blocks or raises, and sends nothing where no live
    export runs). The one call site: a tree without that module sends nothing. False: nothing was sent."""
    try:
        from .metrics import log_metrics
    except ImportError:
        return False
    try:
        return bool(log_metrics({f"forecast.{loop}.{k}": v for k, v in metrics.items()}, step=epoch))
    except Exception:  # noqa: BLE001 - a figure is never worth the program's run
        return False


def forecast_line(loop: str, f: dict[str, float]) -> str:
    """The one line printed after an epoch: energy, time and carbon with their intervals."""
    from ..render.format import fmt_energy, fmt_grams, fmt_seconds

    def part(name: str, unit: str, fmt: Any) -> str:
        v = f.get(f"{name}_{unit}")
        if v is None:
            return ""
        lo, hi = f.get(f"{name}_low_{unit}"), f.get(f"{name}_high_{unit}")
        return fmt(v) + (f" [{fmt(lo)}, {fmt(hi)}]" if lo is not None and hi is not None else " [no spread yet]")

    k, n = int(f["epochs_done"]), int(f["epochs"])
    pieces = [p for p in (part("energy", "j", fmt_energy), part("time", "s", fmt_seconds),
                          part("carbon", "g", fmt_grams)) if p]
    basis = "the first epoch's steps" if f.get("by_steps") else "the epochs' spread"
    kind = "estimated" if f.get("estimated") else "measured"
    return (f"energyprof: forecast for {loop!r} after epoch {k} of {n}: " + ", ".join(pieces)
            + f" ({int(round(f.get('confidence', 0.95) * 100))}% interval from {basis}; program energy, {kind} so far)")


def _machine_load() -> tuple[int, int, int] | None:
    """(now, the machine's busy CPU ns, this process's CPU ns), or None where /proc/stat cannot be read."""
    from ..collect.probes import machine_busy_ns

    try:
        return time.perf_counter_ns(), machine_busy_ns(), time.process_time_ns()
    except (OSError, ValueError):
        return None


def _others_share(a: tuple[int, int, int] | None, b: tuple[int, int, int] | None) -> float:
    """The share of the machine's CPU that other processes used between two `_machine_load` readings (0..1):
    the neighbours the first epoch shared the machine with, whose coming and going moves the pace of the
    epochs to come. A DataLoader's workers count as others here: an interval wider, never narrower."""
    from ..collect.probes import logical_cpus

    if a is None or b is None or b[0] <= a[0]:
        return 0.0
    others = (b[1] - a[1]) - (b[2] - a[2])
    return min(max(others / ((b[0] - a[0]) * logical_cpus()), 0.0), 1.0)


def _start_flop_count(model: Any) -> Any:
    """torch's FlopCounterMode, entered (None: no torch, torch.compile in use, or it would not start). A
    dispatch mode turns torch.compile off for the run and makes it warn: never where dynamo is loaded.
    Elementwise operators are counted too, apart from the FLOPs torch counts (matrix products, convolutions,
    attention), so one run of the counter gives both the step's FLOPs and how they split among operator
    families (integrations/flop_families.py)."""
    torch = sys.modules.get("torch")
    if torch is None or _compile_in_use(model):
        return None
    try:
        from torch.utils.flop_counter import FlopCounterMode

        from .flop_families import elementwise_mapping

        mode = FlopCounterMode(display=False, custom_mapping=elementwise_mapping(torch))
        mode.__enter__()
        return mode
    except Exception:  # noqa: BLE001 - counting is never worth the program's run
        return None


# Loaded by torch.compile (every backend, at the call), not by torch's optimizers: torch._dynamo itself is
# imported by every optimizer's construction, so its presence says nothing about compilation.
_COMPILE_MODULES = ("torch._dynamo.repro.after_dynamo", "torch._dynamo.backends.common", "torch._dynamo.testing")


def _compile_in_use(model: Any) -> bool:
    """torch.compile called in this process, or the model a compiled one."""
    if any(name in sys.modules for name in _COMPILE_MODULES):
        return True
    return hasattr(model, "_orig_mod") or type(model).__name__ == "OptimizedModule"


def _stop_flop_count(mode: Any) -> tuple[float, dict[str, float]] | None:
    """The counted step's FLOPs (as torch counts them) and its families' shares (`flop_shares`), or None."""
    from .flop_families import flop_shares

    try:
        mode.__exit__(None, None, None)
        counts = {str(op): float(n) for op, n in mode.get_flop_counts().get("Global", {}).items()}
    except Exception:  # noqa: BLE001
        return None
    flops, shares = flop_shares(counts)
    return (flops, shares) if flops > 0 and math.isfinite(flops) else None


def _model_device(model: Any) -> int:
    """The CUDA index of the model's first parameter, -1 on the CPU (or with no parameter)."""
    try:
        d = next(iter(model.parameters())).device
    except Exception:  # noqa: BLE001
        return -1
    return int(d.index or 0) if getattr(d, "type", "cpu") == "cuda" else -1


def track(loader: Iterable[Any], profiler: Profiler | None = None, name: str = "step",
          gpu_memory: bool = True, optimizer: Any = None, model: Any = None,
          dataset: str | None = None, epochs: int | None = None, flops: bool = False) -> TrackedLoader:
    """Wrap a DataLoader (any iterable) so each step is split into wait, pipeline and compute.

    `profiler` defaults to the one running when the loop starts (none: timing only).
    With `gpu_memory` and CUDA in use, each step records the allocator's current and peak
    bytes, and resets the peak (`torch.cuda.reset_peak_memory_stats`) so the next step's
    peak is its own. `optimizer` (a `PowerLimitOptimizer`, or anything with Zeus's callbacks) has
    `on_epoch_begin`/`on_epoch_end` called per pass and `on_step_begin`/`on_step_end` per step.
    Each step keeps its batch's samples (the first dimension of its first tensor); with `model`, its
    parameter count is kept too; with `dataset` (a folder or file), the fraction of it in the page
    cache is measured at each pass's start and end (collect/pagecache.py). With `epochs` (the passes the
    run will make; default: the run's --expect-epochs), each pass but the last ends with a forecast of the
    run's energy, time and carbon (see the module's docstring); with `model` and `flops=True`, the first
    step's FLOPs are counted (torch's FlopCounterMode, for `energyprof estimate`). Never where torch.compile
    is in use (torch.compile called in the process, or the model compiled): the counter would turn compilation off for the
    whole run and make torch warn on the program's stderr.
    """
    return TrackedLoader(loader, profiler, name, gpu_memory, optimizer, model, dataset, epochs, flops)
