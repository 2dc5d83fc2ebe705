"""Putting knobs back, guaranteed: every change energyprof makes goes through a Keeper.

The keeper takes each part's original (a file, a device's field: `Part.key`) before its first change,
whichever knob's name the change came under, so two knobs over the same file (`cpu_max_freq:all` and
`cpu_max_freq:0`) share one original. It writes the originals back in reverse order of change.

In this process that happens at `restore()`/`close()` (and atexit). For every other end (a signal's
default action, `os._exit`, kill -9 of the setter) there is a keeper process, started with the first
change in its own session, holding one end of a Unix socket pair as its stdin; the setter waits for its
ready byte before changing anything. Before each part's first change its original goes down the socket
as one JSON line, after an in-process restore a `restored` line takes it back. When the setter's end
closes with originals still held (the kernel closes it, whatever killed the setter) the keeper process
writes them back, newest first, and exits. The setter's end is close-on-exec, and a forked child closes
its copy, so only the setter keeps it open. Writes use MSG_NOSIGNAL: a keeper process gone is an error
(the held parts are put back in-process, or, for the reader, handed to a new keeper process), never a
SIGPIPE. A thread of the setter's watches its end: the keeper process dying (kill -9 of it alone) is seen at
once, and a new one is given every original still held. The start limit covers the launcher and the
keeper both. The keeper process is detached (its parent is init), so a profiled program's processes do not
include it.

A file is also claimed machine-wide while it is changed (an exclusive flock on a 0600 record in
/run/energyprof/knobs/, ENERGYPROF_KNOB_CLAIMS for tests; no other user can open, make or swap it, so none
can hold it; a folder there that others can write refuses the change, and an older claim others could open
is flocked before it is replaced, so one still held is refused too): each process that sets knobs has its own keeper,
and without the claim two of them would take each other's setting for an original. A second process
finding the claim held is refused, one line. The claim's descriptor goes to the keeper process with the
original, so after a kill -9 of the setter the claim is let go only once the original is back.

Changes may belong to owners (the privileged reader's clients): a part held by one owner cannot be
changed by another, and `restore(owner)` puts back only that owner's parts.
"""

from __future__ import annotations

import array
import atexit
import collections
import fcntl
import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from typing import Any, Hashable

from .base import Knob, KnobError, Part


ANY: Any = object()  # restore(): every owner's parts
START_WAIT_S = 10.0  # the keeper process answers within this, or no knob is changed
READY = b"R"


class KeeperGone(KnobError):
    """The keeper process could not be reached: a change would have nothing to put it back."""


class _Held:
    __slots__ = ("part", "original", "owner", "name", "claim")

    def __init__(self, part: Part, original: str, owner: Hashable, name: str, claim: int | None = None) -> None:
        self.part, self.original, self.owner, self.name, self.claim = part, original, owner, name, claim


# ---------------------------------------------------------------- the machine-wide claim

CLAIMS_ENV = "ENERGYPROF_KNOB_CLAIMS"
DEFAULT_CLAIMS = "/run/energyprof/knobs"


