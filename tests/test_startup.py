"""What energyprof imports before it does anything, checked in real interpreters (sys.modules and
`-X importtime`), never by timing; and the meta strings made without the `platform` module."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import energyprof
from energyprof.carbon.intensity import _parse_time
from energyprof.drive import meta

REPO = Path(energyprof.__file__).resolve().parent.parent

#: Modules `--help` never needs: the Options dataclass and its machinery, the run's and the report's.
HELP_NEVER = ("dataclasses", "inspect", "json", "socket", "ctypes", "subprocess", "platform", "datetime", "tempfile",
              "pathlib", "energyprof.setup.options", "energyprof.facts.profile", "energyprof.drive",
              "energyprof.supervise", "energyprof.collect", "energyprof.core", "energyprof.analysis", "energyprof.render",
              "energyprof.output", "energyprof.store", "energyprof.engines")
#: The report's roles that only some runs have (analysis/kinds.py tells whether a profile has any).
ROLE_MODULES = ("energyprof.analysis.tests_table", "energyprof.analysis.tests_compare", "energyprof.analysis.tokens",
                "energyprof.analysis.units", "energyprof.analysis.phases", "energyprof.analysis.pareto",
                "energyprof.analysis.training", "energyprof.analysis.forecast", "energyprof.render.units",
                "energyprof.render.unit_tables")
#: Modules the agent loads in a Python program only once it uses them (a model's forward, CUDA).
PROGRAM_NEVER = ("weakref", "energyprof.agent.kernels", "energyprof.agent.kernel_capture", "energyprof.agent.generate",
                 "energyprof.agent.requests", "energyprof.agent.request_hooks")


def _absent_hardware() -> tuple[str, ...]:
    """The sensor backends' modules for hardware this machine lacks, told from the files their drivers make
    (so the test holds on a machine with RAPL or a GPU, and pins the most where there is none)."""
    env, pkg = os.environ.get, "energyprof.collect.sensors."
    absent = {"rapl": not os.path.isdir(env("ENERGYPROF_POWERCAP_ROOT") or "/sys/class/powercap"),
              "served": not os.path.exists(env("ENERGYPROF_SENSOR_SOCKET") or "/run/energyprof/rapl.sock"),
              "perf": not os.path.isdir(os.path.join(env("ENERGYPROF_PERF_ROOT") or "/sys/bus/event_source/devices/power",
                                                     "events")),
              # the GPUs' package, NVML's device layer included: no NVIDIA driver and no ROCm binding
              "gpu": (sys.platform.startswith("linux") and not any(map(os.path.exists, ("/proc/driver/nvidia", "/dev/dxg")))
                      and importlib.util.find_spec("amdsmi") is None),
              # the system-on-chip tools' package: Linux, and not a Jetson
              "soc": sys.platform.startswith("linux") and not os.path.exists("/etc/nv_tegra_release")
              and not os.path.exists("/sys/devices/soc0/family")}
    return tuple(pkg + name for name, missing in absent.items() if missing)


#: Modules an empty run's supervisor has no use for on a machine without a sensor reader or --watch-cache.
RUN_NEVER = ("socket", "platform", "datetime", "secrets", "hmac", "hashlib", "energyprof.collect.sensors.served_protocol",
             "energyprof.collect.pagecache", "subprocess",
             # no GPU read: none of the kernels' modules, nor the report's GPU panel
             "energyprof.collect.kernels", "energyprof.core.gpu_tree", "energyprof.render.gpu", "energyprof.analysis.gpu",
             # no system-on-chip: none of its tools' modules; no ROCm binding: none of amdsmi's
             "energyprof.collect.sensors.soc.tegrastats", "energyprof.collect.sensors.soc.jtop",
             "energyprof.collect.sensors.soc.stream", "energyprof.collect.sensors.soc.rails",
             "energyprof.collect.sensors.soc.powermetrics", "energyprof.collect.sensors.soc.macmon",
             "energyprof.collect.sensors.gpu.amdsmi",
             # no powercap tree, privileged reader, power PMU, GPU driver or binding, nor a Jetson: none of their
             # backends' modules (collect/sensors/presence.py tells without them)
             *_absent_hardware(),
             # no CUDA in the program: the capture's modules, on either side
             "energyprof.agent.kernels", "energyprof.agent.kernel_capture", "energyprof.core.kernels",
             # no tests, batched steps, units of work, sweeps, tracked loops or linked backward in the run: none
             # of the modules that tabulate them (analysis/kinds.py decides), nor the engines' task windows' reader
             *ROLE_MODULES, "energyprof.engines.ray_trials",
             # no export asked for (--csv, --folded, --speedscope, --pprof): none of their modules
             "energyprof.render.exports", "energyprof.render.pprof",
             # streams with no window, allocation, lost span, GPU, thread group, I/O edge or kernel record: none of
             # their record classes (supervise/extra_records.py)
             "energyprof.supervise.extra_records")

HELP = """
import runpy, sys
sys.argv = ["energyprof", "--help"]
try:
    runpy.run_module("energyprof", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
print("\\x00" + " ".join(sorted(sys.modules)) + "\\x00" + str(code))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("ENERGYPROF_AGENT", None)
    return env


def _heavy(modules: set[str], never: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in never))


