"""The job's processes as /proc shows them: who descends from the program, their CPU,
memory, state and exit status, and how each is named in the tree. Linux only; elsewhere
the run follows Python processes through their samplers alone."""

from __future__ import annotations

import os
import signal

HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
SHORT_COMMAND = 40


class Stat:
    __slots__ = ("state", "ppid", "cpu_ns", "exit")

    def __init__(self, state: str, ppid: int, cpu_ns: int, exit: dict | None) -> None:
        self.state, self.ppid, self.cpu_ns, self.exit = state, ppid, cpu_ns, exit


def stat(pid: int) -> Stat | None:
    """State, parent, CPU (user + system) and, for a zombie, its exit status; None: gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
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
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def command(pid: int) -> str:
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
    return f"[process {pid}: {short_command(cmd)}]"


def environ_value(pid: int, name: str) -> str | None:
    """One variable of a live process's environment as it started (None: unset or unreadable)."""
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
