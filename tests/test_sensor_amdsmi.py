"""AMD GPUs through an injected amdsmi binding (tests/fixtures/sensors/fake_amdsmi.py): the counter where it can
be trusted, power polling where it cannot, HIP's numbering, the tie to ranks, and the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from energyprof.collect.sensors.gpu import amdsmi
from energyprof.engines.distributed import gpu_ties
from energyprof.facts.profile import load

import sensor_standins as standins
from conftest import run_cli

FAKE = standins.FIXTURES / "fake_amdsmi.py"
TWO = [{"bdf": "0000:c3:00.0", "name": "AMD Instinct MI210", "watts": 180.0, "counter": "ok"},
       {"bdf": "0000:03:00.0", "name": "AMD Instinct MI210", "watts": 90.0, "counter": "none", "power": "average"}]


def binding(monkeypatch, gpus: list[dict]):
    monkeypatch.setenv("FAKE_AMDSMI_GPUS", json.dumps(gpus))
    return standins.load_module("fake_amdsmi")


def discover(monkeypatch, gpus, env=None, check_s=0.05):
    return amdsmi.discover(binding(monkeypatch, gpus), env=env or {}, check_s=check_s, explicit=True)


def test_counter_in_uj_from_either_key():
    assert amdsmi.counter_uj({"energy_accumulator": 65628, "counter_resolution": 15.3}) == pytest.approx(1004108.4)
    assert amdsmi.counter_uj({"power": 59230, "counter_resolution": 15.3}) == pytest.approx(906219.0)


def test_power_prefers_current_and_skips_na():
    assert amdsmi.power_w({"current_socket_power": 717, "average_socket_power": "N/A"}) == (717.0, "current_socket_power")
    assert amdsmi.power_w({"current_socket_power": "N/A", "average_socket_power": 94}) == (94.0, "average_socket_power")
    assert amdsmi.power_w({"current_socket_power": "N/A", "average_socket_power": "N/A"}) == (None, "")


def test_two_gpus_with_and_without_counter_numbered_by_bus(monkeypatch):
    found = discover(monkeypatch, TWO)
    try:
        by_id = {s.id: s for s in found.sensors}
        # HIP numbers by PCI bus: the handle listed second (bus 03) is gpu:0
        assert by_id["gpu:0"].detail["pci_bus_id"] == "0000:03:00.0" and by_id["gpu:0"].kind == "power"
        assert by_id["gpu:1"].kind == "counter" and by_id["gpu:1"].tier == "counter"
        assert by_id["gpu:0"].tier == "integrated" and "average_socket_power" in by_id["gpu:0"].detail["reading"]
        assert any("no energy counter" in n and "polling" in n for n in found.notes)
        t0 = time.perf_counter_ns()
        before = time.perf_counter()
        for s in found.sensors:
            s.start(t0)
        after_start = time.perf_counter()
        time.sleep(0.2)
        t1 = time.perf_counter_ns()
        before_read = time.perf_counter()
        counter_j = by_id["gpu:1"].read(t1)
        after_read = time.perf_counter()
        # the counter: 180 W over the real time between the two calls, to one 15.3 uJ step each
        assert 180 * (before_read - after_start) - 31e-6 <= counter_j <= 180 * (after_read - before) + 31e-6
        # polled constant power: trapezoids are exact over the tick times given
        assert by_id["gpu:0"].read(t1) == pytest.approx(90 * (t1 - t0) / 1e9, rel=1e-12)
    finally:
        for s in found.sensors:
            s.close()


@pytest.mark.parametrize("mode,why", [("frozen", "frozen"), ("backward", "ran backward"), ("under", "under-reporting")])
def test_an_untrustworthy_counter_falls_back_to_power_with_a_note(monkeypatch, mode, why):
    found = discover(monkeypatch, [{"bdf": "0000:03:00.0", "name": "MI100", "watts": 150.0, "counter": mode}],
                     check_s=0.2)
    assert [s.kind for s in found.sensors] == ["power"]
    assert why in found.sensors[0].detail["why_not_counter"]
    assert any(why in n for n in found.notes)


def test_the_older_power_key_is_a_counter(monkeypatch):
    found = discover(monkeypatch, [{"bdf": "0000:03:00.0", "name": "MI100", "watts": 150.0, "counter": "old-key"}],
                     check_s=0.2)
    assert [s.kind for s in found.sensors] == ["counter"]


def test_hip_visible_devices_and_rank_ties(monkeypatch):
    found = discover(monkeypatch, TWO, env={"HIP_VISIBLE_DEVICES": "1"})
    try:
        assert [(s.id, s.detail["pci_bus_id"]) for s in found.sensors] == [("gpu:0", "0000:c3:00.0")]
    finally:
        for s in found.sensors:
            s.close()
    found = discover(monkeypatch, TWO)
    try:
        sources = [s.describe() for s in found.sensors]
        ranks = [{"pid": 10, "rank": 0, "local_rank": 0, "role": "rank"}, {"pid": 11, "rank": 1, "local_rank": 1, "role": "rank"}]
        ties = gpu_ties(sources, ranks, {}, None)
        assert ties["gpu:0"]["rank"] == 0 and ties["gpu:1"]["rank"] == 1 and ties["gpu:1"]["tied_by"] == "LOCAL_RANK"
    finally:
        for s in found.sensors:
            s.close()


def test_no_binding_or_no_driver_says_how(monkeypatch):
    monkeypatch.setenv("FAKE_AMDSMI_INIT_FAILS", "1")
    found = discover(monkeypatch, TWO)
    assert not found.sensors and "render group" in found.missing["amdsmi"]


def test_two_gpu_binding_end_to_end(tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    shutil.copy(FAKE, fake / "amdsmi.py")
    (tmp_path / "prog.py").write_text("import time\ntime.sleep(0.5)\nprint('done')\n")
    env = {"PYTHONPATH": f"{fake}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "FAKE_AMDSMI_GPUS": json.dumps(TWO)}
    done = run_cli(["-q", "--sensor", "amdsmi", "--json", "p.json", "-o", "r.html", "prog.py"], tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    prof = load(tmp_path / "p.json")
    assert [(s.id, s.sensor, s.tier) for s in prof.sources] == [("gpu:0", "amdsmi", "integrated"),
                                                                 ("gpu:1", "amdsmi", "counter")]
    e = prof.totals.energy_j
    # constant power: gpu:0's trapezoids are exact; the counter reads real time a few microseconds off the tick's
    assert e["gpu:0"] == pytest.approx(90 * prof.totals.duration_s, rel=1e-6)
    assert e["gpu:1"] == pytest.approx(180 * prof.totals.duration_s, rel=0.1)


def test_process_share_and_the_process_list_that_ties_a_rank(monkeypatch):
    gpus = [dict(TWO[1], pids=[os.getpid()]), dict(TWO[0], pids=[1])]
    found = discover(monkeypatch, gpus)
    try:
        by_id = {s.id: s for s in found.sensors}
        assert by_id["gpu:0"].process_share() == 1.0  # this process alone on it
        assert by_id["gpu:1"].process_share() == 0.0  # someone else's, and HIP is not loaded here
        seen = {s.id: s.share.seen_pids for s in found.sensors}
        ranks = [{"pid": os.getpid(), "rank": 0, "local_rank": 0, "role": "rank"},
                 {"pid": 4242, "rank": 1, "local_rank": 1, "role": "rank"}]
        ties = gpu_ties([s.describe() for s in found.sensors], ranks, {}, None, seen)
        # rank 0 is listed on gpu:0; rank 1 never appears in gpu:1's list, so it is not tied
        assert ties == {"gpu:0": {"rank": 0, "pid": os.getpid(), "tied_by": "LOCAL_RANK and NVML's process list"}}
    finally:
        for s in found.sensors:
            s.close()
