"""RAPL through the kernel's `power` perf events, for users who may not read powercap's energy_uj.

Since 2020 most distributions make powercap's `energy_uj` readable by root only; the same
counters are perf events (`power/energy-pkg/`, `power/energy-ram/`, `power/energy-psys/`),
opened here with the perf_event_open system call (through ctypes: no dependency). The event's
code is in `<pmu>/events/energy-X` (`event=0x02`), its scale to joules in `energy-X.scale`, the
PMU's type number in `<pmu>/type` and one CPU per package in `<pmu>/cpumask`. The events are
system-wide, so they need `kernel.perf_event_paranoid` <= 0, CAP_PERFMON or root. The kernel
keeps a 64-bit count (it handles the hardware counter's wraps), so a reading is one `read()`.

The sysfs root is configurable (`ENERGYPROF_PERF_ROOT`), which is how tests give it a fake tree.
"""

from __future__ import annotations

import errno
import functools
import os
import re

from .base import Discovery, Sensor, SensorError, cpu_watch
from .presence import PERF_ROOT as DEFAULT_ROOT, no_perf, perf_root  # noqa: F401 - also this module's

PARANOID = "/proc/sys/kernel/perf_event_paranoid"
SYSCALL = {"x86_64": 298, "i386": 336, "i686": 336, "aarch64": 241, "arm64": 241, "riscv64": 241}
#: event -> (source id, component). cores/gpu sit inside the package: never added to it.
EVENTS = {"energy-pkg": ("cpu", "cpu"), "energy-ram": ("dram", "dram"), "energy-psys": ("psys", "psys")}
ENABLE = ("allow system-wide perf events once: sudo sysctl kernel.perf_event_paranoid=0 (to keep it: "
          "echo 'kernel.perf_event_paranoid = 0' | sudo tee /etc/sysctl.d/60-energyprof.conf), or give the "
          "python binary CAP_PERFMON: sudo setcap cap_perfmon+ep $(readlink -f $(which python3))")


@functools.cache
def perf_event_attr() -> type:
    """struct perf_event_attr up to config1 (PERF_ATTR_SIZE_VER0, 64 bytes: every kernel takes it).
    Made on first use: ctypes is imported only where a power PMU is there to open."""
    import ctypes

    class PerfEventAttr(ctypes.Structure):
        _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                    ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                    ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                    ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64)]

    return PerfEventAttr


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def parse_event(text: str) -> int:
    """The config of an event file such as `event=0x02` (umask, if any, in bits 8-15)."""
    fields = dict(part.split("=", 1) for part in text.strip().split(",") if "=" in part)
    if "event" not in fields:
        raise ValueError(f"no event= in {text.strip()!r}")
    return int(fields["event"], 0) | (int(fields.get("umask", "0"), 0) << 8)


