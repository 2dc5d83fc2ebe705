"""The privileged reader attacked the way a local user would: as root, with a throwaway user and group.

Clients run as other users in real subprocesses (stdlib-only scripts, so that any world-readable
python serves them); the reader runs as root in a subprocess; the knob is a test-local Knob writing a
tmp file (the faked hardware). Timeouts here are hang guards, not measurements.
"""

from __future__ import annotations

import grp
import io
import os
import pwd
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import types
import uuid
from pathlib import Path
from typing import Any

import pytest

import knob_trees
from energyprof.knobs.base import Knob, KnobError, KnobRange

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

    mode, sock, pc, group, knobfile, idle, control, read_s, res_uj, set_s = sys.argv[1:]
    control = None if control == "-" else control
    limits = dict(idle_timeout_s=float(idle), read_interval_s=float(read_s), energy_resolution_uj=int(res_uj),
                  set_interval_s=float(set_s))
    knobs = [FileKnob(knobfile)]
    if mode in ("gpu", "machine"):  # knobs found by the registry: a simulated A40 behind a stand-in NVML binding
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(server.__file__)), "..", "tests"))
        from sim_gpu import FakeNvml, SimGpu, load_table
        from energyprof.knobs.registry import discover
        if mode == "gpu":
            knobs = discover(nvml=FakeNvml([SimGpu(load_table())]), kinds=("gpu_power_limit",))
        else:  # fake powercap and cpufreq trees, and a GPU whose limit is a file: the keeper's process reaches all
            import sim_pynvml
            knobs = discover(powercap_root=pc, nvml=sim_pynvml)
        mode = "reader"
    if mode == "reader":
        reader = server.Reader(sock, pc, group, knobs, control_group=control, **limits)
        srv, run = reader.server, reader.serve_forever
    else:  # a misconfigured socket (0666 in an open folder): the peer check alone must still refuse
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        os.umask(0)
        listener.bind(sock)
        listener.listen(64)
        listener.setblocking(False)
        read, _ = server.rapl_reader(pc)
        srv = server.Server(listener, read, knobs, grp.getgrnam(group).gr_gid,
                            control_gid=grp.getgrnam(control).gr_gid if control else None, **limits)
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
    group, control, member, controller, outsider = f"epg{tag}", f"epc{tag}", f"epm{tag}", f"epk{tag}", f"epo{tag}"
    made = []
    try:
        for g in (group, control):
            subprocess.run(["groupadd", g], check=True, capture_output=True)
            made.append(("groupdel", g))
        for user, extra in ((member, ["-G", group]), (controller, ["-G", f"{group},{control}"]), (outsider, [])):
            subprocess.run(["useradd", "-M", "-N", "-s", "/bin/false", *extra, user], check=True, capture_output=True)
            made.insert(0, ("userdel", user))
        python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable)
                       if os.path.exists(p) and _as(outsider, [p, "-c", "pass"]).returncode == 0), None)
        if python is None:
            pytest.skip("no python that the throwaway user may run")
        yield {"group": group, "gid": grp.getgrnam(group).gr_gid, "member": member, "outsider": outsider,
               "control": control, "controller": controller, "python": python}
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
    def __init__(self, mode: str, sock: Path, base: Path, group: str, idle: float = 10.0, control: str | None = None,
                 read_s: float = 0.0, res_uj: int = 1, set_s: float = 0.0, env: dict[str, str] | None = None) -> None:
        self.log = open(base / f"reader-{uuid.uuid4().hex[:4]}.log", "w+")
        env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, mode, str(sock), str(base / "pc"), group,
                                      str(base / "knob"), str(idle), control or "-", str(read_s), str(res_uj),
                                      str(set_s)], stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
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
    A40 behind a stand-in NVML binding), set within 100-300 W by a member of the control group, restored
    when they leave; out of range, a path, a member of the read group only, or an outsider refused."""
    sock = base / "run" / "rapl.sock"
    reader = Reader("gpu", sock, base, accounts["group"], control=accounts["control"])
    try:
        assert "may read but not set" in _ask(accounts, "member", sock, "set gpu_power_limit:0 200")[0]
        listed, set_ok, read_back, too_low = _ask(accounts, "controller", sock, "knobs", "set gpu_power_limit:0 200",
                                                   "knobs", "set gpu_power_limit:0 50")
        assert '"name":"gpu_power_limit:0","value":300.0,"low":100.0,"high":300.0' in listed
        assert set_ok == '{"ok":"gpu_power_limit:0","value":200.0}' and '"value":200.0' in read_back
        assert "outside its range" in too_low
        assert _wait_for(lambda: '"value":300.0' in _ask(accounts, "member", sock, "knobs")[0])  # restored
        assert _ask(accounts, "controller", sock, "set /dev/nvidia0 1") == ["CLOSED"]
        assert _ask(accounts, "outsider", sock, "set gpu_power_limit:0 200")[0] in ("CLOSED", "REFUSED 13")
        assert "gpu_power_limit:0" in reader.text() and "refused" in reader.text().lower()
    finally:
        reader.stop() if not reader.log.closed else None


def test_knobs_within_range_for_members_and_restored_on_disconnect(accounts, base):
    sock = base / "run" / "rapl.sock"
    knob = base / "knob"
    reader = Reader("reader", sock, base, accounts["group"], control=accounts["control"])
    try:
        listed, set_ok, read_back, too_high, unknown = _ask(
            accounts, "controller", sock, "knobs", f"set {KNOB} 250", "knobs", f"set {KNOB} 999", "set no_such:0 1")
        assert '"name":"test_power_limit:0","value":200.0,"low":100.0,"high":300.0' in listed and '"unit":"W"' in listed
        assert set_ok == '{"ok":"test_power_limit:0","value":250.0}' and '"value":250.0' in read_back
        assert "outside its range" in too_high and "no knob named no_such:0" in unknown
        assert _wait_for(lambda: knob.read_text() == "200\n")  # the client disconnected: restored
        assert _ask(accounts, "controller", sock, "set ../../etc/passwd 1") == ["CLOSED"]  # not in the grammar

        held = _popen_as(accounts["controller"], [accounts["python"], "-c", HOLD, str(sock), f"set {KNOB} 150"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert '"value":150.0' in held.stdout.readline() and knob.read_text() == "150\n"
        assert "another client" in _ask(accounts, "controller", sock, f"set {KNOB} 120")[0]
        held.kill()  # SIGKILL: the reader sees the connection end and restores
        held.wait(timeout=10)
        assert _wait_for(lambda: knob.read_text() == "200\n")

        held = _popen_as(accounts["controller"], [accounts["python"], "-c", HOLD, str(sock), f"set {KNOB} 300"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert '"value":300.0' in held.stdout.readline() and knob.read_text() == "300\n"
        reader.stop()  # SIGTERM with a knob still set: restored on the way out, socket removed
        assert knob.read_text() == "200\n" and not sock.exists()
        held.kill()
        held.wait(timeout=10)
    finally:
        reader.stop() if not reader.log.closed else None


# ---------------------------------------------------------------- every knob comes back, whoever set it

# Several requests on one connection, each reply printed, then held open until told (or killed).
HOLD_MANY = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rwb")
    for req in sys.argv[2:]:
        f.write(req.encode() + b"\\n"); f.flush()
        print(f.readline().decode().strip(), flush=True)
    print("held", flush=True)
    sys.stdin.readline()
""")


