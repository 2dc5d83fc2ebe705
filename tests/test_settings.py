"""The machine's settings: read from fake sysfs trees, a stand-in nvpmodel, an injected NVML binding;
recorded in a real run's meta and its report's "This run"; compare warns when two sides differ."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from energyprof.collect import settings
from energyprof.analysis import settings as compared
from energyprof.facts.profile import Node
from energyprof.facts.profile import Profile


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def fake_sys(root: Path, governors: tuple[str, ...] = ("performance", "performance")) -> Path:
    for i, gov in enumerate(governors):
        d = root / f"devices/system/cpu/cpu{i}/cpufreq"
        _write(d / "scaling_governor", gov)
        _write(d / "scaling_min_freq", "800000")
        _write(d / "scaling_max_freq", "3500000")
        _write(d / "cpuinfo_max_freq", "4200000")
    (root / "devices/system/cpu/cpu9").mkdir(parents=True)  # offline or no cpufreq: not counted
    _write(root / "devices/system/cpu/intel_pstate/no_turbo", "1")
    z = root / "class/powercap/intel-rapl:0"
    _write(z / "name", "package-0")
    _write(z / "enabled", "1")
    _write(z / "energy_uj", "1000")
    _write(z / "max_energy_range_uj", "262143328850")
    for k, (name, uw, us) in enumerate((("long_term", 65_000_000, 27_983_872), ("short_term", 90_000_000, 2_440))):
        _write(z / f"constraint_{k}_name", name)
        _write(z / f"constraint_{k}_power_limit_uw", str(uw))
        _write(z / f"constraint_{k}_time_window_us", str(us))
    return root


def test_cpufreq_and_rapl_limits_from_a_fake_tree(tmp_path: Path) -> None:
    root = fake_sys(tmp_path / "sys")
    got = settings.read(sys_root=str(root), gpus=False)
    assert got["cpufreq"] == {"governor": "performance", "min_khz": 800000, "max_khz": 3500000,
                              "hardware_max_khz": 4200000, "boost": False}
    zone = got["rapl"]["intel-rapl:0 (package-0)"]
    assert zone["long_term"] == {"limit_w": 65.0, "window_s": pytest.approx(27.983872)}
    assert zone["short_term"]["limit_w"] == 90.0 and zone["enabled"] is True


def test_cpus_that_disagree_are_listed_each(tmp_path: Path) -> None:
    root = fake_sys(tmp_path / "sys", ("performance", "powersave"))
    assert settings.cpufreq(str(root))["governor"] == {"cpu0": "performance", "cpu1": "powersave"}


def test_nothing_there_records_nothing(tmp_path: Path) -> None:
    assert settings.read(sys_root=str(tmp_path), gpus=False) == {}


class FakeNvml:
    NVML_CLOCK_GRAPHICS, NVML_CLOCK_MEM = 0, 2

    def __init__(self, limits_mw: list[int]) -> None:
        self.limits_mw = limits_mw
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.limits_mw)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self.limits_mw[h]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetApplicationsClock(self, h: int, kind: int) -> int:
        return {0: 1755, 2: 2619}[kind]

    def nvmlDeviceGetMaxClockInfo(self, h: int, kind: int) -> int:
        return 1980

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")  # left out, the rest kept


def test_gpu_power_limits_and_clocks_through_nvml() -> None:
    nv = FakeNvml([350_000, 700_000])
    gpus = settings.gpu_limits(nv)
    assert [g["power_limit_w"] for g in gpus] == [350.0, 700.0]
    assert gpus[0] == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "power_limit_w": 350.0, "default_power_limit_w": 700.0,
                       "app_clock_graphics_mhz": 1755, "app_clock_memory_mhz": 2619, "max_clock_graphics_mhz": 1980}
    assert nv.shutdowns == 1


def stand_in(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_jetson_power_mode_from_nvpmodel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(tmp_path, "nvpmodel", "import sys\nassert sys.argv[1:] == ['-q']\nprint('NV Fan Mode:quiet')\n"
                                   "print('NV Power Mode: 15W')\nprint(2)\n")
    stand_in(tmp_path, "jetson_clocks", "import sys\nprint('jetson_clocks needs root'); sys.exit(1)\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert settings.jetson() == {"power_mode": "15W", "power_mode_id": 2}  # --show refused: left out


def fake_block(root: Path, target: str, st_dev: int, usb: bool = False) -> None:
    """/sys/dev/block/MAJ:MIN -> the device's folder, as the kernel links it."""
    disk, _, part = target.partition("/")
    base = root / ("devices/pci0000:00/0000:00:14.0/usb1/1-1/host0/block" if usb else "devices/platform/block")
    d = base / disk
    _write(d / "queue/rotational", "0")
    _write(d / "removable", "1" if usb else "0")
    _write(d / "device/model", "Extreme SD" if not usb else "Flash Disk")
    dev = d
    if part:
        dev = d / part
        _write(dev / "partition", "1")
    link = root / "dev/block" / f"{os.major(st_dev)}:{os.minor(st_dev)}"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(dev, link.parent))


