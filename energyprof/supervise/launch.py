"""Starting the program so that it never outlives energyprof.

`posix_spawn` runs nothing between fork and exec, and `preexec_fn` is unsafe once threads run
(the collector's). So the supervisor forks twice while it still has one thread:

- a **launcher**, which becomes the program: it asks the kernel for SIGTERM when the
  supervisor dies (PR_SET_PDEATHSIG, Linux), waits for the go, restores the signal state the
  program is owed and execs it. The program stays the supervisor's own child: wait4 gives its
  exact status and rusage.
- a **watcher**, holding one end of a socket whose other end only the supervisor holds. The
  supervisor tells it the job's processes as they appear and, when it ends normally, that it
  did. If the socket ends without that (SIGKILL, the OOM killer), the watcher ends the job's
  processes (SIGTERM, then SIGKILL after a grace) and says where the checkpoint is. This is the
  only guard where there is no PR_SET_PDEATHSIG (macOS), and it reaches the program's children,
  which PR_SET_PDEATHSIG does not.
"""

from __future__ import annotations

import errno
import os
import resource
import select
import signal
import sys
import time
from typing import Any, Callable

from ..collect.probes import PROC, descendant_pids, portable
from .signals import FORWARDED

PR_SET_PDEATHSIG = 1
GRACE_S = 2.0  # between the watcher's SIGTERM and its SIGKILL
SPREAD_S = 0.05  # a sender that signals the job's processes one by one has reached them all by then
HELD = frozenset(FORWARDED)  # held pending in the watcher (SIGCONT too: `fg` and `bg` signal the whole job)
# fork's and pipe's errors when a limit leaves no room (RLIMIT_NPROC or a pids cgroup; RLIMIT_NOFILE)
NO_ROOM = {errno.EAGAIN: "the process limit (ulimit -u, or the pids cgroup's pids.max) leaves no room for energyprof's"
                         " own process and threads beside the program",
           errno.ENOMEM: "the memory or process limit leaves no room for energyprof's own process beside the program",
           errno.EMFILE: "the open-file limit (ulimit -n %d) leaves energyprof no room for the few descriptors it"
                         " needs beside the program's",
           errno.ENFILE: "the system's open-file table is full"}


class NoRoom(Exception):
    """A limit leaves energyprof no room to start the program (one line for the user)."""


def no_room(exc: BaseException) -> NoRoom | None:
    """The one line for a fork, pipe or thread start that a limit refused; None: another error."""
    if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
        return NoRoom(NO_ROOM[errno.EAGAIN])
    if isinstance(exc, OSError) and exc.errno in NO_ROOM:
        text = NO_ROOM[exc.errno]
        if exc.errno == errno.EMFILE:
            text %= resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return NoRoom(text)
    return None


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up before the fork (the launcher must not import or load anything)."""
    if not sys.platform.startswith("linux") or portable():
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def _socketpair() -> tuple[int, int]:
    """A connected pair of Unix stream sockets, as descriptors (close-on-exec, as every socket Python
    makes). From `_socket`, the C module under `socket`: importing `socket` itself (its enums) was
    2.5 ms of every run's CPU, for two calls that need none of it."""
    import _socket

    a, b = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    return a.detach(), b.detach()


