"""The house's layers: docs/architecture.md's table says what pyproject.toml's import-linter contract
checks, and the contract holds (the same check `.ci/run` makes with `lint-imports`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
NOTHING = "nothing of energyprof's"


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def _layers() -> list[list[str]]:
    """The contract's layers, from the ground up, each a list of module names."""
    return [[m.strip() for m in re.split(r"[|:]", layer)] for layer in reversed(_contracts()["layers"]["layers"])]


def _table() -> list[tuple[list[str], set[str]]]:
    """(the modules a row names, what its "may import" column lists), row by row."""
    lines = (ROOT / "docs" / "architecture.md").read_text().splitlines()
    start = lines.index("| folder / module | holds | may import |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        names = re.findall(r"`([\w]+)(?:/|\.py)`", cells[0])
        may = set() if cells[-1] == NOTHING else {m.strip().strip("`") for m in cells[-1].split(",")}
        rows.append((names, may))
    return rows


def test_the_table_says_what_the_contract_checks() -> None:
    layers = _layers()
    level = {m: i for i, layer in enumerate(layers) for m in layer}
    rows = _table()
    named = [m for names, _ in rows for m in names]
    assert sorted(named) == sorted(level), "every layer has a row, and every row is a layer"
    assert [level[m] for m in named] == sorted(level[m] for m in named), "the rows go up as the layers do"
    for names, may in rows:
        for m in names:
            below = {x for layer in layers[: level[m]] for x in layer}
            assert may == below, f"{m}: the table says it may import {sorted(may)}, the contract {sorted(below)}"


def test_every_package_and_module_of_energyprof_is_in_a_layer() -> None:
    """`exhaustive`: a new folder must be given its floor before anything imports it."""
    contract = _contracts()["layers"]
    assert contract.get("exhaustive") is True
    here = {p.stem if p.suffix == ".py" else p.name for p in (ROOT / "energyprof").iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert here == {m for layer in _layers() for m in layer}


def _lint(root: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.skip("lint-imports is not installed (pip install import-linter: the test extra has it)")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_contracts_hold() -> None:
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("where, line, broken", [
    ("facts/policy.py", "from ..render import cards", "energyprof.facts is not allowed to import energyprof.render"),
    ("collect/sensors/base.py", "from . import rapl", "No cycles are allowed in energyprof.collect.sensors"),
    ("knobs/base.py", "import energyprof", "energyprof.knobs is not allowed to import energyprof.integrations"),
])
def test_an_arrow_up_or_a_circle_fails_the_check(tmp_path: Path, where: str, line: str, broken: str) -> None:
    """One import added to a copy of the tree: lint-imports fails and names it (so CI does)."""
    shutil.copytree(ROOT / "energyprof", tmp_path / "energyprof", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "energyprof" / where
    target.write_text(target.read_text() + f"\n\ndef _late() -> None:\n    {line}  # lazily: still an arrow\n")
    done = _lint(tmp_path)
    assert done.returncode != 0
    assert broken in done.stdout, done.stdout
