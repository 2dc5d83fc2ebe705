"""What every driver of a run (the supervised run, the in-process Profiler) writes about it
alike: the profile's `meta`, a checkpoint's header, and the notes the options call for. Neither
driver imports the other; both import this."""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from typing import Any

from .._version import __version__
from ..collect import memory, probes
from ..core.ledger import Ledger
from ..setup.options import Options


# `platform` and `datetime` are not imported on a run's path (with the regular expressions platform's
# calls compile, 3 ms of every run's CPU): the three strings the meta takes from them are made here the
# way they make them, and tests/test_startup.py compares them with theirs.


def _platform() -> str:
    """`platform.platform(terse=True)`, but on Linux without the `uname -p` child process Python
    starts for it (subprocess's import and a fork and exec on every run: 5 ms): the processor field
    is what the string leaves out where it is the machine or "unknown", which is what Linux says."""
    if sys.platform.startswith("linux"):
        try:
            libc = os.confstr("CS_GNU_LIBC_VERSION").split(maxsplit=1)  # what platform.libc_ver() reads first
        except (AttributeError, ValueError, OSError, TypeError):
            libc = []
        if len(libc) == 2:
            u = os.uname()  # platform.uname()'s system, release and machine on Linux
            return _platform_name(u.sysname, u.release, u.machine, "with", libc[0] + libc[1])
    import platform

    join = getattr(platform, "_platform", None)  # the module's own formatting (its clean-up of odd characters)
    if sys.platform.startswith("linux") and join is not None:
        u = platform.uname()  # its processor field is worked out only when read
        lib, version = platform.libc_ver()
        return join(u.system, u.release, u.machine, "with", lib + version)
    return platform.platform(terse=True)


def _platform_name(*parts: str) -> str:
    """platform's own formatting of its fields into one string (platform._platform, Python 3.8-3.13)."""
    text = "-".join(x.strip() for x in parts if len(x))
    for odd in (" ", "/", "\\", ":", ";", '"', "(", ")"):
        text = text.replace(odd, "_" if odd == " " else "-")
    text = text.replace("unknown", "")
    while "--" in text:
        text = text.replace("--", "-")
    return text.rstrip("-")


def python_version() -> str:
    """platform.python_version(): sys.version's first word, with a patch level of 0 where it has none."""
    parts = sys.version.split(maxsplit=1)[0].split(".")
    return ".".join(parts + ["0"] if len(parts) == 2 else parts)


def iso_utc(ts: float) -> str:
    """datetime.fromtimestamp(ts, timezone.utc).isoformat(): microseconds rounded half to even, left
    out when zero."""
    frac, whole = math.modf(ts)
    us = round(frac * 1e6)
    if us >= 1_000_000:
        whole, us = whole + 1, us - 1_000_000
    elif us < 0:
        whole, us = whole - 1, us + 1_000_000
    t = time.gmtime(whole)
    text = "%04d-%02d-%02dT%02d:%02d:%02d" % (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, min(t.tm_sec, 59))
    return text + (".%06d" % us if us else "") + "+00:00"


def run_meta(options: Options, target: str, argv: list[str], started_wall: float, pid: int | None,
             sensor_notes: list[str], exit_status: dict[str, Any]) -> dict[str, Any]:
    """The profile's `meta`, for an in-process profile and a supervised run alike."""
    return {
        "target": target,
        "argv": list(argv),
        "command": " ".join(argv),
        "started_at": iso_utc(started_wall),
        "sampler": options.sampler,
        "interval_s": options.interval,
        "sensor_interval_s": options.sensor_interval,
        "energyprof_version": __version__,
        "python": python_version(),
        "host": {"cpu_model": probes.cpu_model(), "cores": probes.logical_cpus(),
                 "platform": _platform(), "memory_bytes": probes.total_memory_bytes(), "boot_id": probes.boot_id()},
        "pid": pid,
        "sensor_notes": list(sensor_notes),
        "exit": exit_status,
        "carbon_settings": options.carbon_settings(),
        "settings": machine_settings(options.powercap_root, options.gpus),
    }


@functools.lru_cache(maxsize=4)
def machine_settings(powercap_root: str | None, gpus: bool) -> dict[str, Any]:
    """The machine's settings (collect/settings.py), read once per process: a checkpoint every 30 s
    rewrites the meta, and asking NVML or nvpmodel again each time would cost the run for nothing."""
    from ..collect import settings

    try:
        return settings.read(powercap_root=powercap_root, gpus=gpus)
    except Exception as exc:  # noqa: BLE001 - the run's facts matter more than its settings
        return {"error": f"{type(exc).__name__}: {exc}"}


def checkpoint_header(meta: dict[str, Any], options: Options, notes: list[dict[str, Any]],
                      ledger: Ledger) -> dict[str, Any]:
    """A checkpoint's state but the ledger (the collector adds it): the run so far, its notes
    and its memory summary."""
    return {"kind": "energyprof.checkpoint/1", "meta": meta, "idle": options.idle, "notes": list(notes),
            "memory": memory.summary_of(ledger)}


def run_notes(options: Options, notes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`notes` and what the options themselves call for the reader to know."""
    out = list(notes)
    if options.sampler == "pyinstrument":
        out.append({"kind": "sampler", "message": "the pyinstrument sampler sees the main thread only:"
                    " energy spent by other threads is charged to the main thread's stack"})
    if options.memory == "exact" and not any(n.get("kind") == "memory-exact" for n in notes):
        out.append({"kind": "memory-exact", "message": "memory=exact: tracemalloc was on; it slows"
                    " allocation-heavy code several times, so time and energy are distorted"})
    return out
