"""`pip install energyprof` as a user gets it: the wheel, in a fresh venv that sees no system packages,
with its dependencies from the package index and no extras.

It must stay light (at most 6 distributions, 30 MB), carry the report's templates and plotly.js,
and answer `--country FRA` from the shipped snapshot of codecarbon's data. Without a package index
to install the dependencies from, the test skips and says why.
"""

from __future__ import annotations

import html
import json
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from install_size import clean_env, distributions, venv_python  # noqa: E402

pytestmark = pytest.mark.slow
MAX_DISTRIBUTIONS = 6
MAX_BYTES = 30e6
HEAVY = {"plotly", "codecarbon", "pandas", "numpy"}


def _index_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def _pip(args: list[str], what: str, **kw) -> subprocess.CompletedProcess[str]:
    """Run pip; a failure with no package index in reach is a skip, any other a failure."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, env=clean_env(), check=False, **kw)
    if proc.returncode != 0:
        tail = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.strip()][-3:]
        if not _index_reachable():
            pytest.skip(f"{what} needs a package index and pypi.org is unreachable: {' / '.join(tail)}")
        pytest.fail(f"{what} failed: {proc.stdout}{proc.stderr}")
    return proc


def test_wheel_installs_light_in_a_fresh_venv_and_profiles_with_the_carbon_snapshot(tmp_path: Path) -> None:
    wheel_dir = tmp_path / "wheel"
    _pip([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(ROOT)], "building the wheel")
    wheel = next(wheel_dir.glob("energyprof-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for shipped in ("energyprof/templates/report.js", "energyprof/templates/report.css",
                    "energyprof/templates/plotly-custom.min.js",
                    "energyprof/templates/plotly.js-LICENSE.txt", "energyprof/data/carbon-snapshot.json"):
        assert shipped in names

    env_dir = tmp_path / "venv"
    py = venv_python(env_dir)
    seeded = distributions(py)  # pip (and setuptools on older Pythons): the venv's, not ours
    _pip([str(py), "-m", "pip", "install", "-q", str(wheel)], "installing the wheel's dependencies")
    installed = distributions(py)
    added = {name: size for name, size in installed.items() if name not in seeded}
    assert "energyprof" in added and not HEAVY & set(added), sorted(added)
    assert len(added) <= MAX_DISTRIBUTIONS, sorted(added)
    assert sum(added.values()) <= MAX_BYTES, added

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "script.py").write_text("print(sum(range(10)))\n")
    (work / "trace.csv").write_text("t_s,cpu\n0,5\n")
    where = subprocess.run([str(py), "-c", "import energyprof; print(energyprof.__file__)"], capture_output=True,
                           text=True, cwd=work, env=clean_env(), timeout=60, check=True).stdout
    assert Path(where.strip()).is_relative_to(env_dir), where  # the wheel's copy, not the source tree
    proc = subprocess.run([str(py), "-m", "energyprof", "--country", "FRA", "--power-trace", "trace.csv",
                           "-o", "r.html", "--json", "p.json", "script.py"],
                          capture_output=True, text=True, cwd=work, env=clean_env(), timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "45\n"
    carbon = json.loads((work / "p.json").read_text())["derived"]["carbon"]  # derived from the facts
    assert carbon["intensity_g_per_kwh"] == 56.039 and carbon["country"] == "FRA"  # codecarbon 3.3's France
    assert "energyprof's snapshot of codecarbon 3.3." in carbon["source"]
    page = html.unescape((work / "r.html").read_text(encoding="utf-8"))
    assert "energyprof's snapshot of codecarbon 3.3." in page  # the methodology names the data
    assert "56.04" in page or "56.039" in page
    assert "plotly.js v" in page and len(page.encode()) < 8e6
    units = subprocess.run([str(py), "-m", "energyprof", "sensors", "serve", "--print-unit"], capture_output=True,
                           text=True, cwd=work, env=clean_env(), timeout=60, check=False)
    assert units.returncode == 0 and "[Socket]" in units.stdout and "[Service]" in units.stdout  # shipped in the wheel
