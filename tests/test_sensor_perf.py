"""RAPL without root: the `power` perf events (a fake sysfs description, the real system call on a
software event) and the privileged reader (`energyprof sensors serve`, a real process and socket)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from energyprof.collect.sensors import perf, served
from energyprof.facts.profile import load

from conftest import run_cli
from test_sensors import make_zone


def pmu(root: Path, pmu_type: int = 23, events: dict[str, tuple[str, str]] | None = None, cpumask: str = "0") -> Path:
    """A `power` PMU as sysfs describes it: type, cpumask, events/energy-X (+ .scale, .unit)."""
    ev = root / "events"
    ev.mkdir(parents=True)
    (root / "type").write_text(f"{pmu_type}\n")
    (root / "cpumask").write_text(cpumask + "\n")
    for name, (code, scale) in (events or {"energy-pkg": ("event=0x02", "2.3283064365386962890625e-10"),
                                           "energy-ram": ("event=0x03", "2.3283064365386962890625e-10"),
                                           "energy-cores": ("event=0x01", "2.3283064365386962890625e-10"),
                                           "energy-psys": ("event=0x05", "2.3283064365386962890625e-10")}).items():
        (ev / name).write_text(code + "\n")
        (ev / f"{name}.scale").write_text(scale + "\n")
        (ev / f"{name}.unit").write_text("Joules\n")
    return root


def test_event_and_cpumask_parsing():
    assert perf.parse_event("event=0x02\n") == 2
    assert perf.parse_event("event=0x3c,umask=0x01") == 0x13C
    assert perf.parse_cpumask("0\n") == [0] and perf.parse_cpumask("0,18") == [0, 18] and perf.parse_cpumask("0-1") == [0, 1]
    with pytest.raises(ValueError):
        perf.parse_event("config=0x2")


def test_events_read_from_sysfs_with_their_scale(tmp_path):
    listed = {e[0]: e for e in perf.events(pmu(tmp_path / "power"))}
    assert listed["energy-pkg"][1:] == (2, 2.3283064365386962890625e-10, "Joules")
    assert set(listed) == {"energy-pkg", "energy-ram", "energy-cores", "energy-psys"}


def test_not_permitted_gives_the_step_that_enables_it(tmp_path, monkeypatch):
    (tmp_path / "paranoid").write_text("2\n")

    def denied(*args):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(perf, "open_event", denied)
    found = perf.discover(str(pmu(tmp_path / "power")), paranoid_path=str(tmp_path / "paranoid"), explicit=True)
    assert not found.sensors
    assert "perf_event_paranoid is 2" in found.missing["perf"] and "sysctl kernel.perf_event_paranoid=0" in found.missing["perf"]


def test_packages_cores_and_psys_are_never_added_twice(tmp_path, monkeypatch):
    opened = []

    def fake_open(pmu_type: int, config: int, cpu: int) -> int:
        opened.append((config, cpu))
        return os.open(os.devnull, os.O_RDONLY)

    monkeypatch.setattr(perf, "open_event", fake_open)
    found = perf.discover(str(pmu(tmp_path / "power", cpumask="0,18")), explicit=True)
    try:
        # energy-cores sits inside the package, psys holds package and dram: neither is read beside them
        assert sorted(s.id for s in found.sensors) == ["cpu:0", "cpu:1", "dram:0", "dram:1"]
        assert sorted(opened) == [(2, 0), (2, 18), (3, 0), (3, 18)]
    finally:
        for s in found.sensors:
            s.close()


def test_the_real_system_call_counts_and_scales(tmp_path):
    """perf_event_open for real, on a software event (cpu-clock, ns) described as an energy event
    with scale 1e-9: the 'joules' it reports are the seconds it ran, so the syscall, the read
    and the scale are exercised where no RAPL exists."""
    root = pmu(tmp_path / "power", pmu_type=1, events={"energy-pkg": ("event=0x00", "1e-9")})
    found = perf.discover(str(root), explicit=True)
    if not found.sensors:
        pytest.skip("system-wide perf events are not permitted here: " + "; ".join(found.notes))
    s = found.sensors[0]
    try:
        before = time.perf_counter()
        s.start(0)
        after_start = time.perf_counter()
        time.sleep(0.05)
        before_read = time.perf_counter()
        value = s.read(0)
        after = time.perf_counter()
        assert before_read - after_start <= value + 1e-4 and value <= after - before + 1e-4
        assert s.tier == "counter" and s.detail["event"] == "power/energy-pkg/"
    finally:
        s.close()


# ---------------------------------------------------------------- the privileged reader


@pytest.fixture
def reader(tmp_path):
    root = tmp_path / "powercap"
    zone = make_zone(root, "intel-rapl:0", "package-0", energy_uj=1000)
    make_zone(root, "intel-rapl:0:0", "dram", energy_uj=0)
    sock = tmp_path / "rapl.sock"
    proc = subprocess.Popen([sys.executable, "-m", "energyprof", "sensors", "serve", "--socket", str(sock),
                             "--powercap-root", str(root)], stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert "serving cpu (package-0), dram (dram)" in line, line
        yield sock, zone, root
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert not sock.exists()  # the reader removes its socket when stopped


def test_served_counters_and_their_wrap(reader):
    sock, zone, _ = reader
    found = served.discover(str(sock), explicit=True)
    try:
        by_id = {s.id: s for s in found.sensors}
        assert set(by_id) == {"cpu", "dram"} and by_id["cpu"].sensor == "rapl"
        assert (sock.stat().st_mode & 0o777) == 0o600  # no --group: root alone
        by_id["cpu"].start(1)
        (zone / "energy_uj").write_text("3501000\n")
        assert by_id["cpu"].read(2) == pytest.approx(3.5)
        top = 262_143_328_850
        (zone / "energy_uj").write_text(f"{top - 500}\n")
        assert by_id["cpu"].read(3) == pytest.approx((top - 1500) / 1e6)
        (zone / "energy_uj").write_text("1000\n")  # wrapped at max_energy_range_uj: 500 + 1000 uJ more
        assert by_id["cpu"].read(4) == pytest.approx(top / 1e6)
    finally:
        for s in found.sensors:
            s.close()


def test_a_run_uses_the_reader_when_rapl_cannot_be_read(reader, tmp_path):
    sock, _, _ = reader
    (tmp_path / "empty").mkdir()
    (tmp_path / "prog.py").write_text("print('done')\n")
    done = run_cli(["-q", "--sensor", "rapl", "--powercap-root", str(tmp_path / "empty"), "--json", "p.json",
                    "-o", "r.html", "prog.py"], tmp_path, env={"ENERGYPROF_SENSOR_SOCKET": str(sock)})
    assert done.returncode == 0, done.stderr
    prof = load(tmp_path / "p.json")
    assert [(s.id, s.sensor, s.method) for s in prof.sources] == [("cpu", "rapl", "measured"), ("dram", "rapl", "measured")]
    assert "energyprof sensors serve" in prof.sources[0].detail["via"]


def test_serve_refuses_a_path_that_is_not_a_socket(tmp_path):
    make_zone(tmp_path / "pc", "intel-rapl:0", "package-0")
    (tmp_path / "file").write_text("keep me")
    done = run_cli(["sensors", "serve", "--socket", str(tmp_path / "file"), "--powercap-root", str(tmp_path / "pc")],
                   tmp_path)
    assert done.returncode == 2 and "not a socket" in done.stderr
    assert (tmp_path / "file").read_text() == "keep me"


def test_serve_for_a_group_and_refuse_an_unknown_group(tmp_path):
    import grp

    from energyprof.serve import server

    make_zone(tmp_path / "pc", "intel-rapl:0", "package-0")
    group = grp.getgrgid(os.getgid()).gr_name
    reader = server.Reader(str(tmp_path / "g" / "g.sock"), str(tmp_path / "pc"), group, [])
    try:
        st = (tmp_path / "g" / "g.sock").stat()
        assert (st.st_mode & 0o777) == 0o660 and st.st_gid == os.getgid() and reader.zones == ["cpu (package-0)"]
        folder = (tmp_path / "g").stat()
        assert (folder.st_mode & 0o777) == 0o750 and folder.st_gid == os.getgid()
    finally:
        reader.close()
    assert not (tmp_path / "g" / "g.sock").exists()
    with pytest.raises(ValueError, match="no group named"):
        server.Reader(str(tmp_path / "h.sock"), str(tmp_path / "pc"), "no-such-group-here", [])


def test_serve_takes_its_socket_from_systemd(tmp_path):
    """Socket activation: the listening socket arrives as fd 3 with LISTEN_PID/LISTEN_FDS (sd_listen_fds)."""
    import socket as so

    make_zone(tmp_path / "pc", "intel-rapl:0", "package-0", energy_uj=4242)
    path = tmp_path / "act.sock"
    listener = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    fd = listener.fileno()
    # What systemd does: the socket at fd 3, LISTEN_PID naming the process that execs the reader.
    launch = ("import os, sys; os.dup2(int(sys.argv[1]), 3); "
              "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1'); "
              "os.execv(sys.executable, [sys.executable, '-m', 'energyprof', 'sensors', 'serve', "
              "'--powercap-root', sys.argv[2]])")
    proc = subprocess.Popen([sys.executable, "-c", launch, str(fd), str(tmp_path / "pc")], pass_fds=(fd,),
                            stderr=subprocess.PIPE, text=True)
    listener.close()
    try:
        line = proc.stderr.readline()
        assert "socket from systemd" in line, line
        found = served.discover(str(path), explicit=True)
        try:
            assert [(s.id, s.client.fetch()["cpu"]["energy_uj"]) for s in found.sensors] == [("cpu", 4242)]
        finally:
            for s in found.sensors:
                s.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    assert path.exists()  # systemd's socket: removed by systemd, not by the reader


def test_sensors_unit_prints_the_shipped_units(tmp_path):
    done = run_cli(["sensors", "unit"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "SocketMode=0660" in done.stdout and "SocketGroup=energyprof" in done.stdout
    assert "ProtectSystem=strict" in done.stdout and "NoNewPrivileges=yes" in done.stdout
    assert "RestrictAddressFamilies=AF_UNIX" in done.stdout and "CapabilityBoundingSet=CAP_SYS_ADMIN" in done.stdout
    done = run_cli(["sensors", "unit", "--install-to", str(tmp_path)], tmp_path)
    assert done.returncode == 0 and (tmp_path / "energyprof-sensors.socket").read_text().startswith("# The privileged")
