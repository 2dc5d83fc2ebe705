"""The job's processes: who descends from the program, their CPU, memory, state and exit
status, and how each is named in the tree.

Read from /proc on Linux (a read costs about a microsecond); from psutil where there is no
/proc (macOS), with the same answers but a zombie's exit status, which only /proc shows (the
supervisor has the program's own from wait4).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from ..collect.probes import PROC, read_proc
from ..engines import roles as engines

HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
SHORT_COMMAND = 40


class Stat:
    __slots__ = ("state", "ppid", "cpu_ns", "exit")

    def __init__(self, state: str, ppid: int, cpu_ns: int, exit: dict | None) -> None:
        self.state, self.ppid, self.cpu_ns, self.exit = state, ppid, cpu_ns, exit


def _psutil(pid: int) -> Any:
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def stat(pid: int) -> Stat | None:
    """State, parent, CPU (user + system) and, for a zombie, its exit status; None: gone."""
    if not PROC:
        return _psutil_stat(pid)
    try:
        raw = read_proc(f"/proc/{pid}/stat")
    except OSError:
        return None
    f = raw[raw.rfind(b")") + 2:].split()
    try:
        state = f[0].decode()
        cpu = (int(f[11]) + int(f[12])) * 1_000_000_000 // HZ
        ended = None
        if state in ("Z", "X") and len(f) > 49:
            ended = exit_status(int(f[49]))
        return Stat(state, int(f[1]), cpu, ended)
    except (IndexError, ValueError):
        return None


def _psutil_stat(pid: int) -> Stat | None:
    import psutil

    proc = _psutil(pid)
    if proc is None:
        return None
    try:
        with proc.oneshot():
            zombie = proc.status() == psutil.STATUS_ZOMBIE
            t = proc.cpu_times()
            return Stat("Z" if zombie else "R", proc.ppid(), int((t.user + t.system) * 1e9), None)
    except psutil.ZombieProcess:
        return Stat("Z", 0, 0, None)
    except psutil.Error:
        return None


def exit_status(status: int) -> dict:
    """A wait status as the profile says it: {status: exit, code} or {status: signal, signal}."""
    if os.WIFSIGNALED(status):
        return {"status": "signal", "signal": signal_name(os.WTERMSIG(status))}
    return {"status": "exit", "code": os.WEXITSTATUS(status)}


def signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def rss_bytes(pid: int) -> int:
    if not PROC:
        proc = _psutil(pid)
        try:
            return int(proc.memory_info().rss) if proc is not None else 0
        except Exception:  # noqa: BLE001 - psutil.Error: gone, or not ours to read
            return 0
    try:
        return int(read_proc(f"/proc/{pid}/statm").split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def command(pid: int) -> str:
    if not PROC:
        proc = _psutil(pid)
        try:
            return " ".join(proc.cmdline()) if proc is not None else ""
        except Exception:  # noqa: BLE001 - psutil.Error
            return ""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return " ".join(a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a)
    except OSError:
        return ""


def short_command(cmd: str) -> str:
    """`python w.py --epochs 3` from `/usr/bin/python3.11 w.py --epochs 3`, cut to fit a node."""
    parts = cmd.split()
    if not parts:
        return "?"
    head = os.path.basename(parts[0])
    if head.startswith("python"):
        head = "python"
    text = " ".join([head, *parts[1:]])
    return text if len(text) <= SHORT_COMMAND else text[: SHORT_COMMAND - 1] + "…"


def node_name(pid: int, cmd: str, label: str = "", rank: str | None = None) -> str:
    if label:
        return label
    if rank is not None:
        return f"[rank {rank}]"
    return engines.node_name(pid, cmd) or f"[process {pid}: {short_command(cmd)}]"


def environ_value(pid: int, name: str) -> str | None:
    """One variable of a live process's environment as it started (None: unset or unreadable)."""
    if not PROC:
        proc = _psutil(pid)
        try:
            return proc.environ().get(name) if proc is not None else None
        except Exception:  # noqa: BLE001 - psutil.Error
            return None
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    key = name.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(key):
            return item[len(key):].decode(errors="replace")
    return None