class Launch:
    """The program's start, prepared while the supervisor has one thread (`fork`), made later (`start`)."""

    def __init__(self, command: list[str], executable: str | None, env: dict[str, str],
                 dispositions: dict[int, Any], checkpoint: str | None) -> None:
        self.command, self.executable, self.env = command, executable, env
        self.dispositions = dispositions
        self.checkpoint = checkpoint
        self.pid = 0
        self.watcher = 0
        self._go = -1  # the supervisor's end of the launcher's socket
        self._watch = -1  # the supervisor's end of the watcher's socket
        self._unacked = 0  # the watcher's pending copies asked to be dropped, not yet dropped
        self._told: set[int] = set()

    def fork(self) -> None:
        """The watcher, then the launcher. A limit that refuses either leaves nothing behind: the
        watcher is told the run is over and reaped, every descriptor is closed, and NoRoom says why."""
        try:
            self._fork()
        except BaseException as exc:
            self.abort()
            if self.watcher > 0:
                try:
                    os.waitpid(self.watcher, 0)  # it leaves at once: the socket said "done", then ended
                except ChildProcessError:
                    pass
            room = no_room(exc)
            if room is not None:
                raise room from None
            raise

    def _fork(self) -> None:
        prctl = _prctl()
        shell = os.getppid()
        # One socket both ways (the job's pids and the run's end out, acknowledgements back) where
        # two pipes would take two more descriptors. It ends (EOF) when the supervisor dies.
        ours, theirs = _socketpair()
        self._watch = ours
        try:
            self.watcher = os.fork()
        except BaseException:
            os.close(theirs)
            raise
        if self.watcher == 0:
            os.close(self._watch)
            _watcher(theirs, self.checkpoint, shell)  # never returns
        os.close(theirs)
        # The same for the launcher: the go, then exec's errno back. So energyprof starts the
        # program under `ulimit -n 8`, as python does.
        self._go, ours = _socketpair()
        try:
            self.pid = os.fork()
        except BaseException:
            os.close(ours)
            raise
        if self.pid == 0:
            _launcher(ours, (self._watch, self._go), os.getppid(), prctl, self.command,
                      self.executable, self.env, self.dispositions)  # never returns
        os.close(ours)
        self.tell([self.pid])

    def start(self) -> int:
        """Let the program run; its pid. OSError (from exec) if it could not start."""
        assert self._go >= 0
        go, self._go = self._go, -1
        data = b""
        try:
            os.write(go, b"g")
            while chunk := os.read(go, 64):  # the launcher's end closes on exec (close-on-exec)
                data += chunk
        finally:
            os.close(go)
        if data:
            os.waitpid(self.pid, 0)
            errno_ = int(data)
            raise OSError(errno_, os.strerror(errno_))
        return self.pid

    def abort(self) -> None:
        """The run could not begin: the launcher (if there is one) leaves without running anything."""
        if self._go >= 0:
            os.close(self._go)  # the launcher reads the end of the socket and leaves
            self._go = -1
        if self.pid > 0:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
        self.finish()

    def tell(self, pids: Any) -> None:
        """The watcher learns the job's processes (only new ones are sent)."""
        new = [p for p in pids if p not in self._told]
        if not new or self._watch < 0:
            return
        self._told.update(new)
        self._send("".join(f"p {p}\n" for p in new).encode())

    def sent_to_job(self, signo: int) -> bool:
        """`signo` was sent to the whole job, not to energyprof alone (`kill -- -PGID`, SLURM's
        `--signal` without `B:`, which signals every process of the step): the watcher has it
        pending too, so the program has it already and must not get it twice. Needs /proc."""
        if not PROC or self.watcher <= 0 or self._watch < 0:
            return False
        time.sleep(SPREAD_S)
        deadline = time.monotonic() + 2.0
        while self._unacked > 0 and time.monotonic() < deadline:  # a dropped copy must be gone first
            if select.select([self._watch], [], [], 0.1)[0]:
                got = os.read(self._watch, 64)
                if not got:
                    break
                self._unacked -= len(got)
        try:
            with open(f"/proc/{self.watcher}/status", "rb") as fh:
                line = next(ln for ln in fh if ln.startswith(b"ShdPnd:"))
            pending = int(line.split()[1], 16)
        except (OSError, StopIteration, ValueError, IndexError):
            return False
        if not pending >> (signo - 1) & 1:
            return False
        self.forget(signo)
        return True

    def forget(self, signo: int) -> None:
        """The watcher drops its pending copy of a signal the job got (the terminal's Ctrl-C), so a
        later one sent to energyprof alone is not taken for the job's."""
        if PROC and signo in HELD and self._watch >= 0:
            self._send(f"c {signo}\n".encode())
            self._unacked += 1

    def finish(self) -> None:
        """energyprof ends normally: the watcher leaves the job's processes alone (a daemon the
        program left running lives on, as it would without energyprof), and is reaped: energyprof
        leaves no process of its own behind (in a pids cgroup at its limit, a watcher still
        exiting would refuse the next command its process)."""
        if self._watch >= 0:
            self._send(b"d\n")
            os.close(self._watch)
            self._watch = -1
            if self.watcher > 0:
                try:
                    os.waitpid(self.watcher, 0)  # it leaves at once: the socket said "done", then ended
                except ChildProcessError:
                    pass  # reaped already
                self.watcher = 0

    def _send(self, data: bytes) -> None:
        try:
            os.write(self._watch, data)
        except OSError:
            pass  # the watcher is gone (killed with its group): nothing to tell


