"""The collector thread: reads every sensor and clock on one tick and feeds the Ledger.

It owns the Ledger: samplers hand their samples over through a deque (append is atomic
and never blocks the program), and only this thread folds them in. A sensor that raises,
stalls past its timeout or returns garbage is dropped with a note; the run goes on.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import deque
from typing import Any, Callable

from . import probes
from .probes import OwnClocks
from .core.ledger import Ledger
from .profile import write_atomic
from .recording import Sample, Tick
from .sensors.base import Sensor

CHILD_POLL_S = 0.5


class Collector:
    def __init__(self, sensors: list[Sensor], ledger: Ledger, interval_s: float, own: OwnClocks,
                 children: bool = True, sensor_timeout_s: float = 2.0,
                 checkpoint: Callable[[], dict[str, Any]] | None = None, checkpoint_path: str | None = None,
                 checkpoint_interval_s: float = 30.0, rss: bool = True, rss_children: bool = False) -> None:
        self.sensors = sensors
        self.alive = [True] * len(sensors)
        self.ledger = ledger
        self.interval_s = interval_s
        self.own = own
        self.children = children
        self.sensor_timeout_ns = int(sensor_timeout_s * 1e9)
        self.queue: deque[Any] = deque()
        self.notes: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._checkpoint_state = checkpoint
        self.checkpoint_path = checkpoint_path
        self.checkpoint_interval_ns = int(checkpoint_interval_s * 1e9)
        self.rss = rss
        self.rss_children = rss_children
        self._children_rss = 0
        self._live_children_ns = 0
        self._children_polled = 0
        self._children_floor = 0
        self.child_processes: dict[int, dict[str, Any]] = {}
        self.t0_ns = 0
        self._last_checkpoint = 0
        self.ticks = 0
        # Watchdog state: a read that never returns (a wedged driver) must not stop the run.
        # The stuck thread is abandoned (it exits when its read returns, touching nothing)
        # and a new collector thread carries on without that sensor.
        self._generation = 0
        self._reading: tuple[int, int] | None = None  # (sensor index, read start ns)
        self._watchdog: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self.t0_ns = time.perf_counter_ns()
        for i, s in enumerate(self.sensors):
            try:
                s.start(self.t0_ns)
            except Exception as exc:  # noqa: BLE001 - any failure just drops this sensor
                self._drop(i, f"failed to start: {exc}", self.t0_ns)
        self._last_checkpoint = self.t0_ns
        self.tick(self.t0_ns)
        self._spawn()
        self._watchdog = threading.Thread(target=self._watch, name="energyprof-watchdog", daemon=True)
        self._watchdog.start()

    def _spawn(self) -> None:
        self._thread = threading.Thread(target=self._run, args=(self._generation,), name="energyprof-collector",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.sensor_timeout_ns / 1e9 + 1.0)
            if self._thread.is_alive():
                self._abandon_stuck_reader()
        self.tick()
        self.ledger.finish()
        for s in self.sensors:
            try:
                s.close()
            except Exception:  # noqa: BLE001
                pass

    def emit(self, sample: Sample) -> None:
        self.queue.append(sample)

    def begin_window(self, name: str, index: int | None) -> None:
        self.queue.append(("begin", time.perf_counter_ns(), name, index))

    def end_window(self, name: str | None) -> None:
        self.queue.append(("end", time.perf_counter_ns(), name, None))

    def _run(self, generation: int) -> None:
        self.own.register_current()
        while not self._stop.wait(self.interval_s):
            if generation != self._generation:
                return
            self.tick(generation=generation)
            if self.checkpoint_path and time.perf_counter_ns() - self._last_checkpoint >= self.checkpoint_interval_ns:
                self.write_checkpoint()

    def _watch(self) -> None:
        self.own.register_current()
        period = max(0.05, self.sensor_timeout_ns / 2e9)
        while not self._stop.wait(period):
            reading = self._reading
            if reading is not None and time.perf_counter_ns() - reading[1] > self.sensor_timeout_ns:
                self._abandon_stuck_reader()
                if not self._stop.is_set():
                    self._spawn()

    def _abandon_stuck_reader(self) -> None:
        reading = self._reading
        self._generation += 1
        self._reading = None
        if reading is not None and self.alive[reading[0]]:
            self._drop(reading[0], f"a read did not return within {self.sensor_timeout_ns / 1e9:g} s (hung)",
                       reading[1])

    # -- one tick ----------------------------------------------------------------------
    def tick(self, t_ns: int | None = None, generation: int | None = None) -> None:
        t = t_ns if t_ns is not None else time.perf_counter_ns()
        energy: list[float | None] = []
        for i, s in enumerate(self.sensors):
            if not self.alive[i]:
                energy.append(None)
                continue
            t_read = time.perf_counter_ns()
            self._reading = (i, t_read)
            try:
                v = s.read(t)
                v = float(v)
            except Exception as exc:  # noqa: BLE001
                self._reading = None
                if generation is not None and generation != self._generation:
                    return
                self._drop(i, f"{type(exc).__name__}: {exc}", t)
                energy.append(None)
                continue
            self._reading = None
            if generation is not None and generation != self._generation:
                return  # abandoned while this read hung: the new collector owns the ledger now
            took = time.perf_counter_ns() - t_read
            if not math.isfinite(v):
                self._drop(i, f"returned a non-finite reading ({v})", t)
                energy.append(None)
            elif took > self.sensor_timeout_ns:
                self._drop(i, f"a read took {took / 1e9:.1f} s (timeout {self.sensor_timeout_ns / 1e9:g} s)", t)
                energy.append(None)
            else:
                energy.append(v)
        tick = Tick(
            t_ns=t,
            energy_j=tuple(energy),
            process_cpu_ns=time.process_time_ns(),
            own_cpu_ns=self.own.read_ns(),
            busy_cpu_ns=probes.machine_busy_ns(),
            rss_bytes=(probes.rss_bytes() + self._children_rss) if self.rss else 0,
            children_cpu_ns=self._children_cpu_ns(t) if (self.children or self.rss_children) else 0,
            gpu_share=self._gpu_shares(),
        )
        self._drain()
        self.ledger.add_tick(tick)
        self.ticks += 1

    def _gpu_shares(self) -> dict[str, float] | None:
        """This process's share of each shared device, from sensors that can tell."""
        shares = {s.id: s.process_share() for i, s in enumerate(self.sensors)
                  if self.alive[i] and hasattr(s, "process_share")}
        return shares or None

    def _drain(self) -> None:
        q = self.queue
        led = self.ledger
        while q:
            ev = q.popleft()
            if type(ev) is Sample:
                led.add_sample(ev)
            elif ev[0] == "begin":
                led.begin_window(ev[1], ev[2], ev[3])
            else:
                led.end_window(ev[1], ev[2])

    def _drop(self, i: int, why: str, t_ns: int) -> None:
        self.alive[i] = False
        s = self.sensors[i]
        at = max(0, t_ns - self.t0_ns) / 1e9
        self.notes.append({"kind": "sensor-dropped", "source": s.id, "at_s": round(at, 3),
                           "message": f"sensor {s.id} ({s.sensor}) dropped at {at:.2f} s: {why}"})

    def _children_cpu_ns(self, t: int) -> int:
        """Reaped children (exact) plus live ones (psutil, polled every CHILD_POLL_S)."""
        reaped = probes.reaped_children_cpu_ns()
        if t - self._children_polled >= CHILD_POLL_S * 1e9:
            self._children_polled = t
            self._live_children_ns = self._poll_live_children()
        # A child that ends moves from 'live' to 'reaped'; never let the total step back.
        total = max(self._children_floor, reaped + self._live_children_ns)
        self._children_floor = total
        return total

    def _poll_live_children(self) -> int:
        try:
            import psutil

            pids = probes.descendant_pids()
            if pids is None:
                kids = psutil.Process().children(recursive=True)
            else:
                kids = [psutil.Process(pid) for pid in pids if pid]
        except Exception:  # noqa: BLE001 - a child that ended between the listing and now
            return 0
        total = 0
        rss = 0
        for k in kids:
            try:
                with k.oneshot():
                    if self.rss_children:
                        rss += k.memory_info().rss
                    ct = k.cpu_times()
                    cpu_ns = int((ct.user + ct.system) * 1e9)
                    info = self.child_processes.get(k.pid)
                    if info is None:
                        try:
                            cmd = " ".join(k.cmdline())[:200]
                        except Exception:  # noqa: BLE001
                            cmd = k.name()
                        info = self.child_processes[k.pid] = {"pid": k.pid, "command": cmd, "cpu_time_s": 0.0}
                    info["cpu_time_s"] = max(info["cpu_time_s"], cpu_ns / 1e9)
                    total += cpu_ns
            except Exception:  # noqa: BLE001 - it ended while we looked
                continue
        self._children_rss = rss
        return total if self.children else 0

    # -- checkpoints -------------------------------------------------------------------
    def write_checkpoint(self) -> None:
        self._last_checkpoint = time.perf_counter_ns()
        if not self.checkpoint_path or self._checkpoint_state is None:
            return
        try:
            state = self._checkpoint_state()
            state["ledger"] = self.ledger.to_state()
            state["notes"] = list(self.notes)
            write_atomic(self.checkpoint_path, json.dumps(state, separators=(",", ":")))
        except Exception as exc:  # noqa: BLE001 - a failed checkpoint must not stop the run
            self.notes.append({"kind": "checkpoint-failed", "message": f"checkpoint failed: {exc}"})

    def remove_checkpoint(self) -> None:
        if self.checkpoint_path:
            try:
                os.unlink(self.checkpoint_path)
            except OSError:
                pass
