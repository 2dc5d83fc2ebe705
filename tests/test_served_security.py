"""The privileged reader attacked the way a local user would: as root, with a throwaway user and group.

Clients run as other users in real subprocesses (stdlib-only scripts, so that any world-readable
python serves them); the reader runs as root in a subprocess; the knob is a test-local Knob writing a
tmp file (the faked hardware). Timeouts here are hang guards, not measurements.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("groupadd"),
    reason="needs root and useradd/groupadd: the tests make a throwaway user and group and run the reader as root")

SERVER = textwrap.dedent("""
    import grp, os, signal, socket, sys
    from energyprof.knobs.base import Knob, KnobRange
    from energyprof.serve import server

    class FileKnob(Knob):
        kind, unit = "test_power_limit", "W"

        def __init__(self, path):
            super().__init__("0")
            self.path = path

        def read(self):
            return float(open(self.path).read())

        def range(self):
            return KnobRange(100.0, 300.0)

        def _write(self, value):
            with open(self.path, "w") as f:
                f.write(f"{value:g}\\n")

    mode, sock, pc, group, knobfile, idle = sys.argv[1:]
    knobs = [FileKnob(knobfile)]
    if mode == "gpu":  # a simulated A40 behind a stand-in NVML binding, found by the knob registry
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(server.__file__)), "..", "tests"))
        from sim_gpu import FakeNvml, SimGpu, load_table
        from energyprof.knobs.registry import discover
        knobs = discover(nvml=FakeNvml([SimGpu(load_table())]), kinds=("gpu_power_limit",))
        mode = "reader"
    if mode == "reader":
        reader = server.Reader(sock, pc, group, knobs, idle_timeout_s=float(idle))
        srv, run = reader.server, reader.serve_forever
    else:  # a misconfigured socket (0666 in an open folder): the peer check alone must still refuse
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        os.umask(0)
        listener.bind(sock)
        listener.listen(64)
        listener.setblocking(False)
        read, _ = server.rapl_reader(pc)
        srv = server.Server(listener, read, knobs, grp.getgrnam(group).gr_gid, idle_timeout_s=float(idle))
        run = srv.serve_forever
    signal.signal(signal.SIGTERM, lambda *a: srv.stop())
    print("ready", flush=True)
    run()
""")

# One request per connection, as another user: prints the reply line, or CLOSED / REFUSED <errno>.
ASK = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(sys.argv[1])
    except OSError as exc:
        print("REFUSED", exc.errno); sys.exit(0)
    f = s.makefile("rwb")
    for req in sys.argv[2:]:
        try:
            f.write(req.encode() + b"\\n"); f.flush()
            line = f.readline()
        except OSError:
            line = b""
        print(line.decode().strip() or "CLOSED", flush=True)
""")


def _make_zone(root: Path, name: str, label: str, energy_uj: int = 1000) -> Path:
    z = root / name
    z.mkdir(parents=True)
    (z / "name").write_text(label + "\n")
    (z / "energy_uj").write_text(f"{energy_uj}\n")
    (z / "max_energy_range_uj").write_text("262143328850\n")
    return z


@pytest.fixture(scope="module")
def accounts():
    tag = uuid.uuid4().hex[:6]
    group, member, outsider = f"epg{tag}", f"epm{tag}", f"epo{tag}"
    made = []
    try:
        subprocess.run(["groupadd", group], check=True, capture_output=True)
        made.append(("groupdel", group))
        for user, extra in ((member, ["-G", group]), (outsider, [])):
            subprocess.run(["useradd", "-M", "-N", "-s", "/bin/false", *extra, user], check=True, capture_output=True)
            made.insert(0, ("userdel", user))
        python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable)
                       if os.path.exists(p) and _as(outsider, [p, "-c", "pass"]).returncode == 0), None)
        if python is None:
            pytest.skip("no python that the throwaway user may run")
        yield {"group": group, "gid": grp.getgrnam(group).gr_gid, "member": member, "outsider": outsider,
               "python": python}
    finally:
        for cmd, name in made:
            subprocess.run([cmd, name], capture_output=True)


def _ids(user: str) -> tuple[int, int, list[int]]:
    pw = pwd.getpwnam(user)
    return pw.pw_uid, pw.pw_gid, os.getgrouplist(user, pw.pw_gid)


def _as(user: str, cmd: list[str], **kw) -> subprocess.CompletedProcess:
    uid, gid, groups = _ids(user)
    return subprocess.run(cmd, user=uid, group=gid, extra_groups=groups, capture_output=True, text=True,
                          timeout=kw.pop("timeout", 60), cwd="/", **kw)


def _popen_as(user: str, cmd: list[str], **kw) -> subprocess.Popen:
    uid, gid, groups = _ids(user)
    return subprocess.Popen(cmd, user=uid, group=gid, extra_groups=groups, cwd="/", **kw)


