"""Signals between the user, the supervisor and the program.

Every signal a shell would deliver to a foreground job is taken by the supervisor and passed
on to the program, which handles it as it would without energyprof (a SLURM
`--signal=USR1@60` checkpoint handler, a SIGALRM timeout, Ctrl-\\). A signal the terminal
sent to the whole foreground process group (Ctrl-C, Ctrl-\\, Ctrl-Z, a window resize) has
already reached the program, which shares the group, and is not sent twice. When the program
has died by a signal, the supervisor writes the outputs, then dies by the same signal, so the
shell sees 128+N as it would without energyprof.

Two inboxes behind one interface: on Linux the signals are blocked and taken with
`sigtimedwait`, whose `si_code` says whether the terminal sent them; where there is no
`sigtimedwait` (macOS) Python handlers and a wakeup pipe take them, and a signal the terminal
can send is taken to be the terminal's while energyprof's group is the terminal's foreground.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import sys

from ..collect.probes import portable

_FORWARD_NAMES = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGWINCH", "SIGCONT",
                  "SIGTSTP", "SIGXCPU", "SIGPWR", "SIGINFO")
FORWARDED = tuple(getattr(signal, n) for n in _FORWARD_NAMES if hasattr(signal, n))
WATCHED = {*FORWARDED, signal.SIGCHLD}
# What a terminal sends to its foreground group: the keys (INT, QUIT, TSTP, INFO) and a resize.
TERMINAL = {getattr(signal, n) for n in ("SIGINT", "SIGQUIT", "SIGTSTP", "SIGWINCH", "SIGINFO") if hasattr(signal, n)}
SI_KERNEL = 0x80  # si_code of a signal the kernel raised (the terminal's, to the group)
# Python ignores these at start-up; a program started by a shell has them at their default.
RESET_IN_CHILD = tuple(getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ", "SIGXFZ") if hasattr(signal, n))


class Signal:
    __slots__ = ("signo", "from_terminal")

    def __init__(self, signo: int, from_terminal: bool) -> None:
        self.signo, self.from_terminal = signo, from_terminal

    @property
    def forward(self) -> bool:
        """Pass it on: the program has not had it (the terminal's signals it has)."""
        return self.signo in FORWARDED and not self.from_terminal


class Inbox:
    """Where the supervisor's main thread takes the signals sent to energyprof."""

    def wait(self, timeout: float) -> list[Signal]:
        raise NotImplementedError

    def close(self) -> None:
        """Stop taking signals (the program has ended; the outputs are being written)."""

    def stop_self(self) -> None:
        """Stop as the program does on SIGTSTP, so a shell sees its job stopped; SIGCONT resumes.

        By SIGTSTP itself, at its default, raised in this thread: the kernel then treats
        energyprof as it treats the program (in an orphaned process group neither stops)."""
        signal.raise_signal(signal.SIGTSTP)


class TimedWaitInbox(Inbox):
    """Linux: the signals stay blocked in every thread and the main thread takes them with
    `sigtimedwait`, which says who sent each one."""

    def __init__(self) -> None:
        # Before any thread starts (sensor discovery may start some), so every thread has
        # them blocked and only the main thread takes them.
        signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)

    def wait(self, timeout: float) -> list[Signal]:
        try:
            info = signal.sigtimedwait(WATCHED, timeout)
        except InterruptedError:
            return []
        if info is None:
            return []
        return [Signal(info.si_signo, info.si_code == SI_KERNEL and info.si_signo in TERMINAL)]

    def stop_self(self) -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTSTP})
        try:
            super().stop_self()
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTSTP})


class HandlerInbox(Inbox):
    """No `sigtimedwait` (macOS): Python handlers note each signal and a wakeup pipe ends the wait."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        os.set_blocking(self._r, False)
        self._got: list[int] = []
        self._old = {s: signal.getsignal(s) for s in WATCHED}
        self._old_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        for s in WATCHED:
            signal.signal(s, self._note)

    def _note(self, signo: int, frame: object) -> None:
        self._got.append(signo)

    def wait(self, timeout: float) -> list[Signal]:
        if not self._got:
            try:
                select.select([self._r], [], [], timeout)
            except InterruptedError:
                pass
        try:
            while os.read(self._r, 512):
                pass
        except (BlockingIOError, OSError):
            pass
        got, self._got = self._got, []
        terminal = _terminal_is_ours()
        return [Signal(s, terminal and s in TERMINAL) for s in got]

    def stop_self(self) -> None:
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        try:
            super().stop_self()
        finally:
            signal.signal(signal.SIGTSTP, self._note)

    def close(self) -> None:
        signal.set_wakeup_fd(self._old_fd)
        for s, h in self._old.items():
            try:
                signal.signal(s, h if h is not None else signal.SIG_DFL)
            except (OSError, ValueError, TypeError):
                pass
        os.close(self._r)
        os.close(self._w)


def _terminal_is_ours() -> bool:
    """energyprof's group is its terminal's foreground group: the terminal's keys reach the program too."""
    for fd in (0, 1, 2):
        try:
            return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


def inbox() -> Inbox:
    if hasattr(signal, "sigtimedwait") and not portable():
        return TimedWaitInbox()
    return HandlerInbox()


def inherited_ignored() -> frozenset[int]:
    """The signals energyprof was started with ignored (`nohup`, `trap '' INT`): the program
    gets them ignored too, as `python script.py` would. Read before anything changes them."""
    out = set()
    for s in WATCHED:
        try:
            if signal.getsignal(s) == signal.SIG_IGN:
                out.add(s)
        except (OSError, ValueError):
            continue
    return frozenset(out)


def reset_sigchld() -> None:
    """SIGCHLD at its default for the supervisor, whatever it inherited: ignored, the kernel
    would reap the program itself and its exit status would be lost (exit 7 read as 0)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def child_dispositions(ignored: frozenset[int]) -> dict[int, object]:
    """What the program starts with: the inherited ignores, every other watched signal at its default."""
    return {s: (signal.SIG_IGN if s in ignored else signal.SIG_DFL) for s in (*WATCHED, *RESET_IN_CHILD)}


def die_by(signum: int) -> None:
    """End this process by `signum`, as the program ended (no core file of our own)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError):
        pass
    try:
        signal.signal(signum, signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # only if the signal did not end us (one that is ignored by default)
