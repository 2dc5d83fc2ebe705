"""The privileged reader: one thread, a bounded set of connections, a fixed grammar.

Built as a root service must be, because a local user will try to turn it against the machine:
- **Its socket lives in a folder root owns.** `prepare_folder` creates it 0750 root:GROUP, or accepts
  an existing one only if it is a real directory (not a link), owned by root, and writable by no one
  else. Inside it no other user can create, rename or replace an entry, so binding, removing a stale
  socket and setting the socket's group (lchown, never following a link) cannot be raced: the old
  reader chown'd a path in a folder its attacker owned, and a symlink swapped in between bind()
  and chown() gave the group any root file (Debian's /etc/shadow is 0640 root:shadow).
- **It serves its group only.** Each connection's peer is read from the kernel (SO_PEERCRED):
  root and members of the group are served, anyone else is closed at once and logged.
- **It cannot be worn out by one client.** One thread and a selector: no thread per connection.
  At most MAX_CONNECTIONS at once and MAX_PER_UID per user; a connection that sends no complete
  request for IDLE_S is closed; a request line longer than protocol.MAX_LINE, or outside the
  grammar, closes its connection. Memory is bounded by the connection cap times the line cap.
- **It does only what it names.** Readings of the counters it found at start-up, and the knobs it
  was given at start-up, set within their range; a knob a connection set is restored when that
  connection closes (the client exited, crashed or was killed), and every knob when the reader
  stops. It never opens a path a client sends: requests carry names of what it already holds.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import selectors
import socket
import stat
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import protocol

MAX_CONNECTIONS = 64
MAX_PER_UID = 8
IDLE_S = 10.0
SEND_LIMIT = 64 * 1024  # a client that reads none of its replies is closed, not buffered for
FOLDER_MODE = 0o750
SOCKET_MODE = 0o660


class ServeError(Exception):
    """Why the reader will not start: one line for the user."""


# ---------------------------------------------------------------- the socket and its folder


def group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ServeError(f"no group named {name!r} (create it: sudo groupadd {name})") from None


def check_folder(folder: str) -> str | None:
    """Why an existing folder cannot hold the socket, or None if it can (or does not exist)."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"{folder} is a symbolic link; the reader's folder must be a real directory that root owns"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} exists and is not a directory"
    if st.st_uid != 0:
        return (f"{folder} is owned by uid {st.st_uid}, not root: another user could replace the socket; "
                "remove it or choose a folder root owns")
    if st.st_mode & 0o022:
        return f"{folder} is writable by its group or others (mode {stat.S_IMODE(st.st_mode):o}); the reader's folder must not be"
    return None


def prepare_folder(folder: str, gid: int) -> None:
    """The socket's folder, root's and 0750 root:GROUP: created, or an existing one checked."""
    try:
        os.mkdir(folder, FOLDER_MODE)
        created = True
    except FileExistsError:
        created = False
    except FileNotFoundError:
        raise ServeError(f"the folder above {folder} does not exist") from None
    problem = check_folder(folder)
    if problem:
        raise ServeError(problem)
    if created:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:  # on the descriptor: the folder just made, whatever its path names now
            os.fchown(fd, 0, gid)
            os.fchmod(fd, FOLDER_MODE)
        finally:
            os.close(fd)


def bind(path: str, gid: int) -> socket.socket:
    """The listening socket at `path`, mode 0660 root:GROUP, in a folder that only root can change."""
    folder = os.path.dirname(os.path.abspath(path))
    prepare_folder(folder, gid)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise ServeError(f"{path} exists and is not a socket; not replaced")
        os.unlink(path)  # a stale socket of an earlier reader: safe, the folder is root's alone
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o777 & ~SOCKET_MODE)  # the reader's own process: no user thread runs here
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chown(path, 0, gid, follow_symlinks=False)
    sock.listen(128)
    return sock