def _ask(accounts, user: str, sock: Path, *requests: str) -> list[str]:
    done = _as(accounts[user], [accounts["python"], "-c", ASK, str(sock), *requests])
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


@pytest.fixture
def base():
    # Like /tmp: a sticky world-writable parent for the socket folders, reachable by the throwaway users.
    d = Path(tempfile.mkdtemp(prefix="ep-sec-"))
    os.chmod(d, 0o1777)
    (d / "pc").mkdir()
    _make_zone(d / "pc", "intel-rapl:0", "package-0")
    (d / "knob").write_text("200\n")
    os.chmod(d / "knob", 0o600)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Reader:
    def __init__(self, mode: str, sock: Path, base: Path, group: str, idle: float = 10.0) -> None:
        self.log = open(base / f"reader-{uuid.uuid4().hex[:4]}.log", "w+")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, mode, str(sock), str(base / "pc"), group,
                                      str(base / "knob"), str(idle)], stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env=env)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.stop()
            raise AssertionError(f"the reader did not start: {self.text()}")

    def status(self, field: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    def text(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
        self.log.close()


def _wait_for(cond, guard_s: float = 10.0) -> bool:
    end = time.monotonic() + guard_s  # hang guard only
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# ---------------------------------------------------------------- the folder and the socket path


def _serve_cli(sock: Path, base: Path, group: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "energyprof", "sensors", "serve", "--socket", str(sock), "--group", group,
                           "--powercap-root", str(base / "pc"), *extra], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_foreign_owned_or_symlinked_folder_is_refused(accounts, base):
    folder = base / "foreign"
    folder.mkdir()
    os.chown(folder, pwd.getpwnam(accounts["outsider"]).pw_uid, -1)
    done = _serve_cli(folder / "rapl.sock", base, accounts["group"])
    assert done.returncode == 2 and "owned by " + accounts["outsider"] in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (folder / "rapl.sock").exists()

    (base / "real").mkdir(mode=0o755)
    (base / "link").symlink_to(base / "real")
    done = _serve_cli(base / "link" / "rapl.sock", base, accounts["group"])
    assert done.returncode == 2 and "symlink" in done.stderr and not (base / "real" / "rapl.sock").exists()

    (base / "open").mkdir()
    os.chmod(base / "open", 0o777)
    done = _serve_cli(base / "open" / "rapl.sock", base, accounts["group"])
    assert done.returncode == 2 and "writable by others" in done.stderr


def test_a_symlink_at_the_socket_path_is_never_followed(accounts, base):
    target = base / "secret"
    target.write_text("root only\n")
    os.chmod(target, 0o640)
    folder = base / "run"
    folder.mkdir(mode=0o750)
    (folder / "rapl.sock").symlink_to(target)
    before = os.stat(target)
    done = _serve_cli(folder / "rapl.sock", base, accounts["group"])
    assert done.returncode == 2 and "not a socket" in done.stderr
    after = os.stat(target)
    assert (after.st_mode, after.st_uid, after.st_gid) == (before.st_mode, before.st_uid, before.st_gid)
    assert (folder / "rapl.sock").is_symlink() and target.read_text() == "root only\n"


def test_the_socket_folder_race_changes_no_file(accounts, base):
    """100 starts of the reader beside a user who races symlinks to a 0640 root file into its folder."""
    from energyprof.serve import server

    target = base / "shadow"
    target.write_text("root:x:0\n")
    os.chmod(target, 0o640)
    before = os.stat(target)
    folder = base / "energyprof"
    race = textwrap.dedent(f"""
        import os, stat, time
        folder, target = {str(folder)!r}, {str(target)!r}
        sock = folder + "/rapl.sock"
        end = time.monotonic() + 30
        swaps = 0
        print("ready", flush=True)
        while time.monotonic() < end and not os.path.exists(folder + ".stop"):
            for step in (lambda: os.mkdir(folder, 0o777), lambda: os.symlink(target, folder + "/l"),
                         lambda: os.unlink(sock), lambda: os.symlink(target, sock)):
                try:
                    step()
                except OSError:
                    pass
            try:  # the old reader's hole: a link renamed over the fresh socket between bind() and chown()
                if stat.S_ISSOCK(os.lstat(sock).st_mode):
                    os.rename(folder + "/l", sock)
                    swaps += 1
            except OSError:
                pass
        print(swaps, flush=True)
    """)
    racer = _popen_as(accounts["outsider"], [accounts["python"], "-c", race], stdout=subprocess.PIPE, text=True)
    assert racer.stdout.readline().strip() == "ready"  # the race is on before the first start
    outcomes = {"served": 0, "refused": 0}
    try:
        for _ in range(100):
            try:
                reader = server.Reader(str(folder / "rapl.sock"), str(base / "pc"), accounts["group"], [])
            except (ValueError, OSError):
                outcomes["refused"] += 1
            else:
                outcomes["served"] += 1
                st = os.lstat(folder / "rapl.sock")
                assert stat.S_ISSOCK(st.st_mode) and st.st_uid == 0 and st.st_gid == accounts["gid"]
                assert (st.st_mode & 0o777) == 0o660
                reader.close()
            # hand the folder back to the race: root removes whatever is there
            # (the racer may recreate it at once: that is the race)
            if folder.is_symlink():
                folder.unlink(missing_ok=True)
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        (base / "energyprof.stop").touch()
        swaps = racer.stdout.readline().strip()
        racer.wait(timeout=60)
    after = os.stat(target)
    assert (after.st_mode, after.st_uid, after.st_gid) == (before.st_mode, before.st_uid, before.st_gid)
    assert target.read_text() == "root:x:0\n"
    assert outcomes["served"] + outcomes["refused"] == 100
    print(f"race: {outcomes}, sockets swapped for a link by the racer: {swaps}")


def test_check_changes_nothing(accounts, base):
    sock = base / "new" / "rapl.sock"
    done = _serve_cli(sock, base, accounts["group"], "--check")
    assert done.returncode == 0, done.stderr
    assert "would be created, mode 0750" in done.stdout and accounts["member"] in done.stdout
    assert "cpu (package-0)" in done.stdout and not (base / "new").exists()
    done = _serve_cli(sock, base, "no-such-group-here", "--check")
    assert done.returncode == 2 and "no group named" in done.stderr and not (base / "new").exists()


# ---------------------------------------------------------------- who is served


def test_a_user_outside_the_group_is_refused(accounts, base):
    # The real reader's socket is 0660 root:GROUP in a 0750 folder: the outsider cannot even reach it.
    sock = base / "run" / "rapl.sock"
    reader = Reader("reader", sock, base, accounts["group"])
    try:
        assert _ask(accounts, "outsider", sock, "read")[0].startswith("REFUSED")
        assert '"zones"' in _ask(accounts, "member", sock, "read")[0]  # a member through a supplementary group
    finally:
        reader.stop()
    # A socket left open to everyone: the peer check alone refuses, and says nothing.
    sock = base / "open.sock"
    reader = Reader("open", sock, base, accounts["group"])
    try:
        assert _ask(accounts, "outsider", sock, "read", "knobs") == ["CLOSED", "CLOSED"]
        assert "refused " + accounts["outsider"] in reader.text()
    finally:
        reader.stop()


# ---------------------------------------------------------------- one client cannot deny service to another

FLOOD = textwrap.dedent("""
    import os, resource, socket, sys, threading, time
    path = sys.argv[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held = []
    def endless():
        s = socket.socket(socket.AF_UNIX); s.connect(path)
        try:
            s.sendall(b"x" * (8 << 20))  # 8 MB, no newline
        except OSError:
            pass
    def garbage():
        s = socket.socket(socket.AF_UNIX); s.connect(path)
        try:
            s.sendall(bytes(range(256)) * 64 + b"\\n")
        except OSError:
            pass
    def slow():
        s = socket.socket(socket.AF_UNIX); s.connect(path); held.append(s)
        try:
            for b in b"rea":
                s.send(bytes([b])); time.sleep(0.3)
        except OSError:
            pass
    threads = [threading.Thread(target=f) for f in (endless, garbage, slow, slow, slow)]
    for t in threads:
        t.start()
    opened = 0
    for _ in range(2000):
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(path); opened += 1
        except OSError:
            pass
        held.append(s)
    for t in threads:
        t.join()
    print(opened, flush=True)
    sys.stdin.readline()  # hold every connection until told
""")


def test_a_flood_leaves_the_reader_answering_others(accounts, base):
    sock = base / "open.sock"
    reader = Reader("open", sock, base, accounts["group"])
    flood = None
    try:
        rss_before = reader.status("VmRSS")
        flood = _popen_as(accounts["member"], [accounts["python"], "-c", FLOOD, str(sock)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        answered = []

        def legit() -> None:
            # Another client (root) asks while the flood runs: the reader's 1 s service bound is this
            # socket's timeout, a hang guard.
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(1.0)
            s.connect(str(sock))
            f = s.makefile("rwb")
            f.write(b"read\n")
            f.flush()
            answered.append(f.readline())
            s.close()

        deadline = time.monotonic() + 30  # hang guard for the flood's own start
        while flood.poll() is None and time.monotonic() < deadline:
            legit()
            if len(answered) >= 20:
                break
        opened = flood.stdout.readline()  # the flood has made its 2,000 attempts
        legit()
        assert opened.strip(), flood.stderr.read()
        assert all(b'"zones"' in a for a in answered) and len(answered) >= 2
        assert reader.status("Threads") == 1
        rss_growth_kb = reader.status("VmRSS") - rss_before
        assert rss_growth_kb < 16 * 1024, rss_growth_kb  # an 8 MB line is never held
        log = reader.text()
        assert "connection limit" in log and "longer than 256 bytes" in log
        print(f"flood: {opened.strip()} connects accepted by the kernel, {len(answered)} answers to the other client, "
              f"RSS growth {rss_growth_kb} kB")
    finally:
        if flood is not None:
            flood.kill()
            flood.wait(timeout=10)
        reader.stop()


def test_idle_connections_are_closed(accounts, base):
    sock = base / "open.sock"
    reader = Reader("open", sock, base, accounts["group"], idle=0.3)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)  # hang guard: the reader closes it after 0.3 s idle
        s.connect(str(sock))
        assert s.recv(1) == b""
        assert "idle for 0.3 s" in reader.text()
    finally:
        reader.stop()


# ---------------------------------------------------------------- knobs

KNOB = "test_power_limit:0"
HOLD = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rwb")
    f.write(sys.argv[2].encode() + b"\\n"); f.flush()
    print(f.readline().decode().strip(), flush=True)
    sys.stdin.readline()
""")


def test_a_member_sets_a_gpu_power_limit_within_range_through_the_reader(accounts, base):
    """Issue 26's promise through the reader: the GPU's limit, found by the knob registry (a simulated
    A40 behind a stand-in NVML binding), set within 100-300 W by a member, restored when they leave;
    out of range, a path, or an outsider refused."""
    sock = base / "run" / "rapl.sock"
    reader = Reader("gpu", sock, base, accounts["group"])
    try:
        listed, set_ok, read_back, too_low = _ask(accounts, "member", sock, "knobs", "set gpu_power_limit:0 200",
                                                   "knobs", "set gpu_power_limit:0 50")
        assert '"name":"gpu_power_limit:0","value":300.0,"low":100.0,"high":300.0' in listed
        assert set_ok == '{"ok":"gpu_power_limit:0","value":200.0}' and '"value":200.0' in read_back
        assert "outside its range" in too_low
        assert _wait_for(lambda: '"value":300.0' in _ask(accounts, "member", sock, "knobs")[0])  # restored
        assert _ask(accounts, "member", sock, "set /dev/nvidia0 1") == ["CLOSED"]
        assert _ask(accounts, "outsider", sock, "set gpu_power_limit:0 200")[0] in ("CLOSED", "REFUSED 13")
        assert "gpu_power_limit:0" in reader.text() and "refused" in reader.text().lower()
    finally:
        reader.stop() if not reader.log.closed else None


def test_knobs_within_range_for_members_and_restored_on_disconnect(accounts, base):
    sock = base / "run" / "rapl.sock"
    knob = base / "knob"
    reader = Reader("reader", sock, base, accounts["group"])
    try:
        listed, set_ok, read_back, too_high, unknown = _ask(
            accounts, "member", sock, "knobs", f"set {KNOB} 250", "knobs", f"set {KNOB} 999", "set no_such:0 1")
        assert '"name":"test_power_limit:0","value":200.0,"low":100.0,"high":300.0' in listed and '"unit":"W"' in listed
        assert set_ok == '{"ok":"test_power_limit:0","value":250.0}' and '"value":250.0' in read_back
        assert "outside its range" in too_high and "no knob named no_such:0" in unknown
        assert _wait_for(lambda: knob.read_text() == "200\n")  # the client disconnected: restored
        assert _ask(accounts, "member", sock, "set ../../etc/passwd 1") == ["CLOSED"]  # not in the grammar

        held = _popen_as(accounts["member"], [accounts["python"], "-c", HOLD, str(sock), f"set {KNOB} 150"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert '"value":150.0' in held.stdout.readline() and knob.read_text() == "150\n"
        assert "another client" in _ask(accounts, "member", sock, f"set {KNOB} 120")[0]
        held.kill()  # SIGKILL: the reader sees the connection end and restores
        held.wait(timeout=10)
        assert _wait_for(lambda: knob.read_text() == "200\n")

        held = _popen_as(accounts["member"], [accounts["python"], "-c", HOLD, str(sock), f"set {KNOB} 300"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert '"value":300.0' in held.stdout.readline() and knob.read_text() == "300\n"
        reader.stop()  # SIGTERM with a knob still set: restored on the way out, socket removed
        assert knob.read_text() == "200\n" and not sock.exists()
        held.kill()
        held.wait(timeout=10)
    finally:
        reader.stop() if not reader.log.closed else None