def _trusted_folder(st: os.stat_result) -> bool:
    """Root's (or this user's) folder that no one else can write: no one else can make, swap or remove a
    claim in it."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def _claims_folder(name: str, key: str) -> str | None:
    """The folder of claims, made if missing; None when it cannot be made (a user who cannot make it cannot
    write sysfs either). One that exists but is not trusted (`_trusted_folder`: another user could make, swap
    or remove a claim in it) refuses the change: going ahead unclaimed would let two setters hold one knob."""
    folder = os.environ.get(CLAIMS_ENV) or DEFAULT_CLAIMS
    try:
        os.makedirs(folder, mode=0o755, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return None
    if not _trusted_folder(st):
        raise KnobError(f"{name}: cannot claim {key}: {folder} is writable by others or not ours; nothing changed")
    return folder


def _claim_path(key: str) -> str:
    return os.path.join(os.environ.get(CLAIMS_ENV) or DEFAULT_CLAIMS, hashlib.sha256(key.encode()).hexdigest()[:40] + ".claim")


def _drop_claim(key: str, fd: int) -> None:
    """A claim let go: its file removed while still locked (a newcomer then makes a new one), then closed."""
    try:
        if os.fstat(fd).st_ino == os.stat(_claim_path(key), follow_symlinks=False).st_ino:
            os.unlink(_claim_path(key))
    except OSError:
        pass
    os.close(fd)


def _trusted(st: os.stat_result) -> bool:
    """A claim file only this user can open: a regular file of ours, 0600 or tighter, with one name. Any
    other (an older energyprof's 0644, which anyone may open and flock) is not a claim to wait on."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077 and st.st_nlink == 1


def _open_claim(folder: int, name: str) -> int:
    """The claim file `name` in the open `folder`, opened or made (O_EXCL, 0600) so that no other user can
    open it, make it first or put a link in its place: a user who could open it could flock it and refuse
    every change of root's. One this process may not write (another's) is opened read-only: enough to
    flock it, to learn whether it is held before it is replaced."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags | os.O_RDWR, dir_fd=folder)
    except FileNotFoundError:
        return os.open(name, flags | os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=folder)
    except PermissionError:
        return os.open(name, flags | os.O_RDONLY, dir_fd=folder)


def _claim(part: Part, name: str) -> int | None:
    """An exclusive flock on the claim of `part` (a file named by a hash of its real path), held while it is
    changed: a second process (another reader, a root `--knob` run, an optimizer) that finds it held is
    refused, one line. The descriptor is also handed to the keeper process, so the claim outlives a kill
    -9 of the setter until its original is back."""
    where = _claims_folder(name, part.key) if part.claimed else None
    if where is None:
        return None
    file = os.path.basename(_claim_path(part.key))
    try:
        folder = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise KnobError(f"{name}: cannot claim {part.key} in {where}: {exc.strerror or exc}") from None
    try:
        if not _trusted_folder(os.fstat(folder)):  # swapped since it was checked
            raise KnobError(f"{name}: cannot claim {part.key}: {where} is writable by others")
        return _lock_claim(folder, file, part.key, name, where)
    finally:
        os.close(folder)


def _lock_claim(folder: int, file: str, key: str, name: str, where: str) -> int:
    # a claim file unlinked (by its last holder, or as untrusted) between our open and our lock: open it again
    for _ in range(16):
        try:
            fd = _open_claim(folder, file)
        except FileExistsError:  # made by another between our two opens: open it again
            continue
        except OSError as exc:
            raise KnobError(f"{name}: cannot claim {key} in {where}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                who = os.pread(fd, 64, 0).decode(errors="replace").split()[0]
            except (OSError, IndexError):
                who = "?"
            os.close(fd)
            raise KnobError(f"{name}: {key} is being changed by another energyprof process (pid {who})") from None
        try:
            st = os.fstat(fd)
            same = st.st_ino == os.stat(file, dir_fd=folder, follow_symlinks=False).st_ino
        except OSError:
            same = False
        if same and (not _trusted(st) or fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDWR):
            # not held (we hold it now) but one others may open (an older energyprof's 0644), or one we cannot
            # write: removed while locked, so that no holder of it is ever displaced, and made anew next try
            try:
                os.unlink(file, dir_fd=folder)
            except OSError as exc:
                os.close(fd)
                raise KnobError(f"{name}: cannot claim {key} in {where}: {exc.strerror or exc}") from None
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {key}\n".encode(), 0)
            return fd
        os.close(fd)
    raise KnobError(f"{name}: cannot claim {key}: its claim keeps changing")


def _unclaim(held: _Held) -> None:
    fd, held.claim = held.claim, None
    if fd is not None:
        _drop_claim(held.part.key, fd)


class Keeper:
    """The parts one process has changed: `set` knobs through it, `restore` or `close` it at the end.

    `respawn`: when the keeper process is found gone (a write to it fails), start a new one and hand it
    every original still held (the privileged reader, which lives on). Otherwise what is held is put back
    in this process and the change refused: nothing would put it back after a kill -9."""

    def __init__(self, respawn: bool = False) -> None:
        self.held: dict[str, _Held] = {}  # part key -> its original; insertion order is the order of change
        self._sock: socket.socket | None = None  # our end; the keeper process holds the other as its stdin
        self.respawn = respawn
        self._registered = False
        self._at_fork = False
        self._lock = threading.RLock()

    # -- the keeper process ------------------------------------------------------------------
    def _start(self) -> None:
        """The keeper process, detached: its own session (a Ctrl-C or a SIGTERM to the setter's group does not
        reach it) and not a descendant of the setter (a profiled program's process list, CPU and energy are
        not charged with energyprof's keeper), started from / with -P so that the program's folder (a
        json.py of its own) is not on its import path, and without the sampler's bootstrap. It imports
        energyprof from where this process did (a program may have it from its own folder), and only
        energyprof from there. Its output goes to /dev/null, never the program's. It answers one byte when
        ready; without it within START_WAIT_S, KnobError and nothing is changed."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {k: v for k, v in os.environ.items() if k != "ENERGYPROF_AGENT"}
        safe = ["-P"] if sys.version_info >= (3, 11) else []
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above energyprof/
        argv = [sys.executable, *safe, "-c", _BOOT, package_root]
        launcher = None
        deadline = time.monotonic() + START_WAIT_S  # the launcher's run and the keeper's start, together
        try:
            # a bare interpreter (-S: no site, a few ms) forks the keeper and leaves at once: the keeper's
            # parent becomes init, and it holds the socket's other end as its stdin
            with open(os.devnull, "wb") as null:
                launcher = subprocess.Popen([sys.executable, "-S", *safe, "-c", _DETACH, *argv], stdin=theirs,
                                            stdout=null, stderr=null, env=env, start_new_session=True,
                                            close_fds=True, cwd="/")
            launcher.wait(timeout=max(0.0, deadline - time.monotonic()))
            ours.settimeout(max(0.001, deadline - time.monotonic()))
            ready = ours.recv(1)
            ours.settimeout(None)
        except (OSError, subprocess.TimeoutExpired) as exc:  # socket.timeout is an OSError
            ready, why = b"", getattr(exc, "strerror", None) or "no answer"
        else:
            why = "it exited at start"
        finally:
            theirs.close()
            if launcher is not None and launcher.poll() is None:  # stopped or stuck: it holds nothing of ours
                launcher.kill()
                launcher.wait()
        if ready != READY:
            ours.close()  # a keeper that starts late finds its socket closed and exits without a change
            raise KnobError(f"the process that restores knobs did not start ({why} within {START_WAIT_S:g} s);"
                            " nothing changed")
        self._sock = ours
        if not self._at_fork:
            os.register_at_fork(after_in_child=self._forget_in_child)
            self._at_fork = True
        from ..agent.own_threads import start

        start(self._watch, ours)

    def _watch(self, sock: socket.socket) -> None:
        """Wait for the keeper process's end to close (it sends nothing after its ready byte). Closed by
        us (`_lost`, `close`): nothing to do. Closed by its death (a kill -9): a new keeper process is
        given every original still held, as a write that finds it gone does for the reader; if none can
        start, the originals go back here, since nothing else would put them back."""
        try:
            while sock.recv(1):
                pass
        except OSError:
            pass
        with self._lock:
            if self._sock is not sock:
                return
            self._lost()
            if not self.held:
                return
            try:
                self._start()
                self._hand_over()
                return
            except (OSError, KnobError) as exc:
                self._lost()
                why = str(exc)
            lines = self.restore()
        print(f"energyprof: the process that restores knobs has gone and no other started ({why}); the knobs"
              " are back to their originals", file=sys.stderr)
        for line in lines:
            print(f"energyprof: {line}", file=sys.stderr)

    def _hand_over(self) -> None:
        """Every original still held, to a new keeper process."""
        for key, held in self.held.items():
            rec = held.part.record(held.original)
            if rec is not None:
                self._write({"hold": key, "restore": rec}, held.claim)

    def _forget_in_child(self) -> None:
        """A forked child (a DataLoader worker) must not keep the socket open after the setter is gone."""
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                os.close(sock.detach())  # the child's copy only; the setter's stays open
            except OSError:
                pass
        for held in self.held.values():  # nor its claims (the setter's copies keep them)
            if held.claim is not None:
                try:
                    os.close(held.claim)
                except OSError:
                    pass
        self.held = {}

    def _write(self, record: dict[str, Any], claim: int | None = None) -> None:
        assert self._sock is not None
        data = (json.dumps({**record, "claim": True} if claim is not None else record) + "\n").encode()
        # MSG_NOSIGNAL: a keeper gone is an error here, never a SIGPIPE (a program may have set SIG_DFL)
        if claim is not None:  # the claim's descriptor rides with the line's first byte
            # sendmsg itself: socket.send_fds drops its flags (MSG_NOSIGNAL) before Python 3.13
            sent = self._sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [claim]))],
                                      socket.MSG_NOSIGNAL)
            data = data[sent:]
        if data:
            self._sock.sendall(data, socket.MSG_NOSIGNAL)

    def _lost(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            _hang_up(sock)

    def _send(self, record: dict[str, Any], claim: int | None = None) -> None:
        if self._sock is None:
            self._start()
        try:
            self._write(record, claim)
            return
        except OSError as exc:
            self._lost()
            why = exc.strerror or str(exc)
        if not self.respawn:
            raise KeeperGone(f"the process that restores knobs has gone ({why})")
        self._start()  # a new one, given every original still held, then this record
        try:
            self._hand_over()
            self._write(record, claim)
        except OSError as exc:
            self._lost()
            raise KeeperGone(f"the process that restores knobs has gone ({exc.strerror or exc})") from None

    # -- changes -------------------------------------------------------------------------------
    def set(self, knob: Knob, value: float, owner: Hashable = None) -> None:
        """Check `value`, keep the original of every part the knob writes that is not held yet, then write.
        Refused part-way (a file of several not written), every part goes back to what it was before this
        call: its original, or, one this owner already held, the value it had set."""
        knob.check(value)
        with self._lock:
            parts = knob.parts()
            for part in parts:
                held = self.held.get(part.key)
                if held is not None and held.owner != owner:
                    raise KnobError(f"{knob.name} is set by another client until it disconnects")
            new: list[str] = []
            before: dict[str, tuple[Part, str]] = {}
            try:
                for part in parts:
                    if part.key in self.held:
                        if part.key not in new and part.key not in before:
                            before[part.key] = (part, part.read())
                        continue
                    claim = _claim(part, knob.name)  # refused while another process changes it
                    try:
                        original = part.read()
                        record = part.record(original)
                        if record is not None:  # before the change: a kill -9 right after still restores
                            self._send({"hold": part.key, "restore": record}, claim)
                    except BaseException:
                        if claim is not None:
                            _drop_claim(part.key, claim)
                        raise
                    self.held[part.key] = _Held(part, original, owner, knob.name, claim)
                    new.append(part.key)
                if not self._registered:
                    atexit.register(self.close)
                    self._registered = True
                knob._write(value)
            except BaseException as exc:
                # refused (no permission, a binding's error): what this call changed goes back, and what it
                # newly held is not held
                undo = [(self.held[k].part, self.held[k].original) for k in new] + list(before.values())
                for part, text in undo:
                    try:
                        part.write(text)
                    except Exception:  # noqa: BLE001 - the refusal above is the error to report
                        pass
                self._forget(new)
                if isinstance(exc, KeeperGone) and not self.respawn:
                    self.restore()  # nothing outside this process would put them back now
                raise

    def _forget(self, keys: list[str]) -> None:
        for key in keys:
            held = self.held.pop(key, None)
            if self._sock is not None:
                try:
                    self._send({"restored": key})
                except KnobError:
                    pass
            if held is not None:
                _unclaim(held)

    def release(self, owner: Hashable) -> list[str]:
        """Leave `owner`'s parts as they are now (an optimizer told to keep its choice): nothing restores them.
        The keys released."""
        with self._lock:
            keys = [k for k, h in self.held.items() if h.owner == owner]
            self._forget(keys)
            return keys

    def holds(self, owner: Hashable) -> bool:
        with self._lock:
            return any(h.owner == owner for h in self.held.values())

    def restore(self, owner: Hashable = ANY, knob: Knob | None = None) -> list[str]:
        """The originals back, newest change first: every part held, or those of `owner` (and of `knob`
        only, when given). One line per part that could not be restored, returned."""
        errors = []
        lost = False
        with self._lock:
            keys = {p.key for p in knob.parts()} if knob is not None else None
            for key in reversed(list(self.held)):
                held = self.held.get(key)
                if held is None:
                    continue
                if owner is not ANY and held.owner != owner:
                    continue
                if keys is not None and key not in keys:
                    continue
                try:
                    held.part.write(held.original)
                except KnobError as exc:
                    errors.append(str(exc))
                    continue
                except Exception as exc:  # noqa: BLE001 - a device's binding raising its own error: said, not raised
                    errors.append(f"{held.name}: could not restore {key}: {exc}")
                    continue
                del self.held[key]
                if self._sock is not None:
                    try:
                        self._send({"restored": key})
                    except KeeperGone:
                        lost = True  # the part is back anyway
                _unclaim(held)
            if lost and not self.respawn and self.held:
                errors += self.restore()  # the others too: nothing outside this process would put them back
        return errors

    def close(self) -> None:
        """Restore everything, then let the keeper process go (it has nothing left to hold)."""
        errors = self.restore()
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            _hang_up(sock)  # the keeper process reads the end, has nothing held, and exits
        for line in errors:
            print(f"energyprof: {line}", file=sys.stderr)


def _hang_up(sock: socket.socket) -> None:
    """Our end closed for good: shut down first, which wakes the watcher's recv (a close alone would not,
    and the keeper process would not see the end while that recv holds it)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


_shared: Keeper | None = None


def shared() -> Keeper:
    """This process's keeper (the in-program optimizer's, and any other setter in the program)."""
    global _shared
    if _shared is None:
        _shared = Keeper()
    return _shared


# ---------------------------------------------------------------- the keeper process

# Run by `python -S -c`: fork the keeper (argv[1:]) and leave; the keeper keeps stdin (its end of the socket).
_DETACH = "import os, sys\nif os.fork() == 0:\n    os.execv(sys.argv[1], sys.argv[1:])\nos._exit(0)\n"

# The keeper's start (`python -P -c _BOOT PACKAGE_ROOT`): energyprof from the folder the setter had it from,
# and nothing else from there (a json.py beside it stays out of the keeper's imports).
_BOOT = (
    "import sys, importlib.machinery, importlib.util\n"
    "spec = importlib.machinery.PathFinder.find_spec('energyprof', [sys.argv[1]])\n"
    "if spec is None: raise SystemExit(3)\n"
    "m = importlib.util.module_from_spec(spec); sys.modules['energyprof'] = m; spec.loader.exec_module(m)\n"
    "from energyprof.knobs.keeper import main\n"
    "raise SystemExit(main())\n"
)


def _apply(record: dict[str, Any]) -> None:
    if "files" in record:
        for path, text in record["files"]:
            with open(path, "w") as f:
                f.write(text)
    elif "argv" in record:
        subprocess.run(record["argv"], check=True, timeout=60, stdout=subprocess.DEVNULL)
    elif "nvml" in record:
        from .nvml import restore_limit

        restore_limit(record["nvml"], record["mw"], record["binding"])
    else:
        from .registry import find

        find(record["name"])._write(float(record["value"]))


def keep(sock: socket.socket) -> int:
    """Hold the originals read from `sock` (and the claims' descriptors that come with them) until it
    closes, then write back those not yet restored, newest first; the claims go with this process."""
    held: dict[str, dict[str, Any]] = {}
    claims: dict[str, int] = {}
    fds: collections.deque[int] = collections.deque()  # in the order of their lines: each came with its line's first byte
    buf = b""
    while True:
        try:
            data, got, _, _ = socket.recv_fds(sock, 65536, 16)
        except InterruptedError:
            continue
        except OSError:
            break
        fds.extend(got)
        if not data:
            break
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            fd = fds.popleft() if msg.get("claim") and fds else None
            if "hold" in msg:
                held.setdefault(msg["hold"], msg["restore"])  # the first original of a part is the one kept
                if fd is not None:
                    old = claims.setdefault(msg["hold"], fd)
                    if old != fd:
                        os.close(fd)
            elif "restored" in msg:
                held.pop(msg["restored"], None)
                if msg["restored"] in claims:
                    os.close(claims.pop(msg["restored"]))
    failed = 0
    for key in reversed(list(held)):
        try:
            _apply(held[key])
        except Exception as exc:  # noqa: BLE001 - one part failing must not leave the others changed
            failed += 1
            print(f"energyprof: could not restore {key}: {exc}", file=sys.stderr)
    for key, fd in claims.items():  # every original back: the claims go
        _drop_claim(key, fd)
    return 1 if failed else 0


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only the socket's end says when to restore
    try:
        os.write(0, READY)  # the setter waits for this before its first change
    except OSError:
        return 1  # the setter is gone already: nothing was changed
    return keep(socket.socket(fileno=0))


if __name__ == "__main__":
    raise SystemExit(main())
