"""The reader: one thread, one selector, bounded in every dimension a client controls.

Why no path can be raced: the socket's folder is opened once with O_NOFOLLOW|O_DIRECTORY and must be
owned by this process's user (root) and writable by no one else, so no other user can create, rename
or replace any entry in it; stale sockets are removed through that descriptor only. The socket's mode
and group are fixed at bind() itself (umask 0117 and the effective group switched to the served group
for the bind), so the inode is born 0660 root:GROUP and nothing is chmod-ed or chown-ed by path
afterwards. A folder the reader creates itself is made 0750 root:GROUP through its descriptor.

Two scopes, two grants: the read group (`--group`) reads counters, the control group (`--control-group`)
sets knobs; without a control group only root sets. Counters are a side channel (PLATYPUS,
CVE-2020-8694: the kernel made them root-only), so reads to clients other than root are limited in rate
(one fresh reading per `read_interval_s` per user, whatever its connections; sooner, the last one again)
and rounded down to `energy_resolution_uj`; changes are limited to one per `set_interval_s` per user.

Every change goes through the reader's own keeper (knobs/keeper.py), a separate process: a client's
knobs come back when it leaves, all of them when the reader stops, and after a kill -9 of the reader too.
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
from pathlib import Path
from typing import Any, Callable

from ..record import field, record
from ..knobs.base import Knob, KnobError
from ..knobs.keeper import Keeper
from ..collect.sensors import served_protocol as protocol

MAX_CONNECTIONS = 32
MAX_PER_UID = 8
IDLE_TIMEOUT_S = 10.0
MAX_PENDING_REPLY = 64 * 1024  # a client that does not read its replies is closed past this
LOG_LINES_PER_S = 20
READ_INTERVAL_S = 0.01  # clients other than root: one fresh reading per 10 ms per user
ENERGY_RESOLUTION_UJ = 1000  # ... rounded down to 1 mJ (0.1% of 10 ms at 100 W)
SET_INTERVAL_S = 0.1  # ... and one change per 100 ms per user


class ServeError(ValueError):
    """A reason not to serve, one line for the user."""


class Log:
    """stderr (the journal under systemd), at most LOG_LINES_PER_S lines a second for each kind of event:
    a flood of refused connections must not become a flood of lines (nor block the reader on a full
    pipe for long), nor drown the other kinds of event."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.window: dict[str, float] = {}
        self.lines: dict[str, int] = {}
        self.dropped: dict[str, int] = {}

    def __call__(self, msg: str, kind: str = "other") -> None:
        now = time.monotonic()
        if now - self.window.get(kind, 0.0) >= 1.0:
            if self.dropped.get(kind):
                self._write(f"energyprof reader: {self.dropped[kind]} more lines like the last suppressed")
            self.window[kind], self.lines[kind], self.dropped[kind] = now, 0, 0
        if self.lines[kind] >= LOG_LINES_PER_S:
            self.dropped[kind] += 1
            return
        self.lines[kind] += 1
        self._write(f"energyprof reader: {msg}")

    def _write(self, line: str) -> None:
        try:
            print(line, file=self.stream, flush=True)
        except (OSError, ValueError):
            pass


# ---------------------------------------------------------------- the folder and the socket


def group_gid(group: str | None) -> int | None:
    if group is None:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ServeError(f"no group named {group!r} (create it: sudo groupadd --system {group})") from None