def _machine(base: Path) -> dict[str, str]:
    """Fake powercap and cpufreq trees (root's files, as in /sys) and a simulated GPU whose limit is a file:
    every knob the registry finds, each reachable from the reader's keeper process."""
    zone = base / "pc" / "intel-rapl:0"
    (zone / "constraint_0_name").write_text("long_term\n")
    (zone / "constraint_0_power_limit_uw").write_text("65000000\n")
    (zone / "constraint_0_max_power_uw").write_text("125000000\n")
    knob_trees.cpufreq_tree(base / "cpu", cpus=2, cur=3_600_000)
    import sim_pynvml

    sim_pynvml.reset(300, str(base / "gpu-limit"))
    return {"ENERGYPROF_CPUFREQ_ROOT": str(base / "cpu"), "SIM_GPU_STATE": str(base / "gpu-limit")}


def _originals(base: Path) -> bool:
    import sim_pynvml

    return (knob_trees.max_freqs(base / "cpu") == [3_600_000, 3_600_000]
            and (base / "pc/intel-rapl:0/constraint_0_power_limit_uw").read_text().strip() == "65000000"
            and sim_pynvml.limit_w(str(base / "gpu-limit")) == 300)


def _hold(accounts, sock: Path, *requests: str) -> tuple[subprocess.Popen, list[str]]:
    held = _popen_as(accounts["controller"], [accounts["python"], "-c", HOLD_MANY, str(sock), *requests],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert held.stdout is not None
    replies = [held.stdout.readline().strip() for _ in requests]
    assert held.stdout.readline().strip() == "held", replies
    return held, replies


def test_overlapping_knobs_share_one_original_through_the_reader(accounts, base):
    """`cpu_max_freq:0` and `cpu_max_freq:all` write the same file: CPU 0 to 1 GHz, then all to 2 GHz, and
    leaving puts CPU 0 back at its 3.6 GHz (it stayed at 1 GHz), as does the reader's SIGTERM."""
    sock = base / "run" / "rapl.sock"
    env = _machine(base)
    reader = Reader("machine", sock, base, accounts["group"], control=accounts["control"], env=env)
    try:
        replies = _ask(accounts, "controller", sock, "set cpu_max_freq:0 1000000", "set cpu_max_freq:all 2000000")
        assert all('"ok"' in r for r in replies), replies
        assert knob_trees.wait_for(lambda: _originals(base)), knob_trees.max_freqs(base / "cpu")
        held, replies = _hold(accounts, sock, "set cpu_max_freq:0 1000000", "set cpu_max_freq:all 2000000")
        assert all('"ok"' in r for r in replies) and knob_trees.max_freqs(base / "cpu") == [2_000_000, 2_000_000]
        reader.stop()  # SIGTERM with both still set
        assert _originals(base), knob_trees.max_freqs(base / "cpu")
        held.kill()
        held.wait(timeout=10)
    finally:
        reader.stop() if not reader.log.closed else None


def test_kill_9_of_the_reader_restores_what_its_clients_held(accounts, base):
    """A RAPL limit at 25 W (of 65), a GPU limit at 125 W (of 300) and CPU 0 at 1 GHz, held by a client
    when the reader is killed with -9: the reader's keeper process puts each back."""
    sock = base / "run" / "rapl.sock"
    env = _machine(base)
    reader = Reader("machine", sock, base, accounts["group"], control=accounts["control"], env=env)
    held = None
    try:
        held, replies = _hold(accounts, sock, "set cpu_power_limit:0 25", "set gpu_power_limit:0 125",
                              "set cpu_max_freq:0 1000000")
        assert all('"ok"' in r for r in replies), replies
        assert not _originals(base)
        reader.proc.kill()
        reader.proc.wait(timeout=10)
        assert knob_trees.wait_for(lambda: _originals(base)), (
            knob_trees.max_freqs(base / "cpu"), (base / "pc/intel-rapl:0/constraint_0_power_limit_uw").read_text(),
            (base / "gpu-limit").read_text(), reader.text())
    finally:
        if held is not None:
            held.kill()
            held.wait(timeout=10)
        reader.stop() if not reader.log.closed else None


def test_the_two_scopes_and_the_rate_limits_over_the_socket(accounts, base):
    """The read group reads (rounded, one fresh reading per interval per user) and cannot set; the control
    group sets within range, one change per interval; root reads the kernel's own figure, unlimited."""
    sock = base / "run" / "rapl.sock"
    counter = base / "pc" / "intel-rapl:0" / "energy_uj"
    counter.write_text("1234567\n")
    knob = base / "knob"
    # intervals of 60 s: within one test every second request is certainly inside them
    reader = Reader("reader", sock, base, accounts["group"], control=accounts["control"], read_s=60.0, res_uj=1000,
                    set_s=60.0)
    try:
        first = _ask(accounts, "member", sock, "read")[0]
        assert '"energy_uj":1234000' in first and '"resolution_uj":1000' in first, first
        counter.write_text("2345678\n")
        again = _ask(accounts, "member", sock, "read", "read")  # a new connection, the same user
        assert again == [first, first]
        as_root = _ask_root(sock, "read")[0]
        assert '"energy_uj":2345678' in as_root and "resolution_uj" not in as_root
        refused = _ask(accounts, "member", sock, f"set {KNOB} 250", f"restore {KNOB}")
        assert all("may read but not set" in r for r in refused) and knob.read_text() == "200\n"
        ok, too_soon = _ask(accounts, "controller", sock, f"set {KNOB} 250", f"set {KNOB} 260")
        assert '"ok"' in ok and "at most one change per 60 s" in too_soon, (ok, too_soon)
        assert _wait_for(lambda: knob.read_text() == "200\n")  # 260 never written; 250 restored on leaving
        assert "at most one change" in _ask(accounts, "controller", sock, f"set {KNOB} 150")[0]  # per user
        assert '"ok"' in _ask_root(sock, f"set {KNOB} 150")[0]  # root: no pace
    finally:
        reader.stop()
    assert knob.read_text() == "200\n"


def _ask_root(sock: Path, *requests: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", ASK, str(sock), *requests], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


# ---------------------------------------------------------------- the reader's keeper, in process


class _TestKnob(Knob):
    """A knob in memory that can be made to refuse every write (a device that stopped answering)."""
    kind, unit = "test_power_limit", "W"

    def __init__(self) -> None:
        super().__init__("0")
        self.value, self.broken = 200.0, False

    def read(self) -> float:
        return self.value

    def range(self) -> KnobRange:
        return KnobRange(100.0, 300.0)

    def _write(self, value: float) -> None:
        if self.broken:
            raise KnobError(f"{self.name}: the device refused {value:g}")
        self.value = value


def _in_process(monkeypatch, **limits) -> tuple[Any, _TestKnob, io.StringIO, list[float]]:
    from energyprof.serve import server

    clock = [1000.0]
    monkeypatch.setattr(server, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    listener, _ = socket.socketpair()
    knob, log = _TestKnob(), io.StringIO()
    srv = server.Server(listener, lambda: {"zones": []}, [knob], None, control_gid=None, log=server.Log(log), **limits)
    return srv, knob, log, clock


def _client(srv: Any, uid: int) -> Any:
    """A connected client of `uid` that may set (what the accept loop makes of a control-group member)."""
    from energyprof.serve import server

    ours, _theirs = socket.socketpair()
    srv._next_id += 1
    c = server.Conn(ours, 4242, uid, 0.0, id=srv._next_id, privileged=False, can_set=True)
    c._peer = _theirs  # kept open while the client is
    srv.conns[ours.fileno()] = c
    srv.per_uid[uid] = srv.per_uid.get(uid, 0) + 1
    srv.sel.register(ours, selectors.EVENT_READ, c)
    return c


def test_a_part_that_cannot_be_restored_is_released_not_held_by_a_client_gone(monkeypatch):
    """A client leaves and its knob cannot be put back: the reader says so and lets the part go, so the
    next client may set it (held under the departed client it would refuse everyone until a restart)."""
    from energyprof.collect.sensors import served_protocol as protocol

    srv, knob, log, _ = _in_process(monkeypatch, set_interval_s=0.0)
    try:
        a, b = _client(srv, 50001), _client(srv, 50002)
        assert srv._answer(a, protocol.Request("set", knob.name, 250.0)) == {"ok": knob.name, "value": 250.0}
        knob.broken = True
        srv._drop(a)
        assert "could not restore" in log.getvalue() and f"released knob:{knob.name}" in log.getvalue()
        knob.broken = False
        assert srv._answer(b, protocol.Request("set", knob.name, 260.0)) == {"ok": knob.name, "value": 260.0}
    finally:
        srv.close()
    assert knob.value == 250.0  # b's original: the value it found


def test_the_restore_on_leaving_counts_against_the_set_rate(monkeypatch):
    """One change per interval per user: set, leave (a restore, a change too), come back at once and set
    again is refused until an interval after the restore."""
    from energyprof.collect.sensors import served_protocol as protocol

    srv, knob, _, clock = _in_process(monkeypatch, set_interval_s=10.0)
    try:
        a = _client(srv, 50001)
        assert "ok" in srv._answer(a, protocol.Request("set", knob.name, 250.0))
        clock[0] += 9.0
        srv._drop(a)  # restored 9 s after the set
        assert knob.value == 200.0
        clock[0] += 2.0  # 11 s after the set, 2 s after the restore
        again = _client(srv, 50001)
        reply = srv._answer(again, protocol.Request("set", knob.name, 260.0))
        assert "at most one change per 10 s" in reply.get("error", ""), reply
        clock[0] += 8.0  # 10 s after the restore
        assert "ok" in srv._answer(again, protocol.Request("set", knob.name, 260.0))
        other = _client(srv, 50002)  # another user: a pace of its own
        assert "set by another client" in srv._answer(other, protocol.Request("set", knob.name, 150.0))["error"]
    finally:
        srv.close()
    assert knob.value == 200.0


def test_cpus_of_one_policy_through_the_reader(accounts, base):
    """CPUs 0 and 1 sharing cpufreq's policy0 (as on ARM): a client holding cpu_max_freq:0 holds the file, so
    another's cpu_max_freq:1 is refused, and when the holder leaves the file is back at its original."""
    sock = base / "run" / "rapl.sock"
    knob_trees.cpufreq_tree(base / "cpu", cpus=2, cur=3_600_000, per_policy=2)
    policy = base / "cpu/cpufreq/policy0/scaling_max_freq"
    reader = Reader("machine", sock, base, accounts["group"], control=accounts["control"],
                    env={"ENERGYPROF_CPUFREQ_ROOT": str(base / "cpu")})
    held = None
    try:
        held, replies = _hold(accounts, sock, "set cpu_max_freq:0 1000000")
        assert '"ok"' in replies[0], replies
        refused = _ask_root(sock, "set cpu_max_freq:1 2000000")[0]
        assert "set by another client" in refused and policy.read_text() == "1000000", refused
        held.stdin.write("\n")
        held.stdin.flush()
        held.wait(timeout=10)
        assert knob_trees.wait_for(lambda: int(policy.read_text()) == 3_600_000), reader.text()
    finally:
        if held is not None and held.poll() is None:
            held.kill()
            held.wait(timeout=10)
        reader.stop()
