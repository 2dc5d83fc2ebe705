"""NVIDIA Jetson power through jtop's Python API (jetson-stats), when it is importable.

jtop reads the same rails as tegrastats through its own service (`jtop.service` must run).
`jetson.power` holds `rail` {name: {power (mW), avg, ...}} and `tot` (the input rail, named
in `tot['name']`, or the sum of the rails on boards without one). `power` is instantaneous;
jtop's `avg` is (power + old avg) / 2, not a time average, and is never used.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ....agent import own_threads
from ..base import Discovery, split_total
from ..presence import TOOL_STEPS, jtop_absent
from . import rails
from .stream import SharedStream, channel_sensors

BINDING: Any = None  # a module with a `jtop` class (tests inject a fake); None: `import jtop`
INTERVAL_S = 0.5  # jtop refreshes from its service; faster asks add load, not resolution
ENABLE = TOOL_STEPS["jtop"]


def watts(power: dict[str, Any]) -> dict[str, float]:
    """{source: watts} from `jetson.power`: rails that never overlap, `other` when tot is an input rail."""
    rails_w = {name: float(r["power"]) / 1000.0 for name, r in (power.get("rail") or {}).items()
               if isinstance(r, dict) and isinstance(r.get("power"), (int, float)) and r.get("online", True)
               and name not in rails.SKIPPED}
    tot = power.get("tot") or {}
    named = tot.get("name") if isinstance(tot, dict) else None
    if named in rails.INPUT_RAILS and isinstance(tot.get("power"), (int, float)):
        return split_total((named, float(tot["power"]) / 1000.0), rails_w)
    return rails_w


class JtopStream(SharedStream):
    """jtop's client, polled on a thread of its own."""

    def __init__(self, module: Any, interval_s: float) -> None:
        super().__init__("jtop")
        self._stop = threading.Event()
        self.client = module.jtop(interval=interval_s)
        self.client.start()
        own_threads.start(self._poll)

    def _poll(self) -> None:
        try:
            while not self._stop.is_set() and self.client.ok():
                self.integrator.add_instant(time.perf_counter_ns(), watts(self.client.power))
        except Exception as exc:  # noqa: BLE001 - the service went away
            self.failed = f"jtop: {type(exc).__name__}: {exc}"
        finally:
            if not self._stop.is_set() and self.failed is None:
                self.failed = "jtop: the jtop service stopped answering"
            self.integrator.end()
            self.integrator.first.set()

    def close(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            try:
                self.client.close()
            except Exception:  # noqa: BLE001
                pass


def discover(explicit: bool = False, interval_s: float = INTERVAL_S) -> Discovery:
    found = Discovery()
    module = BINDING
    if module is None:
        try:
            import jtop as module  # jetson-stats
        except ImportError:
            return jtop_absent(explicit)
    try:
        stream = JtopStream(module, interval_s)
    except Exception as exc:  # noqa: BLE001 - jtop.JtopException: the service is not running
        found.missing["jtop"] = f"{exc}; {ENABLE}"
        found.notes.append(f"jtop: cannot connect ({exc}); {ENABLE}")
        return found
    why = stream.wait_first()
    if why is not None:
        stream.close()
        found.missing["jtop"] = why
        found.notes.append(why)
        return found
    return channel_sensors(stream, "jtop", interval_s, found,
                           {"reading": "jtop's instantaneous rail power, integrated by trapezoids (its avg is never used)",
                            "interval_s": interval_s}, rails.component)