def parse_cpumask(text: str) -> list[int]:
    """`0`, `0,18`, `0-1` -> the CPUs to open the event on (one per package)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-")
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus


def events(root: str | os.PathLike[str]) -> list[tuple[str, int, float, str]]:
    """(event name, config, scale to joules, unit) for each energy event the PMU lists."""
    out = []
    folder = os.path.join(root, "events")
    for name in sorted(os.listdir(folder)):
        if not re.fullmatch(r"energy-[a-z0-9]+", name):
            continue
        config = parse_event(_read(os.path.join(folder, name)))
        scale = float(_read(os.path.join(folder, f"{name}.scale")).strip())
        unit_file = os.path.join(folder, f"{name}.unit")
        unit = _read(unit_file).strip() if os.path.exists(unit_file) else "Joules"
        out.append((name, config, scale, unit))
    return out


def open_event(pmu_type: int, config: int, cpu: int) -> int:
    """A file descriptor counting the event on `cpu` for every process (pid -1)."""
    import ctypes

    machine = os.uname().machine  # what platform.machine() returns on Linux
    nr = SYSCALL.get(machine)
    if nr is None:
        raise OSError(errno.ENOSYS, f"perf_event_open: unknown system call number on {machine}")
    attr_type = perf_event_attr()
    attr = attr_type(type=pmu_type, size=ctypes.sizeof(attr_type), config=config)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(ctypes.c_long(nr), ctypes.byref(attr), ctypes.c_int(-1), ctypes.c_int(cpu),
                      ctypes.c_int(-1), ctypes.c_ulong(0))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)


def read_count(fd: int) -> int:
    return int.from_bytes(os.read(fd, 8), "little", signed=False)


class PerfSensor(Sensor):
    def __init__(self, source_id: str, component: str, event: str, fd: int, scale: float, cpu: int,
                 cpu_tdp: float | None = None) -> None:
        super().__init__(id=source_id, component=component, method="measured", sensor="perf",
                         detail={"event": f"power/{event}/", "cpu": cpu, "scale_j": scale,
                                 "reading": "perf_event_open count x scale"},
                         update_period_s=0.001, tier="counter")
        self.fd, self.scale = fd, scale
        self._zero = 0
        self.cpu_tdp = cpu_tdp  # the model's TDP, should the counter turn out to count nothing
        # A VM's perf may offer power/energy-psys/ and count nothing on it, all run.
        self._watch = cpu_watch(f"the perf event power/{event}/", 0.001)

    def start(self, t_ns: int) -> None:
        self._zero = self._count()

    def _count(self) -> int:
        try:
            return read_count(self.fd)
        except OSError as exc:
            raise SensorError(f"perf event {self.detail['event']}: {exc}") from None

    def read(self, t_ns: int) -> float:
        count = self._count()
        if self._watch.saw(t_ns, count) is not None:
            self.frozen = self._watch.why
        return (count - self._zero) * self.scale

    def fallback(self) -> Sensor | None:
        from .estimate import model_for  # the model only where a counter counts nothing

        return model_for(self.component, self.cpu_tdp)

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def paranoid_level(path: str = PARANOID) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def discover(root: str | None = None, paranoid_path: str = PARANOID, explicit: bool = False,
             cpu_tdp: float | None = None) -> Discovery:
    absent = no_perf(root, explicit)
    if absent is not None:
        return absent
    base = perf_root(root)
    found = Discovery()
    try:
        pmu_type = int(_read(os.path.join(base, "type")).strip())
        cpumask = os.path.join(base, "cpumask")
        cpus = parse_cpumask(_read(cpumask)) if os.path.exists(cpumask) else [0]
        listed = events(base)
    except (OSError, ValueError) as exc:
        found.notes.append(f"perf: cannot read the power PMU's description under {base} ({exc})")
        return found
    level = paranoid_level(paranoid_path)
    names = {e[0] for e in listed}
    for name, config, scale, unit in listed:
        if name not in EVENTS or (name == "energy-psys" and "energy-pkg" in names):
            continue  # psys (the platform) holds the package and dram: read it only without them
        if unit.lower() not in ("joules", "j"):
            found.notes.append(f"perf: power/{name}/ counts in {unit!r}, not joules; skipped")
            continue
        base_id, comp = EVENTS[name]
        for k, cpu in enumerate(cpus):
            try:
                fd = open_event(pmu_type, config, cpu)
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EPERM):
                    why = f"perf_event_paranoid is {level}" if level is not None else "permission denied"
                    found.missing["perf"] = f"{why}: {ENABLE}"
                    found.notes.append(f"perf: cannot open power/{name}/ ({why}). {ENABLE}")
                    _close_all(found)
                    return found
                found.notes.append(f"perf: cannot open power/{name}/ on CPU {cpu} ({exc.strerror or exc})")
                continue
            sid = base_id if len(cpus) == 1 else f"{base_id}:{k}"
            found.sensors.append(PerfSensor(sid, comp, name, fd, scale, cpu, cpu_tdp))
    if found.sensors:
        found.notes.append("perf: RAPL read through perf events (" + ", ".join(s.id for s in found.sensors) + ")")
    return found


def _close_all(found: Discovery) -> None:
    for s in found.sensors:
        s.close()
    found.sensors = []