@pytest.mark.parametrize("site", [True, False], ids=["with-site", "no-site"])
def test_help_imports_none_of_the_heavy_modules(tmp_path: Path, site: bool) -> None:
    """`python -m energyprof --help` as a user runs it; -S as well, so that nothing the machine's site
    imports first (here: pathlib, tempfile, typing through a .pth file) hides an import of energyprof's."""
    out = subprocess.run([sys.executable, *([] if site else ["-S"]), "-c", HELP], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text, modules, code = out.stdout.split("\x00")
    assert code.strip() in ("0", "None") and "usage: energyprof" in text and "--sensor-interval" in text
    modules = set(modules.split())
    assert "energyprof.cli.run" in modules  # the help came from the run's parser
    # Under site, the standard library's modules may be the machine's own imports: energyprof's alone.
    assert _heavy(modules, HELP_NEVER if not site else tuple(n for n in HELP_NEVER if n.startswith("energyprof"))) == []


def test_an_empty_run_imports_only_what_it_uses(tmp_path: Path) -> None:
    """The supervisor's imports after start-up (`-X importtime`, its own block: the program's comes after
    the next header), for an empty script with the report and the JSON."""
    (tmp_path / "empty.py").write_text("")
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "energyprof", "-q", "-o", "r.html", "--json",
                          "p.json", "empty.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r.html").stat().st_size > 0 and (tmp_path / "p.json").stat().st_size > 0
    blocks = re.split(r"import time: self \[us\] \| cumulative \| imported package\n", out.stderr)
    supervisor = [m.group(2) for m in re.finditer(r"import time:\s+\d+ \|\s+\d+ \|( *)(\S+)", blocks[1])]
    program = [m.group(2) for m in re.finditer(r"import time:\s+\d+ \|\s+\d+ \|( *)(\S+)", "".join(blocks[2:]))]
    after_site = set(supervisor[supervisor.index("site") + 1:])  # what the machine's site imported is not ours
    after_site |= set(program[program.index("site") + 1:]) if "site" in program else set(program)
    assert "energyprof.supervise.supervisor" in after_site and "energyprof.analysis.report" in after_site
    assert _heavy(after_site, RUN_NEVER) == []
    # The program's own start, the agent's bootstrap included (it runs inside site), against a plain interpreter's:
    # no module the agent needs only for a model's forward or a CUDA capture.
    plain = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=_env(), capture_output=True,
                           text=True, timeout=120)
    at_start = set(re.findall(r"import time:\s+\d+ \|\s+\d+ \| *(\S+)", plain.stderr))
    assert "energyprof.agent.sampler" in program
    assert _heavy(set(program) - at_start, PROGRAM_NEVER) == []


