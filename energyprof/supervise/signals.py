"""Signals between the user, the supervisor and the program.

The supervisor blocks SIGINT, SIGTERM, SIGHUP and SIGCHLD and takes them with
`sigtimedwait`, which says who sent each one. A signal the kernel sent to the whole
foreground process group (Ctrl-C, Ctrl-\\, a terminal hang-up) has already reached the
program, which shares the group; one sent to energyprof alone (`kill`, a scheduler) is
passed on. When the program has died by a signal, the supervisor writes the outputs, then
dies by the same signal, so the shell sees 128+N as it would without energyprof.
"""

from __future__ import annotations

import os
import resource
import signal
import sys

FORWARDED = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
WATCHED = {*FORWARDED, signal.SIGCHLD}
SI_KERNEL = 0x80  # si_code of a signal the kernel raised (the terminal's, to the group)
RESET_IN_CHILD = tuple(getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ", "SIGXFZ") if hasattr(signal, n))


def block() -> None:
    """Block the watched signals in this thread (and the threads it starts from now on)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)


def wait(timeout: float) -> signal.struct_siginfo | None:
    try:
        return signal.sigtimedwait(WATCHED, timeout)
    except InterruptedError:
        return None


def should_forward(info: signal.struct_siginfo) -> bool:
    return info.si_signo in FORWARDED and info.si_code != SI_KERNEL


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
