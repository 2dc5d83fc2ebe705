"""Profiler: start/stop a profile, name windows; owns the sampler, sensors and collector."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import sys
import threading
import time
from typing import Any, Iterator

from . import __version__, memory, probes
from .core.ledger import Ledger
from .core.tree import build_profile
from .collector import Collector
from .probes import OwnClocks
from .options import Options
from .profile import Profile
from .stacks import make_sampler
from .stacks.frames import anchor_depth

_active_lock = threading.Lock()
_active: Profiler | None = None


def active_profiler() -> Profiler | None:
    return _active


class Profiler:
    """Profile a region of a program. `start()`, run, `stop()` returns the Profile.

    Only one profile runs at a time in a process: a second `start()` raises, and the
    decorator treats a nested call as part of the profile already running.
    """

    def __init__(self, options: Options | None = None, **kwargs: Any) -> None:
        self.options = options if options is not None else Options.from_kwargs(kwargs)
        self.profile: Profile | None = None
        self._collector: Collector | None = None
        self._sampler: Any = None
        self._ledger: Ledger | None = None
        self._discovery_notes: list[str] = []
        self._started_wall = 0.0
        self.target: str | None = None
        self.argv: list[str] = list(sys.argv)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self, target: str | None = None, _anchor: int | None = None) -> Profiler:
        global _active
        with _active_lock:
            if _active is not None:
                raise RuntimeError("an energyprof profile is already running in this process")
            _active = self
        try:
            self._start(target, _anchor if _anchor is not None else anchor_depth(sys._getframe(1)))
        except BaseException:
            with _active_lock:
                _active = None
            raise
        return self

    def _start(self, target: str | None, anchor: int) -> None:
        from . import sensors

        o = self.options
        found = sensors.discover(o.power_trace, o.powercap_root, o.cpu_tdp, gpus=o.gpus)
        self._discovery_notes = found.notes
        if not o.quiet:
            for note in found.notes:
                if note.startswith("RAPL: cannot read"):
                    print(f"energyprof: {note}", file=sys.stderr)
        self.target = target or self.target
        self._ledger = Ledger([s.describe() for s in found.sensors], cpus=probes.logical_cpus())
        own = OwnClocks()
        self._collector = Collector(
            found.sensors, self._ledger, o.sensor_interval, own, children=o.children,
            sensor_timeout_s=o.sensor_timeout, checkpoint=self._checkpoint_header,
            checkpoint_path=o.checkpoint, checkpoint_interval_s=o.checkpoint_interval,
            rss=o.memory != "off", rss_children=o.memory_children,
        )
        self._started_wall = time.time()
        self._cuda_sync()
        self._peak_reset = bool(o.peak_reset and o.memory != "off" and probes.reset_peak())
        self._allocations = memory.ExactAllocations() if o.memory == "exact" else None
        self._collector.start()
        self._sampler = make_sampler(o.sampler, self._ledger.stacks, self._collector.emit, o.interval,
                                     own, anchor)
        self._sampler.start()
        if self._allocations is not None:
            self._allocations.start()

    def stop(self, exit_status: dict[str, Any] | None = None) -> Profile:
        global _active
        if self._collector is None or self._ledger is None:
            raise RuntimeError("Profiler.stop() called before start()")
        self._cuda_sync()
        peak = probes.read_peak() if self._peak_reset else None
        allocations = self._allocations.stop() if self._allocations is not None else None
        try:
            self._sampler.stop()
            self._collector.stop()
        finally:
            with _active_lock:
                _active = None
        extra_notes = [] if allocations is None else [
            {"kind": "memory-exact", "message": "memory=exact: tracemalloc was on; it slows"
             " allocation-heavy code several times, so time and energy are distorted"}]
        self.profile = self._build(exit_status, peak, extra_notes)
        if allocations is not None:
            self.profile.root.alloc_bytes = 0
            memory.apply_allocations(self.profile, allocations)
        self._collector.remove_checkpoint()
        return self.profile

    @property
    def running(self) -> bool:
        return _active is self

    # -- windows -----------------------------------------------------------------------
    def begin_window(self, name: str, index: int | None = None) -> None:
        if self._collector is not None:
            self._cuda_sync()
            self._collector.begin_window(name, index)

    def end_window(self, name: str | None = None) -> None:
        if self._collector is not None:
            self._cuda_sync()
            self._collector.end_window(name)

    def _cuda_sync(self) -> None:
        """With sync="cuda", wait for launched GPU work so a boundary holds all its energy."""
        if self.options.sync == "cuda":
            from .integrations.cuda import cuda_sync

            cuda_sync()

    @contextlib.contextmanager
    def window(self, name: str, index: int | None = None) -> Iterator[None]:
        self.begin_window(name, index)
        try:
            yield
        finally:
            self.end_window(name)

    # -- results -----------------------------------------------------------------------
    def _meta(self, exit_status: dict[str, Any] | None) -> dict[str, Any]:
        o = self.options
        return {
            "target": self.target or "<program>",
            "argv": list(self.argv),
            "command": " ".join(self.argv),
            "started_at": _dt.datetime.fromtimestamp(self._started_wall, _dt.timezone.utc).isoformat(),
            "sampler": o.sampler,
            "interval_s": o.interval,
            "sensor_interval_s": o.sensor_interval,
            "energyprof_version": __version__,
            "python": platform.python_version(),
            "host": {"cpu_model": probes.cpu_model(), "cores": probes.logical_cpus(),
                     "platform": platform.platform(terse=True), "memory_bytes": probes.total_memory_bytes()},
            "pid": os.getpid(),
            "sensor_notes": list(self._discovery_notes),
            "exit": exit_status or {"status": "completed"},
            "carbon_settings": o.carbon_settings(),
        }

    def _checkpoint_header(self) -> dict[str, Any]:
        return {"kind": "energyprof.checkpoint/1", "meta": self._meta({"status": "checkpoint"}),
                "idle": self.options.idle}

    def _build(self, exit_status: dict[str, Any] | None, peak: int | None = None,
               extra_notes: list[dict[str, Any]] | None = None) -> Profile:
        assert self._ledger is not None and self._collector is not None
        notes = list(self._collector.notes) + list(extra_notes or [])
        if self.options.sampler == "pyinstrument":
            notes.append({"kind": "sampler", "message": "the pyinstrument sampler sees the main thread only:"
                          " energy spent by other threads is charged to the main thread's stack"})
        children = sorted(self._collector.child_processes.values(), key=lambda c: c["pid"])
        return build_profile(self._ledger, self.options.idle, self._meta(exit_status), notes=notes,
                             peak_rss_exact_bytes=peak, child_processes=children)
