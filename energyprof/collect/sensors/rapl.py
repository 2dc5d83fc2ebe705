"""Intel/AMD RAPL energy counters through Linux powercap (sysfs).

Domains are found by their `name` file, never by index. Top-level zones are packages (and
psys, the platform); sub-zones core/uncore sit inside their package and are never added to
it; dram is a sub-zone but a separate component. Duplicated package names (seen per die on
AMD) are read once.
"""

from __future__ import annotations

import os
import re

from .base import Discovery, Sensor, SensorError, WrapCounter, cpu_watch
from .presence import POWERCAP_ROOT as DEFAULT_ROOT, no_rapl, powercap_root  # noqa: F401 - also this module's

REUSE_NS = 500_000  # half the counter's update period (update_period_s)
ZONE_RE = re.compile(r"^intel-rapl:(\d+)(?::(\d+))?$")
PERMISSION_FIX = (
    "energy_uj is root-only since Linux 5.10; to let energyprof read it: "
    "sudo chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj /sys/class/powercap/intel-rapl:*:*/energy_uj "
    "(or a udev rule that does so at boot)"
)


class RaplSensor(Sensor):
    """One zone's counter. Its file stays open between reads (a read is one `fstat` and one `pread`,
    not open, read and close: a Monitor window reads every zone at both edges), but the descriptor
    is never trusted blindly: the program may close it, and the number then names another file.
    Before each read, `fstat` must show the same file (device and inode) still linked (a file
    replaced under its name, as a fake tree may be, has no links left); otherwise the name is opened
    again, and the old number, no longer ours, is left alone."""

    def __init__(self, source_id: str, component: str, zone: str, name: str, cpu_tdp: float | None = None) -> None:
        zone_name = os.path.basename(zone)
        super().__init__(id=source_id, component=component, method="measured", sensor="rapl",
                         detail={"zone": zone_name, "domain": name}, update_period_s=0.001)
        self.cpu_tdp = cpu_tdp  # the model's TDP, should the counter turn out to count nothing
        self._watch = cpu_watch(f"RAPL's {name} counter ({zone_name}/energy_uj)", 0.001)
        self.path = os.path.join(zone, "energy_uj")
        max_range = _read_number(os.path.join(zone, "max_energy_range_uj"))
        self.detail["max_energy_range_uj"] = max_range
        self._counter: WrapCounter | None = None
        self._max_range = max_range
        self._fd = -1
        self._file = (0, 0)  # (st_dev, st_ino) of the file self._fd was opened on
        self._at, self._joules = -REUSE_NS, 0.0  # the last reading: when (ns) and its running total

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        st = os.fstat(fd)
        self._fd, self._file = fd, (st.st_dev, st.st_ino)
        return fd

    def _raw(self) -> float:
        fd = self._fd
        try:
            if fd >= 0:  # one fstat, inline: this is a Monitor window's hot path
                try:
                    st = os.fstat(fd)
                    if st.st_ino != self._file[1] or st.st_dev != self._file[0] or not st.st_nlink:
                        fd = -1
                except OSError:
                    fd = -1
            if fd < 0:
                self._close_if_ours()  # replaced under its name: ours, closed; reused by the program: left
                fd = self._open()
            try:
                return float(os.pread(fd, 64, 0))
            except OSError:  # the zone went away and came back (a driver reload): its new file, once
                self._close_if_ours()
                return float(os.pread(self._open(), 64, 0))
        except (OSError, ValueError) as exc:
            self._close_if_ours()  # a sensor that fails is dropped: its file is not kept open for nobody
            raise SensorError(f"cannot read {self.path}: {exc}") from None

    def _close_if_ours(self) -> None:
        """Close the descriptor only while it still is ours: a number the program reused is its own."""
        fd = self._fd
        self._fd = -1
        if fd < 0:
            return
        try:
            st = os.fstat(fd)
        except OSError:
            return
        if (st.st_dev, st.st_ino) == self._file:
            os.close(fd)

    def start(self, t_ns: int) -> None:
        self._counter = WrapCounter(self._raw(), self._max_range)
        self._at, self._joules = t_ns, 0.0

    def read(self, t_ns: int) -> float:
        # The hardware adds to the counter about once a millisecond: a reading taken less than
        # half of that ago is what the file would say now, within one update. Windows back to back
        # (a Monitor's edges microseconds apart) share it instead of paying two system calls a zone.
        if 0 <= t_ns - self._at < REUSE_NS:
            return self._joules
        counter = self._counter
        if counter is None:
            self.start(t_ns)
            counter = self._counter
            assert counter is not None
        raw = self._raw()
        self._at, self._joules = t_ns, counter.update(raw) / 1e6
        if self._watch.saw(t_ns, raw) is not None:
            self.frozen = self._watch.why
        return self._joules

    def fallback(self) -> Sensor | None:
        from .estimate import model_for  # the model only where a counter counts nothing

        return model_for(self.component, self.cpu_tdp)

    def close(self) -> None:
        self._close_if_ours()


