"""Cheap clocks the collector reads every tick: machine busy CPU, process CPU, RSS.

Linux paths first (/proc reads cost about a microsecond), psutil elsewhere (macOS has no
/proc). `ENERGYPROF_PORTABLE=1` takes the psutil paths on Linux too: that is how the tests run
the macOS paths on a Linux machine.
"""

from __future__ import annotations

import os
import threading
import time

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def portable() -> bool:
    """Take the paths of a system without /proc or `sigtimedwait` (macOS), wherever this runs."""
    return os.environ.get("ENERGYPROF_PORTABLE", "") not in ("", "0")


_HAVE_PROC = os.path.exists("/proc/stat") and os.path.exists("/proc/self/statm") and not portable()
PROC = _HAVE_PROC  # /proc is read (Linux) rather than psutil


def read_proc(path: str, size: int = 4096) -> bytes:
    """A small /proc file, whole, in three system calls. Python's `open()` makes eight (its
    buffer's fstat, isatty and seeks), and the collector reads a few of these every tick."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, size)
        while len(data) >= size:  # /proc hands a file over in one read when the buffer holds it
            more = os.read(fd, size)
            if not more:
                break
            data += more
        return data
    finally:
        os.close(fd)


_busy_cache = [0, 0]  # [perf_counter_ns of the last read, value]
_BUSY_MAX_AGE_NS = 1_000_000


def machine_busy_ns() -> int:
    """Busy CPU time of the whole machine, all cores (user+nice+system+irq+softirq+steal).

    /proc/stat moves in 10 ms ticks, so a read less than 1 ms old is reused: the model
    sensor and the collector both want it on the same tick.
    """
    now = time.perf_counter_ns()
    if now - _busy_cache[0] < _BUSY_MAX_AGE_NS:
        return _busy_cache[1]
    value = _read_busy_ns()
    _busy_cache[0], _busy_cache[1] = now, value
    return value


class _ProcFile:
    """A /proc file kept open and re-read with one pread: a tick costs one syscall (and one
    GIL hand-off in a program that holds the GIL), not the three of open/read/close.

    In-process (a Monitor, the decorator) the descriptor lives inside the program, which may
    close it (os.closerange) and get the same number for a file of its own: before each read an
    fstat must show the same file (device and inode), or the path is opened again and the number,
    no longer ours, is left alone. After a fork the child opens its own (/proc/self is another
    process there) and closes the copy it inherited."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        self.pid = 0
        self.ident = (0, 0)  # (st_dev, st_ino) of the file self.fd was opened on

    def _still_ours(self) -> bool:
        try:
            st = os.fstat(self.fd)  # type: ignore[arg-type]
        except OSError:
            return False
        return st.st_ino == self.ident[1] and st.st_dev == self.ident[0]

    def read(self, size: int = 1024) -> bytes:
        fd = self.fd
        if fd is not None:
            ours = self._still_ours()
            if ours and self.pid == os.getpid():
                return os.pread(fd, size, 0)
            if ours:  # inherited across a fork: our copy, closed
                os.close(fd)
        fd = os.open(self.path, os.O_RDONLY)
        st = os.fstat(fd)
        self.fd, self.pid, self.ident = fd, os.getpid(), (st.st_dev, st.st_ino)
        return os.pread(fd, size, 0)


_STAT = _ProcFile("/proc/stat")
_STATM = _ProcFile("/proc/self/statm")


def _read_busy_ns() -> int:
    if _HAVE_PROC:
        f = _STAT.read(512).split(b"\n", 1)[0].split()
        busy = int(f[1]) + int(f[2]) + int(f[3]) + int(f[6]) + int(f[7]) + (int(f[8]) if len(f) > 8 else 0)
        return busy * 1_000_000_000 // _HZ
    import psutil

    t = psutil.cpu_times()
    return int((t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0)
                + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)) * 1e9)


def logical_cpus() -> int:
    return os.cpu_count() or 1


def boot_id() -> str | None:
    """This machine's kernel boot id: what `energyprof merge` knows a machine by. Host names repeat
    (containers, `localhost`) and an engine's node ids are its own (Ray runs two nodes on one
    machine); every container and node on one running kernel shares its boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as fh:  # bytes: an "ascii" text file imports its codec
            return fh.read().decode("ascii").strip() or None
    except OSError:
        return None


def rss_bytes() -> int:
    if _HAVE_PROC:
        return int(_STATM.read(256).split()[1]) * _PAGE
    import psutil

    return int(psutil.Process().memory_info().rss)


def descendant_pids(root: int | None = None) -> list[int]:
    """The live descendants of `root` (default: this process) from
    /proc/PID/task/TID/children (Linux >= 3.5), else from psutil.

    Reads only that family's files, where psutil's children() scans every process on the
    machine.
    """
    me = os.getpid()
    if not _HAVE_PROC or not os.path.exists(f"/proc/{me}/task/{me}/children"):
        import psutil

        try:
            return [c.pid for c in psutil.Process(root).children(recursive=True)]
        except psutil.Error:
            return []
    found: list[int] = []
    todo = [me if root is None else root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                kids = [int(x) for x in read_proc(f"/proc/{pid}/task/{tid}/children").split()]
            except (OSError, ValueError):
                continue
            found.extend(kids)
            todo.extend(kids)
    return found


try:
    import resource

    _rusage, _CHILDREN = resource.getrusage, resource.RUSAGE_CHILDREN

    def reaped_children_cpu_ns() -> int:
        """CPU time of child processes that have ended and been waited for: to the microsecond
        (os.times() counts 10 ms ticks), in one call (a Monitor window makes one at each edge)."""
        r = _rusage(_CHILDREN)
        return int((r.ru_utime + r.ru_stime) * 1e9)
except ImportError:  # no resource module (Windows)
    def reaped_children_cpu_ns() -> int:
        """CPU time of child processes that have ended and been waited for."""
        t = os.times()
        return int((t.children_user + t.children_system) * 1e9)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown"


def total_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        import psutil

        return int(psutil.virtual_memory().total)


class OwnClocks:
    """CPU time of energyprof's own threads, kept out of the program's figure."""

    def __init__(self) -> None:
        self._clocks: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._ended = 0
        self.idents: set[int] = set()

    def register_current(self) -> None:
        ident = threading.get_ident()
        self.idents.add(ident)
        try:
            self._clocks[ident] = time.pthread_getcpuclockid(ident)
        except (AttributeError, OSError):
            pass

    def read_ns(self) -> int:
        total = self._ended
        for ident, clk in list(self._clocks.items()):
            try:
                v = time.clock_gettime_ns(clk)
            except OSError:
                self._ended += self._last.get(ident, 0)
                total += self._last.get(ident, 0)
                del self._clocks[ident]
                continue
            self._last[ident] = v
            total += v
        return total


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) by writing 5 to /proc/self/clear_refs (Linux
    >= 4.0), so the peak *during* a profiled call can be read exactly instead of sampled.

    Process-wide: anything else reading VmHWM sees the new mark (getrusage's ru_maxrss is kept
    separately and is unaffected); `peak_reset=False` turns it off. False where not allowed.
    """
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def read_peak() -> int | None:
    """VmHWM in bytes, or None off Linux."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None
