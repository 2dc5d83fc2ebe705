"""`%load_ext energyprof` and the magics, in a notebook run on a real kernel with nbclient."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed")
pytest.importorskip("ipykernel", reason="ipykernel is not installed")

ROOT = Path(__file__).resolve().parent.parent

CELLS = [
    "%load_ext energyprof",
    "%%energyprof --power-trace trace.csv --idle all\n"
    "import time\n"
    "def crunch():\n"
    "    end = time.perf_counter() + 0.3\n"
    "    while time.perf_counter() < end:\n"
    "        pass\n"
    "crunch()\n"
    "print('cell ran')",
    "print(type(_energyprof).__name__, _energyprof.totals['energy_j']['cpu'] > 0,\n"
    "      any(n.function == 'crunch' for n, _ in _energyprof.nodes()))",
    "%energyprof --power-trace trace.csv -- sum(i * i for i in range(200_000))",
    "print(type(_energyprof).__name__, _energyprof.meta['target'])",
    "%%energyprof --idle nonsense\nprint('never')",
]


def outputs(cell) -> tuple[str, str, list[str]]:
    out = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")
    err = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stderr")
    html = [o.data["text/html"] for o in cell.outputs if o.output_type == "display_data" and "text/html" in o.data]
    return out, err, html


@pytest.mark.slow
def test_notebook_magics_on_a_real_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,40\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    env_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", env_path)  # the kernel imports this checkout's energyprof
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    cells = nb.cells

    out, err, html = outputs(cells[1])
    assert "cell ran" in out
    assert "energyprof: <cell> ran" in out  # the summary, in the cell's output
    assert len(html) == 1 and html[0].startswith('<iframe sandbox="allow-scripts"')
    assert "<script" not in html[0]  # the report is escaped inside srcdoc, never part of the notebook's page
    assert "&lt;script" in html[0] and "crunch" in html[0]

    out, _, _ = outputs(cells[2])
    assert out.strip() == "Profile True True"

    out, _, html = outputs(cells[3])
    assert len(html) == 1
    results = [o for o in cells[3].outputs if o.output_type == "execute_result"]
    assert results and results[0].data["text/plain"] == str(sum(i * i for i in range(200_000)))
    assert outputs(cells[4])[0].strip() == "Profile sum(i * i for i in range(200_000))"

    out, err, html = outputs(cells[5])
    assert "never" not in out and html == []
    assert err.strip().startswith("%energyprof:") and "idle" in err and err.strip().count("\n") == 0