def read_counter(path: str) -> float:
    """One counter value. Non-blocking: a path that is not a sysfs file (a FIFO in a broken
    mount) gives an error instead of stalling the collector or start-up."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        return float(os.read(fd, 64))
    finally:
        os.close(fd)


def _read_text(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _read_number(path: str) -> float | None:
    try:
        return float(_read_text(path).strip())
    except (OSError, ValueError):
        return None


def discover(root: str | None = None, cpu_tdp: float | None = None) -> Discovery:
    absent = no_rapl(root)
    if absent is not None:
        return absent
    base = powercap_root(root)
    found = Discovery()
    zones = []
    for entry_name in sorted(os.listdir(base)):
        m = ZONE_RE.match(entry_name)
        if not m:
            continue
        entry = os.path.join(base, entry_name)
        try:
            name = _read_text(os.path.join(entry, "name")).strip()
        except OSError:
            continue
        zones.append((int(m.group(1)), m.group(2), entry, name))
    if not zones:
        found.notes.append(f"RAPL: no intel-rapl zones under {base}")
        return found
    packages = [z for z in zones if z[1] is None and z[3].startswith("package")]
    drams = [z for z in zones if z[3] == "dram"]
    psys = [z for z in zones if z[1] is None and z[3] == "psys"]
    chosen: list[tuple[str, str, str, str]] = []
    seen: set[str] = set()
    for pkg in packages:
        if pkg[3] in seen:
            continue
        seen.add(pkg[3])
        chosen.append(("cpu", "cpu", pkg[2], pkg[3]))
    for d in drams:
        key = f"dram@{d[0]}"
        if key in seen:
            continue
        seen.add(key)
        chosen.append(("dram", "dram", d[2], d[3]))
    if not packages and psys:
        chosen.append(("psys", "psys", psys[0][2], "psys"))
    elif psys:
        found.notes.append("RAPL: psys (whole platform) skipped: it contains the package and dram domains")
    # ids: "cpu"/"dram" for one package, "cpu:N"/"dram:N" for several
    counts: dict[str, int] = {}
    for base_id, *_ in chosen:
        counts[base_id] = counts.get(base_id, 0) + 1
    used: dict[str, int] = {}
    for base_id, component, zone, name in chosen:
        k = used.get(base_id, 0)
        used[base_id] = k + 1
        sid = base_id if counts[base_id] == 1 else f"{base_id}:{k}"
        energy = os.path.join(zone, "energy_uj")
        try:
            read_counter(energy)
        except PermissionError:
            found.notes.append(f"RAPL: cannot read {energy}: permission denied. {PERMISSION_FIX}")
            continue
        except (OSError, ValueError) as exc:
            found.notes.append(f"RAPL: cannot read {energy} ({type(exc).__name__}: {exc})")
            continue
        found.sensors.append(RaplSensor(sid, component, zone, name, cpu_tdp))
    return found