def test_platform_string_is_the_platform_modules() -> None:
    assert meta.python_version() == platform.python_version()
    if sys.platform.startswith("linux") and hasattr(platform, "_platform"):
        u = platform.uname()
        lib, version = platform.libc_ver()
        assert meta._platform() == platform._platform(u.system, u.release, u.machine, "with", lib + version)


@given(st.lists(st.text(alphabet=st.sampled_from(list("ab -_/\\:;\"()unkow2.")), max_size=12), min_size=1, max_size=5))
def test_platform_formatting_is_the_platform_modules(parts: list[str]) -> None:
    if not hasattr(platform, "_platform"):
        pytest.skip("this Python's platform module has no _platform to compare with")
    try:
        expected = platform._platform(*parts)
    except IndexError:  # platform's own formatting fails on a string that cleans up to nothing
        expected = ""
    assert meta._platform_name(*parts) == expected


def test_a_run_that_asks_for_nothing_builds_no_report(tmp_path: Path) -> None:
    """`-q -o /dev/null`: nothing reads a report, so neither the analysis nor a renderer is imported, and
    the checkpoint (in the temporary folder, since the output is a device) is gone at the end."""
    (tmp_path / "empty.py").write_text("")
    spool = tmp_path / "tmp"
    spool.mkdir()
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "energyprof", "-q", "-o", os.devnull, "empty.py"],
                         cwd=tmp_path, env=dict(_env(), TMPDIR=str(spool)), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    imported = set(re.findall(r"import time:\s+\d+ \|\s+\d+ \| *(\S+)", out.stderr))
    assert "energyprof.supervise.supervisor" in imported
    assert _heavy(imported, ("energyprof.analysis", "energyprof.render")) == []
    assert list(spool.iterdir()) == []


@pytest.mark.parametrize("handler", [True, False], ids=["exit-handler", "none"])
def test_the_exit_keeps_the_programs_status_and_runs_exit_handlers(tmp_path: Path, handler: bool) -> None:
    """energyprof ends without Python's module teardown, but not without what comes before it: a handler
    registered to run at exit (MLflow's, coverage's) runs, output is flushed, the status is the program's."""
    (tmp_path / "prog.py").write_text("print('out')\nraise SystemExit(3)\n")
    code = ("import atexit, runpy, sys\n"
            + ("atexit.register(lambda: print('handler ran', file=sys.stderr, flush=True))\n" if handler else "")
            + "sys.argv = ['energyprof', '-q', '-o', 'r.html', 'prog.py']\n"
            + "runpy.run_module('energyprof', run_name='__main__', alter_sys=True)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 3 and out.stdout == "out\n"
    assert ("handler ran" in out.stderr) == handler
    assert (tmp_path / "r.html").stat().st_size > 0


@given(st.one_of(st.floats(min_value=-2e9, max_value=4e9, allow_nan=False),
                 st.builds(lambda s, f: s + f, st.integers(-2_000_000_000, 4_000_000_000),
                           st.sampled_from([0.0, 5e-7, 1.5e-6, 2.5e-6, 0.9999995, 0.25]))))
def test_started_at_is_datetimes_isoformat(ts: float) -> None:
    assert meta.iso_utc(ts) == datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat()


@given(st.datetimes(min_value=datetime.datetime(1, 1, 2), max_value=datetime.datetime(9999, 12, 30)))
def test_a_utc_time_reads_back_as_datetime_reads_it(value: datetime.datetime) -> None:
    text = value.replace(tzinfo=datetime.timezone.utc).isoformat()
    assert _parse_time(text) == datetime.datetime.fromisoformat(text).timestamp()


def test_other_times_are_left_to_datetime() -> None:
    for bad in ("2024-02-30T00:00:00+00:00", "2023-02-29T12:00:00+00:00", "2024-13-01T00:00:00+00:00"):
        with pytest.raises(ValueError):
            _parse_time(bad)
    assert _parse_time("2024-02-29T23:59:59.5Z") == datetime.datetime(2024, 2, 29, 23, 59, 59, 500000,
                                                                      datetime.timezone.utc).timestamp()
    assert _parse_time("2024-01-01T01:00:00+01:00") == datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc).timestamp()
    assert _parse_time("1700000000.25") == 1700000000.25


