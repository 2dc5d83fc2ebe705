"""The privileged reader as an attacker on the same machine would try it, with real users and groups.

Run as root (the suite's CI runs as root): each test makes a throwaway group with two members and one
outsider, and removes them after. Not root: skipped, and said.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from energyprof.collect.sensors import served
from energyprof.knobs.base import Knob, KnobRange
from energyprof.serve import protocol
from energyprof.serve import server as srv
from test_sensors import make_zone

# The users' clients need a Python they may run: the system's (a pyenv build in root's home is not theirs).
USER_PYTHON = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd") or USER_PYTHON is None,
                                reason="needs root, useradd and a system python3: the reader is a root service, "
                                       "tried against real users")


class Accounts:
    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.group = f"eptest{tag}"
        self.members = [f"epa{tag}", f"epc{tag}"]
        self.outsider = f"epb{tag}"

    def create(self) -> None:
        subprocess.run(["groupadd", self.group], check=True)
        for user in self.members:
            subprocess.run(["useradd", "-M", "-N", "-g", "nogroup", "-G", self.group, "-s", "/usr/sbin/nologin", user],
                           check=True)
        subprocess.run(["useradd", "-M", "-N", "-g", "nogroup", "-s", "/usr/sbin/nologin", self.outsider], check=True)

    def remove(self) -> None:
        for user in [*self.members, self.outsider]:
            subprocess.run(["userdel", user], capture_output=True)
        subprocess.run(["groupdel", self.group], capture_output=True)

    @property
    def gid(self) -> int:
        import grp

        return grp.getgrnam(self.group).gr_gid


@pytest.fixture(scope="module")
def accounts() -> Iterator[Accounts]:
    acc = Accounts()
    acc.create()
    try:
        yield acc
    finally:
        acc.remove()


def as_user(user: str, nofile: int | None = None):  # noqa: ANN201 - a preexec_fn
    import pwd
    import resource

    pw = pwd.getpwnam(user)
    groups = os.getgrouplist(user, pw.pw_gid)

    def drop() -> None:
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        os.setgroups(groups)
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    return drop


def user_python(user: str, code: str, *args: str, nofile: int | None = None, **kw) -> subprocess.Popen:
    """A Python process of `user`'s (stdlib only: the client speaks the wire itself)."""
    return subprocess.Popen([USER_PYTHON, "-I", "-c", textwrap.dedent(code), *args], preexec_fn=as_user(user, nofile),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/", **kw)


ASK = """
    import socket, sys
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(sys.argv[1])
    try:
        s.sendall(sys.argv[2].encode() + b"\\n")
        print(s.makefile("rb").readline().decode().strip() or "<closed>")
    except (BrokenPipeError, ConnectionResetError):
        print("<closed>")
"""


def ask(user: str, sock: Path, line: str) -> str:
    proc = user_python(user, ASK, str(sock), line)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out.strip()


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder of root's that every user may pass through (pytest's own is root's alone, 0700)."""
    d = Path(tempfile.mkdtemp(prefix="ep-serve-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def root_dir(open_tmp: Path) -> Path:
    """A folder only root can change, that every user can pass through (the users' clients reach the socket)."""
    d = open_tmp / "srv"
    d.mkdir(mode=0o755)
    return d


@pytest.fixture
def powercap(tmp_path: Path) -> Path:
    root = tmp_path / "powercap"
    make_zone(root, "intel-rapl:0", "package-0", energy_uj=1000)
    return root


@pytest.fixture
def running(accounts: Accounts, root_dir: Path, powercap: Path) -> Iterator[tuple[subprocess.Popen, Path]]:
    """The reader as its users meet it: `energyprof sensors serve --group G`, as root."""
    sock = root_dir / "run" / "rapl.sock"
    proc = subprocess.Popen([sys.executable, "-m", "energyprof", "sensors", "serve", "--socket", str(sock),
                             "--powercap-root", str(powercap), "--group", accounts.group],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert "serving cpu (package-0)" in line, line + proc.stderr.read()
        yield proc, sock
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def fingerprint(path: Path) -> tuple[int, int, int, bytes]:
    st = os.lstat(path)
    return st.st_mode, st.st_uid, st.st_gid, path.read_bytes()


# ---------------------------------------------------------------- the socket's folder


def test_a_folder_another_user_owns_or_can_write_is_refused(accounts: Accounts, root_dir: Path, powercap: Path) -> None:
    import pwd

    theirs = root_dir / "theirs"
    theirs.mkdir()
    os.chown(theirs, pwd.getpwnam(accounts.members[0]).pw_uid, -1)
    writable = root_dir / "writable"
    writable.mkdir()
    writable.chmod(0o777)
    link = root_dir / "link"
    link.symlink_to(root_dir)
    for folder, said in ((theirs, "is owned by uid"), (writable, "writable by its group or others"),
                         (link, "symbolic link")):
        done = subprocess.run([sys.executable, "-m", "energyprof", "sensors", "serve", "--socket",
                               str(folder / "rapl.sock"), "--powercap-root", str(powercap), "--group", accounts.group],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert not os.path.lexists(folder / "rapl.sock")


def test_a_link_at_the_socket_path_is_never_followed(accounts: Accounts, root_dir: Path) -> None:
    target = root_dir / "secret"
    target.write_text("root's\n")
    target.chmod(0o640)
    before = fingerprint(target)
    (root_dir / "rapl.sock").symlink_to(target)
    with pytest.raises(srv.ServeError, match="not a socket"):
        srv.bind(str(root_dir / "rapl.sock"), accounts.gid)
    assert fingerprint(target) == before and (root_dir / "rapl.sock").is_symlink()


RACER = """
    import os, sys, time
    folder, target, stop = sys.argv[1], sys.argv[2], sys.argv[3]
    link = os.path.join(folder, "rapl.sock")
    while not os.path.exists(stop):
        try:
            os.mkdir(folder)  # first to the folder: then the reader must refuse it
        except OSError:
            pass
        try:  # a link swapped over the socket's name, as often as it can
            tmp = link + ".x"
            os.symlink(target, tmp)
            os.rename(tmp, link)
        except OSError:
            pass
"""


def test_the_socket_folder_race_never_changes_a_file(accounts: Accounts, open_tmp: Path) -> None:
    """A user races the reader for its folder (in a sticky, world-writable place like /tmp) and swaps
    links to a root file over the socket's name, 100 times: the file's group and mode never change."""
    tmp_path = open_tmp
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    vault = tmp_path / "vault"
    vault.mkdir(mode=0o755)
    target = vault / "shadow"
    target.write_text("root:x:0:0\n")
    target.chmod(0o640)
    before = fingerprint(target)
    folder = shared / "energyprof"
    stop = tmp_path / "stop"
    racer = user_python(accounts.members[0], RACER, str(folder), str(target), str(stop))
    outcomes = {"refused": 0, "served": 0}
    try:
        for _ in range(100):
            try:
                sock = srv.bind(str(folder / "rapl.sock"), accounts.gid)
            except srv.ServeError:
                outcomes["refused"] += 1
            else:
                outcomes["served"] += 1
                st = os.lstat(folder / "rapl.sock")
                assert stat.S_ISSOCK(st.st_mode) and st.st_gid == accounts.gid and st.st_uid == 0
                sock.close()
            assert fingerprint(target) == before
            for _ in range(1000):  # gone, so the racer may take it next time (it refills its own meanwhile)
                shutil.rmtree(folder, ignore_errors=True)
                if not os.path.lexists(folder):
                    break
    finally:
        stop.touch()
        racer.wait(timeout=60)
    assert fingerprint(target) == before
    assert outcomes["refused"] + outcomes["served"] == 100


# ---------------------------------------------------------------- who is served


def test_a_user_outside_the_group_is_refused(accounts: Accounts, running: tuple[subprocess.Popen, Path]) -> None:
    _, sock = running
    assert ask(accounts.members[0], sock, "read").startswith('{"zones":[{"id":"cpu"')
    st = os.stat(sock)
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == accounts.gid
    assert stat.S_IMODE(os.stat(sock.parent).st_mode) == 0o750 and os.stat(sock.parent).st_gid == accounts.gid
    # The outsider cannot even reach the socket (the folder is 0750 root:GROUP); with the folder opened
    # to everyone, the reader itself still closes on it, answering nothing.
    proc = user_python(accounts.outsider, ASK, str(sock), "read")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "Permission denied" in err
    os.chmod(sock.parent, 0o755)
    os.chmod(sock, 0o666)
    assert ask(accounts.outsider, sock, "read") == "<closed>"


# ---------------------------------------------------------------- one client cannot deny service

FLOOD = """
    import os, socket, sys, time
    path, n = sys.argv[1], int(sys.argv[2])
    held = []
    for i in range(n):
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(path)
        except (BlockingIOError, OSError):
            pass
        held.append(s)
    chunk = b"x" * 65536
    for i, s in enumerate(held[:40]):  # an endless line, binary garbage, a slow trickle
        try:
            if i % 3 == 0:
                for _ in range(64):
                    s.send(chunk)
            elif i % 3 == 1:
                s.send(bytes(range(256)) * 4)
            else:
                s.send(b"re")
        except OSError:
            pass
    print(len(held), flush=True)
    sys.stdin.readline()  # hold them until told
"""

CLIENT = """
    import json, socket, sys, time
    path, rounds = sys.argv[1], int(sys.argv[2])
    worst = 0.0
    for _ in range(rounds):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(1.0)  # the service bound the reader promises: an answer within 1 s
        t = time.monotonic()
        s.connect(path)
        s.sendall(b"read\\n")
        line = s.makefile("rb").readline()
        worst = max(worst, time.monotonic() - t)
        assert json.loads(line)["zones"], line
        s.close()
    print(worst)
"""


def status_of(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Threads", "VmRSS"):
            out[key] = int(value.split()[0])
    return out


def test_two_thousand_connections_and_an_endless_line_leave_others_served(
        accounts: Accounts, running: tuple[subprocess.Popen, Path]) -> None:
    proc, sock = running
    before = status_of(proc.pid)
    flood = user_python(accounts.members[0], FLOOD, str(sock), "2000", nofile=4096, stdin=subprocess.PIPE)
    try:
        assert flood.stdout.readline().strip() == "2000"  # type: ignore[union-attr]
        other = user_python(accounts.members[1], CLIENT, str(sock), "20")
        out, err = other.communicate(timeout=120)
        assert other.returncode == 0, err  # every read answered, each within its 1 s timeout
        during = status_of(proc.pid)
    finally:
        flood.stdin.write("\n")  # type: ignore[union-attr]
        flood.stdin.flush()  # type: ignore[union-attr]
        flood.communicate(timeout=60)
    assert during["Threads"] == before["Threads"] == 1  # one thread: no thread per connection
    # Memory: at most MAX_CONNECTIONS connections, each holding at most one request line.
    assert during["VmRSS"] - before["VmRSS"] < 16 * 1024, (before, during)


# ---------------------------------------------------------------- knobs


class FileKnob(Knob):
    """A power limit whose hardware is a file (the faked sysfs attribute)."""

    kind, unit = "cpu_power_limit", "W"

    def __init__(self, path: Path) -> None:
        super().__init__("0")
        self.path = path

    def read(self) -> float:
        return float(self.path.read_text())

    def range(self) -> KnobRange:
        return KnobRange(10.0, 95.0)

    def _write(self, value: float) -> None:
        self.path.write_text(f"{value:g}\n")


SETTER = """
    import json, socket, sys
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(sys.argv[1])
    f = s.makefile("rwb")
    for line in sys.argv[2:]:
        try:
            f.write(line.encode() + b"\\n"); f.flush()
            print(f.readline().decode().strip() or "<closed>", flush=True)
        except (BrokenPipeError, ConnectionResetError):
            print("<closed>", flush=True)
    if sys.stdin.readline() == "hold\\n":
        sys.stdin.readline()
"""


@pytest.fixture
def knob_reader(accounts: Accounts, root_dir: Path, tmp_path: Path) -> Iterator[tuple[Path, Path, list[str]]]:
    limit = tmp_path / "constraint_0_power_limit_uw"
    limit.write_text("65\n")
    sock_path = root_dir / "knobs" / "rapl.sock"
    listener = srv.bind(str(sock_path), accounts.gid)
    log: list[str] = []
    reader = srv.Reader(listener, accounts.gid, lambda: {"zones": []}, [FileKnob(limit)], log=log.append)
    thread = threading.Thread(target=reader.serve, daemon=True)
    thread.start()
    try:
        yield sock_path, limit, log
    finally:
        reader.stopping = True
        thread.join(timeout=30)


def run_setter(user: str, sock: Path, *lines: str) -> list[str]:
    proc = user_python(user, SETTER, str(sock), *lines, stdin=subprocess.PIPE)
    out, err = proc.communicate("\n", timeout=60)
    assert proc.returncode == 0, err
    return out.strip().splitlines()


def test_a_member_sets_a_knob_within_range_and_it_is_restored_when_they_leave(
        accounts: Accounts, knob_reader: tuple[Path, Path, list[str]]) -> None:
    sock, limit, log = knob_reader
    answers = run_setter(accounts.members[0], sock, "knobs", "set cpu_power_limit:0 40", "set cpu_power_limit:0 400",
                         "set gpu_power_limit:7 100")
    assert '"name":"cpu_power_limit:0"' in answers[0] and '"value":65.0' in answers[0]
    assert answers[1] == '{"ok":"cpu_power_limit:0","value":40.0}'
    assert "outside its range" in answers[2] and "no knob" in answers[3]
    assert any("set cpu_power_limit:0 400" in line for line in log) and any("no knob" in line for line in log)
    deadline = time.monotonic() + 30  # the reader restores once it sees the connection close
    while limit.read_text() != "65\n" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert limit.read_text() == "65\n"


def test_a_killed_client_s_knob_is_restored_and_an_outsider_cannot_set(
        accounts: Accounts, knob_reader: tuple[Path, Path, list[str]]) -> None:
    sock, limit, _ = knob_reader
    proc = user_python(accounts.members[0], SETTER, str(sock), "set cpu_power_limit:0 20", stdin=subprocess.PIPE)
    assert proc.stdout.readline().strip() == '{"ok":"cpu_power_limit:0","value":20.0}'  # type: ignore[union-attr]
    proc.stdin.write("hold\n")  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    assert limit.read_text() == "20\n"
    # Another member cannot take a knob that one client holds.
    assert "held by another client" in run_setter(accounts.members[1], sock, "set cpu_power_limit:0 30")[0]
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while limit.read_text() != "65\n" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert limit.read_text() == "65\n"
    os.chmod(sock.parent, 0o755)
    os.chmod(sock, 0o666)
    assert run_setter(accounts.outsider, sock, "set cpu_power_limit:0 30") == ["<closed>"]
    assert limit.read_text() == "65\n"


def test_the_grammar_refuses_everything_else() -> None:
    for bad in (b"read", b"READ\n", b"read extra\n", b"set cpu_power_limit:0 1e9\n", b"set ../../etc/shadow 1\n",
                b"set cpu_power_limit:0 nan\n", b"knobs\x00\n", b"r\xe9ad\n", b"read " + b"x" * 200 + b"\n"):
        with pytest.raises(protocol.ProtocolError):
            protocol.parse(bad)
    assert protocol.parse(b"set gpu_power_limit:0 212.5\n") == protocol.Request("set", "gpu_power_limit:0", 212.5)
    assert protocol.parse(protocol.request("restore", "cpu_max_freq:all")).verb == "restore"


def test_served_client_reads_and_sets_through_the_reader(knob_reader: tuple[Path, Path, list[str]]) -> None:
    sock, limit, _ = knob_reader
    client = served.ServedClient(str(sock))
    try:
        assert [k["name"] for k in client.knobs()] == ["cpu_power_limit:0"]
        client.set_knob("cpu_power_limit:0", 50)
        assert limit.read_text() == "50\n"
        client.restore_knob("cpu_power_limit:0")
        assert limit.read_text() == "65\n"
    finally:
        client.users = 1
        client.release()