def inherited_socket() -> socket.socket | None:
    """The listening socket systemd handed over (socket activation: LISTEN_PID, LISTEN_FDS, fd 3)."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()) or int(os.environ.get("LISTEN_FDS", "0") or 0) < 1:
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    return socket.socket(fileno=3)


# ---------------------------------------------------------------- who may ask


def peer(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, from the kernel."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)


def member(uid: int, gid: int, group: int) -> bool:
    if uid == 0 or gid == group:
        return True
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    return group in os.getgrouplist(user.pw_name, user.pw_gid)


# ---------------------------------------------------------------- the reader


@dataclass
class Conn:
    sock: socket.socket
    uid: int
    pid: int
    inbox: bytes = b""
    outbox: bytes = b""
    last: float = 0.0
    knobs: set[str] = field(default_factory=set)  # the knobs this connection set, restored when it closes


class Reader:
    """The served counters and knobs, behind one listening socket."""

    def __init__(self, listener: socket.socket, gid: int, snapshot: Callable[[], dict[str, Any]],
                 knobs: list[Any] | None = None, log: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.listener = listener
        self.gid = gid
        self.snapshot = snapshot
        self.knobs = {k.name: k for k in knobs or []}
        self.owner: dict[str, Conn] = {}  # a knob is set by one connection at a time
        self.log = log or (lambda line: print(f"energyprof sensors serve: {line}", file=sys.stderr, flush=True))
        self.clock = clock
        self.conns: dict[int, Conn] = {}
        self.sel = selectors.DefaultSelector()
        listener.setblocking(False)
        self.sel.register(listener, selectors.EVENT_READ, None)
        self.stopping = False

    # -- the loop ------------------------------------------------------------------------
    def serve(self) -> None:
        try:
            while not self.stopping:
                self.step(0.5)
        finally:
            self.close()

    def step(self, timeout: float) -> None:
        for key, events in self.sel.select(timeout):
            if key.data is None:
                self._accept()
                continue
            conn: Conn = key.data
            if events & selectors.EVENT_READ:
                self._read(conn)
            if events & selectors.EVENT_WRITE and conn.sock.fileno() in self.conns:
                self._flush(conn)
        now = self.clock()
        for conn in [c for c in self.conns.values() if now - c.last > IDLE_S]:
            self._drop(conn, "idle")

    def close(self) -> None:
        for conn in list(self.conns.values()):
            self._drop(conn, None)
        for knob in self.knobs.values():
            self._restore(knob)
        self.sel.close()
        self.listener.close()

    # -- connections ---------------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(MAX_CONNECTIONS):  # a burst at most: the others' requests wait no longer
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # EMFILE and the like: refuse this one, never spin
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.log(f"cannot accept a connection: {exc.strerror}")
                return
            try:
                pid, uid, gid = peer(sock)
            except OSError:
                sock.close()
                continue
            if not member(uid, gid, self.gid):
                self.log(f"refused uid {uid} (pid {pid}): not in the reader's group")
                sock.close()
                continue
            mine = sum(1 for c in self.conns.values() if c.uid == uid)
            if len(self.conns) >= MAX_CONNECTIONS or mine >= MAX_PER_UID:
                self.log(f"refused uid {uid} (pid {pid}): {mine} connections open "
                         f"(at most {MAX_PER_UID} per user, {MAX_CONNECTIONS} in all)")
                sock.close()
                continue
            sock.setblocking(False)
            conn = Conn(sock=sock, uid=uid, pid=pid, last=self.clock())
            self.conns[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ, conn)

    def _drop(self, conn: Conn, why: str | None) -> None:
        if self.conns.pop(conn.sock.fileno(), None) is None:
            return
        if why:
            self.log(f"closed uid {conn.uid} (pid {conn.pid}): {why}")
        for name in sorted(conn.knobs):
            if self.owner.get(name) is conn:
                self._restore(self.knobs[name])
                del self.owner[name]
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _read(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(protocol.MAX_LINE + 1)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn, None)
            return
        if not data:
            self._drop(conn, None)
            return
        conn.inbox += data
        while b"\n" in conn.inbox:
            line, _, conn.inbox = conn.inbox.partition(b"\n")
            try:
                req = protocol.parse(line + b"\n")
            except protocol.ProtocolError as exc:
                self._drop(conn, str(exc))
                return
            conn.last = self.clock()
            self._send(conn, self._answer(conn, req))
            if conn.sock.fileno() not in self.conns:
                return
        if len(conn.inbox) >= protocol.MAX_LINE:
            self._drop(conn, f"a request line longer than {protocol.MAX_LINE} bytes")

    def _send(self, conn: Conn, data: bytes) -> None:
        conn.outbox += data
        if len(conn.outbox) > SEND_LIMIT:
            self._drop(conn, "reads none of its replies")
            return
        self._flush(conn)

    def _flush(self, conn: Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(conn, None)
            return
        conn.outbox = conn.outbox[sent:]
        self.sel.modify(conn.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbox else 0), conn)

    # -- answers -------------------------------------------------------------------------
    def _answer(self, conn: Conn, req: protocol.Request) -> bytes:
        if req.verb == "read":
            return protocol.reply(self.snapshot())
        if req.verb == "knobs":
            return protocol.reply({"knobs": [self._describe(k) for k in self.knobs.values()]})
        knob = self.knobs.get(req.name)
        if knob is None:
            self.log(f"refused uid {conn.uid} (pid {conn.pid}): no knob {req.name!r}")
            return protocol.reply({"error": f"no knob {req.name} is served here"})
        holder = self.owner.get(req.name)
        if holder is not None and holder is not conn:
            return protocol.reply({"error": f"{req.name} is held by another client (pid {holder.pid})"})
        if req.verb == "restore":
            if holder is conn:
                self._restore(knob)
                del self.owner[req.name]
                conn.knobs.discard(req.name)
            return protocol.reply({"ok": req.name})
        try:
            knob.set(req.value)
        except Exception as exc:  # noqa: BLE001 - a knob's refusal (out of range, the device) is the client's answer
            self.log(f"refused uid {conn.uid} (pid {conn.pid}): set {req.name} {req.value:g}: {exc}")
            return protocol.reply({"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__})
        self.owner[req.name] = conn
        conn.knobs.add(req.name)
        self.log(f"uid {conn.uid} (pid {conn.pid}) set {req.name} to {req.value:g}")
        return protocol.reply({"ok": req.name, "value": req.value})

    def _describe(self, knob: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"name": knob.name, "unit": knob.unit}
        try:
            rng = knob.range()
            out.update(value=knob.read(), low=rng.low, high=rng.high, choices=list(rng.choices))
        except Exception as exc:  # noqa: BLE001 - a knob that cannot be read says why
            out["error"] = str(exc)
        return out

    def _restore(self, knob: Any) -> None:
        try:
            knob.restore()
        except Exception as exc:  # noqa: BLE001 - the others are still restored
            self.log(f"could not restore {knob.name}: {exc}")