def test_the_roles_leaf_imports_no_role() -> None:
    """Deciding costs no role's import: analysis/kinds.py loads none of the analysis' other modules."""
    code = "import sys, energyprof.analysis.kinds; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = {m for m in out.stdout.split() if m.startswith("energyprof") and not m.startswith("energyprof.agent")}
    assert loaded == {"energyprof", "energyprof.analysis", "energyprof.analysis.kinds"}


def test_every_unit_kind_is_seen_by_the_leaf() -> None:
    """`may_be_unit` lets analysis/units.py be left unimported only where it would find no unit: each of its
    kinds (a fact at 1, an engine's prefix) is a window the leaf says may be one; a plain window is not."""
    from energyprof.analysis import units
    from energyprof.analysis.kinds import may_be_unit
    from energyprof.facts.profile import Window

    def window(name: str, loop: dict[str, float]) -> Window:
        return Window(name=name, index=0, start_s=0.0, end_s=1.0, energy_j={}, loop=loop)

    kinds = [window("GET /x", {fact: 1.0}) for fact in units.FACT_KINDS]
    kinds += [window(prefix + "f]", {}) for prefix, _ in units.PREFIX_KINDS]
    assert kinds and all(units.unit_kind(w) is not None and may_be_unit(w) for w in kinds)
    plain = window("step", {"epoch": 1.0})
    assert units.unit_kind(plain) is None and not may_be_unit(plain)


DISCOVER = r"""
import json, sys
from energyprof.collect.sensors import discover
found = discover(powercap_root=sys.argv[1], gpus=False, only=sys.argv[2:] or None)
print(json.dumps({"sensors": [s.sensor + ":" + s.id for s in found.sensors], "notes": found.notes,
                  "missing": found.missing, "loaded": sorted(m for m in sys.modules if m.startswith("energyprof.collect"))}))
"""
BACKEND_MODULES = {f"energyprof.collect.sensors.{m}" for m in ("rapl", "served", "perf")}


def _discover(tmp_path: Path, root: Path, *only: str) -> dict:
    env = dict(_env(), ENERGYPROF_PERF_ROOT=str(tmp_path / "no-pmu"), ENERGYPROF_SENSOR_SOCKET=str(tmp_path / "no.sock"))
    out = subprocess.run([sys.executable, "-c", DISCOVER, str(root), *only], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("only", [(), ("rapl", "perf")], ids=["left-to-itself", "named"])
def test_a_backend_is_imported_where_its_hardware_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     only: tuple[str, ...]) -> None:
    """Discovery in a fresh interpreter: with a (fake) powercap tree RAPL's module is imported and reads it;
    without one, neither it, the privileged reader's client nor perf's is, and the notes and the steps are
    those the backends themselves give of what is missing."""
    from test_sensors import make_zone

    from energyprof.collect.sensors import perf, rapl, served

    make_zone(tmp_path / "powercap", "intel-rapl:0", "package-0")
    there = _discover(tmp_path, tmp_path / "powercap", *only)
    assert there["sensors"][0] == "rapl:cpu" and "energyprof.collect.sensors.rapl" in there["loaded"]

    none = tmp_path / "none"
    gone = _discover(tmp_path, none, *only)
    assert not BACKEND_MODULES & set(gone["loaded"]) and all(s.startswith("model:") for s in gone["sensors"])
    monkeypatch.setenv("ENERGYPROF_PERF_ROOT", str(tmp_path / "no-pmu"))
    monkeypatch.setenv("ENERGYPROF_SENSOR_SOCKET", str(tmp_path / "no.sock"))
    explicit = bool(only)
    own = [*rapl.discover(str(none)).notes, *served.discover(explicit=explicit).notes,
           *perf.discover(explicit=explicit).notes]
    assert gone["notes"][:len(own)] == own
    assert gone["missing"]["perf"] == perf.discover(explicit=explicit).missing["perf"]
    assert gone["missing"]["rapl"].startswith(rapl.discover(str(none)).notes[0].removeprefix("RAPL: "))