def _launcher(go: int, theirs: tuple[int, ...], parent: int, prctl: Callable[..., int] | None,
              command: list[str], executable: str | None, env: dict[str, str], dispositions: dict[int, Any]) -> None:
    try:
        # The supervisor's ends: the go socket must read EOF, and the watcher's socket end, when
        # the supervisor dies, whatever this process is doing.
        for fd in theirs:
            if fd >= 0:
                os.close(fd)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before the request took effect
            os._exit(0)
        if os.read(go, 1) != b"g":
            os._exit(0)
        for s, h in dispositions.items():
            try:
                signal.signal(s, h)
            except (OSError, ValueError):
                pass
        signal.set_wakeup_fd(-1)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        if executable is not None:
            os.execve(executable, command, env)
        else:
            os.execvpe(command[0], command, env)
    except OSError as exc:
        try:
            os.write(go, str(exc.errno or 0).encode())
        except OSError:
            pass
    except BaseException:  # noqa: BLE001 - never return into the supervisor's code
        pass
    os._exit(127)


def _watcher(sock: int, checkpoint: str | None, shell: int) -> None:
    try:
        cwd = os.getcwd()
        signal.set_wakeup_fd(-1)
        # The terminal's and the scheduler's signals are the program's: blocked here, never
        # acted on, but left pending, where the supervisor sees that one went to the whole job.
        for s in HELD:
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, HELD)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)  # keeps stderr only: a pipe reading energyprof's stdout ends with energyprof
        for lo, hi in _gaps(3, [sock], 1 << 16):
            os.closerange(lo, hi)
        os.chdir("/")
        pids: list[int] = []
        done = False
        pending = b""
        while chunk := os.read(sock, 4096):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line == b"d":
                    done = True
                elif line.startswith(b"p "):
                    pids.append(int(line[2:]))
                elif line.startswith(b"c "):
                    if hasattr(signal, "sigtimedwait"):
                        signal.sigtimedwait({int(line[2:])}, 0)  # seen: the next one sent to the job shows again
                    try:
                        os.write(sock, b"k")
                    except OSError:
                        pass  # the supervisor is not waiting for it any more
        if not done:
            ended = _end_job(pids, shell)
            where = ""
            if checkpoint and os.path.isfile(os.path.join(cwd, checkpoint)):
                where = f"; the run up to its last checkpoint is in {checkpoint} (energyprof report {checkpoint})"
            os.write(2, (f"energyprof: energyprof was killed before the program ended; the job's processes still"
                         f" running were ended ({ended}){where}\n").encode(errors="replace"))
    except BaseException:  # noqa: BLE001 - never return into the supervisor's code
        pass
    os._exit(0)


def _gaps(lo: int, keep: list[int], hi: int) -> list[tuple[int, int]]:
    """The ranges of [lo, hi) between the descriptors to keep."""
    out = []
    for fd in keep:
        out.append((lo, fd))
        lo = fd + 1
    out.append((lo, hi))
    return out


def _end_job(pids: list[int], shell: int) -> int:
    """SIGTERM to every live process of the job, SIGKILL to those still there after the grace;
    how many there were.

    The job: the processes the supervisor told of and their descendants, and the orphans they
    left (the program itself may have died by its PR_SET_PDEATHSIG already): processes of this
    process group whose parent is gone to init or a subreaper. Only processes that started after
    this watcher (so never a reused pid, the shell or a pipeline's other commands), and never
    what `shell` (energyprof's parent) started itself: a script's later commands."""
    import psutil

    me, group = os.getpid(), os.getpgrp()
    started = psutil.Process(me).create_time()  # on the same clock as every other process's
    job: dict[int, Any] = {}

    def qualifies(p: int) -> bool:
        if p in job or p == me or p == shell:
            return False
        try:
            proc = psutil.Process(p)
            if proc.create_time() >= started and proc.status() != psutil.STATUS_ZOMBIE:
                job[p] = proc
                return True
        except psutil.Error:
            pass
        return False

    def take(pid: int) -> None:
        if qualifies(pid):  # a descendant of a process of the job is one too
            for p in descendant_pids(pid):
                qualifies(p)

    for pid in pids:
        take(pid)
    for pid in psutil.pids():
        try:
            if pid in job or pid == me or os.getpgid(pid) != group:
                continue
            parent = psutil.Process(pid).ppid()
            if parent in job or parent == 1 or (parent != shell and os.getpgid(parent) != group):
                take(pid)
        except (OSError, psutil.Error):
            continue
    for proc in job.values():
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(list(job.values()), timeout=GRACE_S)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return len(job)