@pytest.mark.parametrize("target, usb, kind", [("mmcblk0/mmcblk0p1", False, "SD card or eMMC"),
                                               ("sda/sda1", True, "USB disk"), ("nvme0n1", False, "NVMe SSD")])
def test_storage_behind_a_dataset_path(tmp_path: Path, target: str, usb: bool, kind: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    fake_block(tmp_path / "sys", target, os.stat(data).st_dev, usb)
    got = settings.storage(str(data), str(tmp_path / "sys"))
    assert got["kind"] == kind
    assert got["disk"] == target.split("/")[0] and got["device"] == target.split("/")[-1]
    assert bool(got.get("removable")) == usb


def test_a_path_with_no_block_device(tmp_path: Path) -> None:
    got = settings.storage(str(tmp_path), str(tmp_path / "emptysys"))
    assert got["kind"].startswith("no block device")


def test_differences_name_each_setting_once() -> None:
    a = {"cpufreq": {"governor": "performance"}, "jetson": {"power_mode": "MAXN"}, "storage": {"path": "/a"}}
    b = {"cpufreq": {"governor": "powersave"}, "jetson": {"power_mode": "MAXN"}, "storage": {"path": "/b"},
         "gpus": [{"index": 0, "power_limit_w": 300.0}]}
    assert compared.differences(a, b) == ["cpufreq.governor: performance -> powersave",
                                          "gpus[0].index: (not recorded) -> 0",
                                          "gpus[0].power_limit_w: (not recorded) -> 300.0"]
    assert compared.differences(a, a) == []
    assert compared.differences(None, b) == []  # a file from before settings were recorded


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_a_run_records_them_and_the_report_shows_them(tmp_path: Path) -> None:
    root = fake_sys(tmp_path / "sys")
    (tmp_path / "s.py").write_text("sum(i * i for i in range(100000))\n")
    proc = subprocess.run([sys.executable, "-m", "energyprof", "--powercap-root", str(root / "class/powercap"),
                           "--no-gpu", "-q", "--json", "p.json", "-o", "r.html", "s.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((tmp_path / "p.json").read_text())["meta"]
    assert meta["settings"]["rapl"]["intel-rapl:0 (package-0)"]["long_term"]["limit_w"] == 65.0
    html = (tmp_path / "r.html").read_text()
    assert "machine settings" in html and "rapl.intel-rapl:0 (package-0).long_term.limit_w</code> 65.0" in html


def _profile(governor: str) -> dict[str, Any]:
    root = Node("s.py", energy_j={"cpu": 10.0}, self_energy_j={"cpu": 10.0}, time_s=1.0, samples=100)
    p = Profile(meta={"idle_policy": "share", "target": "s.py", "settings": {"cpufreq": {"governor": governor}}},
                sources=[{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "rapl"}],
                totals={"energy_j": {"cpu": 10.0}, "attributed_j": {"cpu": 10.0}, "duration_s": 1.0}, root=root)
    return json.loads(p.to_json())


def test_compare_warns_when_the_sides_differ(tmp_path: Path) -> None:
    for name, gov in (("a.json", "performance"), ("b.json", "powersave"), ("c.json", "performance")):
        (tmp_path / name).write_text(json.dumps(_profile(gov)))
    differ = subprocess.run([sys.executable, "-m", "energyprof", "compare", "a.json", "b.json"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, env=_env(), check=False)
    assert differ.returncode == 0, differ.stderr
    assert "cpufreq.governor: performance -> powersave" in differ.stdout
    assert "warning: the machine's settings differ" in differ.stderr
    same = subprocess.run([sys.executable, "-m", "energyprof", "compare", "a.json", "c.json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=_env(), check=False)
    assert same.returncode == 0 and "settings differ" not in same.stdout + same.stderr