def check_folder(st: os.stat_result, folder: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise ServeError(f"{folder} is a symlink; refused (the socket folder must be a real folder owned by root)")
    if not stat.S_ISDIR(st.st_mode):
        raise ServeError(f"{folder} is not a folder; refused")
    if st.st_uid != os.geteuid():
        owner = _user(st.st_uid)
        raise ServeError(f"{folder} is owned by {owner}, not {_user(os.geteuid())}; refused "
                         "(remove it or choose another --socket)")
    if st.st_mode & 0o022:
        raise ServeError(f"{folder} is writable by others (mode {st.st_mode & 0o7777:04o}); refused")


def open_folder(folder: str, gid: int | None, create: bool = True) -> int:
    """The socket folder as a descriptor, checked; created 0750 owner:GROUP when missing."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        if not create:
            raise ServeError(f"{folder} does not exist") from None
        old = os.umask(0o077)
        try:
            os.mkdir(folder, 0o700)  # born private: no window where others could enter it
        except FileExistsError:
            pass  # someone made it in between: the checks below decide
        finally:
            os.umask(old)
        st = os.lstat(folder)
        check_folder(st, folder)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        if gid is not None:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, 0o750 if gid is not None else 0o700)
        return _same(fd, st, folder)
    check_folder(st, folder)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ServeError(f"cannot open {folder} ({exc.strerror})") from None
    return _same(fd, st, folder)


def _same(fd: int, st: os.stat_result, folder: str) -> int:
    # The folder opened is the folder checked (not swapped between lstat and open).
    fst = os.fstat(fd)
    if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise ServeError(f"{folder} changed while being checked; refused")
    return fd


def remove_stale(dir_fd: int, name: str, path: str) -> None:
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ServeError(f"{path} exists and is not a socket; not replaced")
    os.unlink(name, dir_fd=dir_fd)  # unlink never follows a link, and only we can write this folder


def bind(path: str, gid: int | None) -> tuple[socket.socket, int]:
    """The listening socket at `path`, born 0660 owner:GROUP (0600 without a group), and the folder's fd."""
    folder, name = os.path.split(os.path.abspath(path))
    dir_fd = open_folder(folder, gid)
    try:
        remove_stale(dir_fd, name, path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o117 if gid is not None else 0o177)
        old_egid = os.getegid()
        try:
            if gid is not None and gid != old_egid:
                os.setegid(gid)  # the inode's group is the creator's effective group: set at birth, no chown
            sock.bind(path)
        finally:
            if os.getegid() != old_egid:
                os.setegid(old_egid)
            os.umask(old_umask)
        # The path bound is the entry in the folder checked (the folder was not renamed away in between).
        by_path, by_fd = os.lstat(path), os.lstat(name, dir_fd=dir_fd)
        if (by_path.st_dev, by_path.st_ino) != (by_fd.st_dev, by_fd.st_ino) or not stat.S_ISSOCK(by_fd.st_mode):
            sock.close()
            raise ServeError(f"{folder} changed while the socket was made; refused")
        sock.listen(64)
        sock.setblocking(False)
        return sock, dir_fd
    except Exception:
        os.close(dir_fd)
        raise


def inherited_socket() -> socket.socket | None:
    """The listening socket systemd passed (sd_listen_fds: LISTEN_PID is us, LISTEN_FDS >= 1, fd 3)."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    try:
        count = int(os.environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return None
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)  # not handed down to anything we start
    if count < 1:
        return None
    sock = socket.socket(fileno=3)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise ServeError("the inherited socket is not a Unix stream socket")
    sock.setblocking(False)
    return sock


# ---------------------------------------------------------------- who may ask


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux 4.13+: the groups the peer had at connect()


def peer_groups(conn: socket.socket, pid: int, uid: int, gid: int) -> set[int]:
    """The peer's primary and supplementary groups, from the kernel's record of the connection
    (SO_PEERGROUPS); on older kernels /proc/PID/status, trusted only while its uid is still the peer's
    (a pid reused by another process must not lend its groups), else the group database."""
    groups = {gid}
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * 256)
        groups.update(struct.unpack(f"{len(raw) // 4}I", raw))
        return groups
    except OSError:
        pass
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid:
            groups.update(int(g) for g in fields.get("Groups", "").split())
            return groups
    except (OSError, ValueError, KeyError):
        pass
    try:
        groups.update(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
    except (KeyError, OSError):
        pass
    return groups


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


# ---------------------------------------------------------------- the service


@record
class Conn:
    sock: socket.socket
    pid: int
    uid: int
    last: float
    id: int = 0  # never reused (a file descriptor is): the owner of what this client set
    privileged: bool = False  # root (or the reader's own user): no limits
    can_set: bool = False  # root, or a member of the control group
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)


@record
class Pace:
    """One user's last fresh reading and last change: the limits hold per user, however many connections."""
    read_at: float = -1e18
    reading: dict[str, Any] | None = None
    set_at: float = -1e18


class Server:
    def __init__(self, listener: socket.socket, read_zones: Callable[[], dict[str, Any]], knobs: list[Knob],
                 gid: int | None, *, control_gid: int | None = None, max_connections: int = MAX_CONNECTIONS,
                 max_per_uid: int = MAX_PER_UID, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 read_interval_s: float = READ_INTERVAL_S, energy_resolution_uj: int = ENERGY_RESOLUTION_UJ,
                 set_interval_s: float = SET_INTERVAL_S, log: Log | None = None) -> None:
        self.listener = listener
        self.read_zones = read_zones
        self.knobs = {k.name: k for k in knobs}
        self.keeper = Keeper(respawn=True)  # its own process: a kill -9 of the reader still restores what clients set
        self.gid = gid
        self.control_gid = control_gid
        self.read_interval_s = read_interval_s
        self.energy_resolution_uj = max(1, int(energy_resolution_uj))
        self.set_interval_s = set_interval_s
        self.pace: dict[int, Pace] = {}
        self._next_id = 0
        self.max_connections = max_connections
        self.max_per_uid = max_per_uid
        self.idle_timeout_s = idle_timeout_s
        self.log = log or Log()
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ, None)
        self.conns: dict[int, Conn] = {}
        self.per_uid: dict[int, int] = {}
        self.stopping = False
        self.closed = False

    def grants(self, conn: socket.socket, pid: int, uid: int, gid: int) -> tuple[bool, bool]:
        """(may connect and read, may set knobs): root and the reader's own user both; the read group reads,
        the control group reads and sets."""
        if uid == 0 or uid == os.geteuid():
            return True, True
        if self.gid is None and self.control_gid is None:
            return False, False
        groups = peer_groups(conn, pid, uid, gid)
        control = self.control_gid is not None and self.control_gid in groups
        return control or (self.gid is not None and self.gid in groups), control

    def allowed(self, conn: socket.socket, pid: int, uid: int, gid: int) -> bool:
        return self.grants(conn, pid, uid, gid)[0]

    def serve_forever(self, poll_s: float = 0.2) -> None:
        try:
            while not self.stopping:
                for key, events in self.sel.select(timeout=poll_s):
                    if key.data is None:
                        self._accept()
                    else:
                        self._service(key.data, events)
                self._expire()
        finally:
            self.close()

    def _accept(self) -> None:
        # Drain the backlog each time: connections over a cap are accepted and closed at once, so a
        # flood cannot leave the listener readable forever (the old reader's 100% CPU accept loop).
        for _ in range(64):
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: never the end of the service
                if exc.errno == errno.ECONNABORTED:
                    continue
                self.log(f"accept failed ({exc.strerror})", "accept")
                return
            try:
                pid, uid, gid = peer_credentials(conn)
            except OSError:
                conn.close()
                continue
            may_read, may_set = self.grants(conn, pid, uid, gid)
            if not may_read:
                self.log(f"refused {_user(uid)} (pid {pid}): not root and not in the served group", "peer")
                conn.close()  # nothing said: the refusal is the closed connection
                continue
            if len(self.conns) >= self.max_connections or self.per_uid.get(uid, 0) >= self.max_per_uid:
                self.log(f"refused {_user(uid)} (pid {pid}): connection limit "
                         f"({len(self.conns)}/{self.max_connections} in all, "
                         f"{self.per_uid.get(uid, 0)}/{self.max_per_uid} for this user)", "limit")
                conn.close()
                continue
            conn.setblocking(False)
            self._next_id += 1
            c = Conn(conn, pid, uid, time.monotonic(), id=self._next_id, privileged=uid in (0, os.geteuid()),
                     can_set=may_set)
            self.conns[conn.fileno()] = c
            self.per_uid[uid] = self.per_uid.get(uid, 0) + 1
            self.sel.register(conn, selectors.EVENT_READ, c)

    def _service(self, c: Conn, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush(c)
            if c.sock.fileno() < 0:
                return
        if not events & selectors.EVENT_READ:
            return
        try:
            data = c.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(c)
            return
        c.last = time.monotonic()
        c.inbuf += data
        while b"\n" in c.inbuf:
            line, _, rest = bytes(c.inbuf).partition(b"\n")
            c.inbuf = bytearray(rest)
            try:
                req = protocol.parse(line + b"\n")
            except protocol.BadRequest as exc:
                self.log(f"closed {_user(c.uid)} (pid {c.pid}): {exc}", "grammar")
                self._drop(c)
                return
            c.outbuf += protocol.reply(self._answer(c, req))
        if len(c.inbuf) >= protocol.MAX_LINE:
            self.log(f"closed {_user(c.uid)} (pid {c.pid}): request longer than {protocol.MAX_LINE} bytes", "grammar")
            self._drop(c)
            return
        if len(c.outbuf) > MAX_PENDING_REPLY:
            self.log(f"closed {_user(c.uid)} (pid {c.pid}): does not read its replies")
            self._drop(c)
            return
        self._flush(c)

    def _flush(self, c: Conn) -> None:
        if c.outbuf:
            try:
                sent = c.sock.send(c.outbuf)
                del c.outbuf[:sent]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._drop(c)
                return
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if c.outbuf else 0)
        self.sel.modify(c.sock, want, c)

    def _answer(self, c: Conn, req: protocol.Request) -> dict[str, Any]:
        if req.verb == "read":
            return self._read(c)
        if req.verb == "knobs":
            return {"knobs": [self._describe(k) for k in self.knobs.values()]}
        knob = self.knobs.get(req.name or "")
        if knob is None:
            self.log(f"refused {_user(c.uid)} (pid {c.pid}): {req.verb} of unknown knob {req.name}")
            return {"error": f"no knob named {req.name}"}
        if not c.can_set:
            self.log(f"refused {_user(c.uid)} (pid {c.pid}): {req.verb} {knob.name}: not in the control group", "scope")
            who = "root and the control group" if self.control_gid is not None else "root only (no --control-group)"
            return {"error": f"{knob.name}: this user may read but not set knobs (set by {who})"}
        now, pace = time.monotonic(), self.pace.setdefault(c.uid, Pace())
        if not c.privileged and now - pace.set_at < self.set_interval_s:
            self.log(f"refused {_user(c.uid)} (pid {c.pid}): {req.verb} {knob.name}: too soon", "rate")
            return {"error": f"{knob.name}: at most one change per {self.set_interval_s:g} s for this user"}
        pace.set_at = now
        try:
            if req.verb == "set":
                assert req.value is not None
                self.keeper.set(knob, req.value, owner=c.id)
                self.log(f"{_user(c.uid)} (pid {c.pid}) set {knob.name} to {req.value:g} {knob.unit}")
            else:
                for line in self.keeper.restore(owner=c.id, knob=knob):
                    self.log(f"could not restore {line}")
            return {"ok": knob.name, "value": knob.read()}
        except (KnobError, OSError) as exc:
            self.log(f"refused {_user(c.uid)} (pid {c.pid}): {exc}")
            return {"error": str(exc) if isinstance(exc, KnobError) else f"{knob.name} could not be changed"}

    def _read(self, c: Conn) -> dict[str, Any]:
        """The counters; for clients other than root, at most one fresh reading per read_interval_s (sooner:
        the same reading again; per user) and each counter rounded down to energy_resolution_uj."""
        if c.privileged:
            return self.read_zones()
        now, pace = time.monotonic(), self.pace.setdefault(c.uid, Pace())
        if pace.reading is not None and now - pace.read_at < self.read_interval_s:
            return pace.reading
        res = self.energy_resolution_uj
        got = self.read_zones()
        zones = [{**z, "energy_uj": int(z["energy_uj"]) // res * res} for z in got.get("zones", [])]
        pace.reading, pace.read_at = {"zones": zones, "period_s": self.read_interval_s, "resolution_uj": res}, now
        return pace.reading

    @staticmethod
    def _describe(k: Knob) -> dict[str, Any]:
        try:
            rng = k.range()
            value: float | None = k.read()
        except (KnobError, OSError) as exc:
            return {"name": k.name, "unit": k.unit, "error": str(exc)}
        return {"name": k.name, "value": value, "low": rng.low, "high": rng.high, "step": rng.step,
                "choices": list(rng.choices), "unit": k.unit}

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.idle_timeout_s
        for c in [c for c in self.conns.values() if c.last < cutoff]:
            self.log(f"closed {_user(c.uid)} (pid {c.pid}): idle for {self.idle_timeout_s:g} s", "idle")
            self._drop(c)

    def _drop(self, c: Conn) -> None:
        fd = c.sock.fileno()
        if fd < 0 or self.conns.get(fd) is not c:
            return
        changed = self.keeper.holds(c.id)
        for line in self.keeper.restore(owner=c.id):  # a client that disconnects or dies gives its knobs back
            self.log(f"could not restore {line}")
        # A part that could not be put back is let go, left as it is now: held under a client that is gone,
        # it would refuse every other client until the reader restarts.
        stuck = self.keeper.release(c.id)
        if stuck:
            self.log(f"released {', '.join(stuck)} of {_user(c.uid)} (pid {c.pid}), left at its value now:"
                     " it could not be restored")
        if changed and not c.privileged:  # the restore is a change too: set, leave, come back is no faster
            self.pace.setdefault(c.uid, Pace()).set_at = time.monotonic()
        self.sel.unregister(c.sock)
        del self.conns[fd]
        self.per_uid[c.uid] -= 1
        if not self.per_uid[c.uid]:
            del self.per_uid[c.uid]
        c.sock.close()

    def stop(self) -> None:
        self.stopping = True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for c in list(self.conns.values()):
            self._drop(c)
        self.keeper.close()  # also knobs set by a client whose drop was cut short; then its process goes
        try:
            self.sel.unregister(self.listener)
        except (KeyError, ValueError):
            pass
        self.sel.close()
        self.listener.close()


# ---------------------------------------------------------------- put together


def rapl_reader(powercap_root: str | None) -> tuple[Callable[[], dict[str, Any]], list[str]]:
    """The `read` answer (powercap's counters, discovered by root now) and the zones' names."""
    from ..collect.sensors import rapl

    zones = rapl.discover(powercap_root).sensors

    def read() -> dict[str, Any]:
        out = []
        for z in zones:
            try:
                uj = rapl.read_counter(z.path)
            except (OSError, ValueError):
                continue
            out.append({"id": z.id, "component": z.component, "domain": z.detail.get("domain"), "energy_uj": uj,
                        "max_energy_range_uj": z.detail.get("max_energy_range_uj")})
        return {"zones": out}

    return read, [f"{z.id} ({z.detail.get('domain')})" for z in zones]


class Reader:
    """The bound (or inherited) reader; close() restores the knobs and removes a socket it made."""

    def __init__(self, path: str, powercap_root: str | None, group: str | None, knobs: list[Knob],
                 control_group: str | None = None, **limits: Any) -> None:
        gid, control_gid = group_gid(group), group_gid(control_group)
        read, self.zones = rapl_reader(powercap_root)
        if not self.zones and not knobs:
            raise ServeError("nothing to serve: no readable RAPL counter and no knob")
        self.path = path
        self._dir_fd: int | None = None
        listener = inherited_socket()
        self.activated = listener is not None
        if listener is None:
            # the socket is the read group's (control members need it too), or the control group's alone
            listener, self._dir_fd = bind(path, gid if gid is not None else control_gid)
        self.server = Server(listener, read, knobs, gid, control_gid=control_gid, **limits)

    def serve_forever(self) -> None:
        try:
            self.server.serve_forever()
        finally:
            self.close()

    def close(self) -> None:
        self.server.close()
        if self._dir_fd is not None:
            try:
                name = os.path.basename(self.path)
                if stat.S_ISSOCK(os.lstat(name, dir_fd=self._dir_fd).st_mode):
                    os.unlink(name, dir_fd=self._dir_fd)
            except OSError:
                pass
            os.close(self._dir_fd)
            self._dir_fd = None
