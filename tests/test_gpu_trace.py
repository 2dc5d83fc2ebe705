"""`energyprof gpu-trace` end to end, as a subprocess: a saved Kineto trace plus a replayed power log
becomes a profile that `report` and `compare` read. The CUDA trace here is synthetic (hand-written in
Kineto's format, tests/fixtures/kineto/README.md); the parser was developed on the real ROCm trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from energyprof.facts.profile import load
from energyprof.facts.records import GpuKernelSum

KINETO = Path(__file__).parent / "fixtures" / "kineto"
SYNTHETIC = KINETO / "synthetic_cuda_with_stack.json"
MI250 = KINETO / "hta__amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"


def _node(profile, *path):
    node = profile.root
    for fn in path:
        (node,) = [c for c in node.children if c.function == fn]
    return node


def _gpu(profile, *path) -> float:
    return _node(profile, *path).energy_j.get("gpu:0", 0.0)


def test_synthetic_cuda_trace_known_answers(tmp_path):
    power = tmp_path / "power.csv"
    power.write_text("t_s,gpu:0\n0,300\n")  # 300 W over the whole 100 ms trace: 30 J
    out = tmp_path / "gpu.json"
    r = run_cli(["gpu-trace", str(SYNTHETIC), "--power-trace", str(power), "--json", str(out), "-q"], tmp_path)
    assert r.returncode == 0, r.stderr
    p = load(out)
    assert p.totals.energy_j == {"gpu:0": pytest.approx(30.0)}
    step = ("<module>", "train_step")
    # the GEMM ran alone for 10 ms at 300 W: 3 J, on forward -> aten::linear -> aten::addmm
    assert _gpu(p, *step, "forward", "aten::linear", "aten::addmm") == pytest.approx(3.0, rel=1e-9)
    # relu (stream 7) and the backward GEMM (stream 13) overlap for 2 ms: 2 ms alone + 2 ms / 2 each = 0.9 J
    assert _gpu(p, *step, "forward", "aten::relu") == pytest.approx(0.9, rel=1e-9)
    assert _gpu(p, *step, "backward", "aten::mm") == pytest.approx(0.9, rel=1e-9)
    # the sync point holds only its own copy (1 ms), not the forward's and backward's kernels
    assert _gpu(p, *step, "sync_point") == pytest.approx(0.3, rel=1e-9)
    assert _gpu(p, "[launch not in trace]") == pytest.approx(0.3, rel=1e-9)
    idle = _gpu(p, "[GPU idle]")
    assert idle == pytest.approx(30.0 - 5.4, rel=1e-9)  # 18 ms busy of 100 ms
    leaves = sum(n.self_energy_j.get("gpu:0", 0.0) for n, _ in p.walk())
    assert abs(leaves - 30.0) <= 1e-9 * 30.0
    forward = _node(p, *step, "forward")
    assert forward.file == "model.py" and forward.line == 20
    gpu = p.gpu_kernels
    assert gpu.devices["0"].busy_s == pytest.approx(0.018)  # the union: 10 + [20, 26) + 1 + 1 ms
    (row,) = [s for s in gpu.stacks if s.path[-1][0] == "aten::addmm"]
    assert row.kernels == [GpuKernelSum("ampere_sgemm_128x64_nn", 1, pytest.approx(0.010), pytest.approx(3.0))]
    # the report's GPU panel lists forward with its GEMM and its joules
    html = tmp_path / "g.html"
    assert run_cli(["report", str(out), "-o", str(html), "-q"], tmp_path).returncode == 0
    page = html.read_text()
    i = page.index('id="gpu"')
    assert "ampere_sgemm_128x64_nn" in page[i:] and "model.py:20" in page[i:]
    # a one-row log has no spacing to read an update period from: no error bar, nothing "short"
    assert gpu.devices["0"].short_j == 0.0


def test_power_offset_moves_the_log_against_the_trace(tmp_path):
    power = tmp_path / "power.csv"
    power.write_text("t_s,gpu:0\n0,300\n0.010,50\n")
    figures = {}
    for offset in ("0", "0.001"):
        out = tmp_path / f"o{offset}.json"
        r = run_cli(["gpu-trace", str(SYNTHETIC), "--power-trace", str(power), "--power-offset", offset,
                     "--json", str(out), "-q"], tmp_path)
        assert r.returncode == 0, r.stderr
        figures[offset] = _gpu(load(out), "<module>", "train_step", "forward", "aten::linear", "aten::addmm")
    # the GEMM runs over [1, 11) ms of the trace
    assert figures["0"] == pytest.approx(9e-3 * 300 + 1e-3 * 50, rel=1e-9)  # the log's 50 W row starts at 10 ms
    assert figures["0.001"] == pytest.approx(3.0, rel=1e-9)  # shifted 1 ms: 300 W over all of it


def test_report_and_compare_read_the_gpu_profile(tmp_path):
    power = tmp_path / "power.csv"
    power.write_text("t_s,gpu:2\n0,100\n0.002,300\n0.004,150\n0.006,250\n0.008,200\n")
    out, html = tmp_path / "mi.json", tmp_path / "mi.html"
    r = run_cli(["gpu-trace", str(MI250), "--power-trace", str(power), "--json", str(out), "-o", str(html)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "aten::mm" in r.stderr and "no Python stacks" in r.stderr  # the console: the trace's operators first
    assert html.stat().st_size > 0
    p = load(out)
    assert {"aten::mm", "[GPU idle]"} <= {n.function for n, _ in p.walk()}
    # the resolution note: every kernel here is far shorter than the log's 2 ms rows
    dev = p.gpu_kernels.devices["2"]
    assert dev.update_period_s == pytest.approx(0.002)
    assert dev.short_j == pytest.approx(dev.energy_j - dev.idle_j, rel=1e-9)
    again = tmp_path / "again.html"
    r = run_cli(["report", str(out), "-o", str(again), "-q"], tmp_path)
    assert r.returncode == 0, r.stderr
    page = again.read_text()
    assert 'id="gpu"' in page and "GPU kernels" in page and "Cijk_Ailk_Bjlk" in page  # the backward GEMM's kernel
    assert "split among the GPU&#39;s kernels by busy time" in page or "split among the GPU's kernels by busy time" in page
    r = run_cli(["compare", str(out), str(out)], tmp_path)
    assert r.returncode in (0, 1), r.stderr  # readable; the verdict is compare's own business
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args, words", [
    (["--power-trace", "{power_cpu}"], "no gpu:N column"),
    (["--power-trace", "{missing}"], "cannot read power trace"),
    (["--power-trace", "{power}", "--update-period", "0"], "--update-period"),
    (["--power-trace", "{power}"], "needs --json"),
    (["--power-trace", "{power}", "--power-offset", "nan"], "--power-offset"),
    (["--power-trace", "{power}", "--sensor-error", "1.5"], "--sensor-error"),
    (["--power-trace", "{power}", "--peak-power", "-3"], "--peak-power"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    (tmp_path / "cpu.csv").write_text("t_s,cpu\n0,10\n")
    (tmp_path / "p.csv").write_text("t_s,gpu:0\n0,10\n")
    subst = {"power_cpu": tmp_path / "cpu.csv", "missing": tmp_path / "nope.csv", "power": tmp_path / "p.csv"}
    full = [a.format(**subst) for a in args] + ([] if words == "needs --json" else ["--json", str(tmp_path / "o.json")])
    r = run_cli(["gpu-trace", str(SYNTHETIC), *full], tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0]


def test_a_file_that_is_not_a_trace_is_refused(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"schema": "something else"}))
    (tmp_path / "p.csv").write_text("t_s,gpu:0\n0,10\n")
    r = run_cli(["gpu-trace", str(bad), "--power-trace", str(tmp_path / "p.csv"), "--json", str(tmp_path / "o.json")],
                tmp_path)
    assert r.returncode == 2 and "traceEvents" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_console_lists_gpu_idle_and_each_lines_bar(tmp_path):
    power = tmp_path / "power.csv"
    power.write_text("t_s,gpu:0\n0,300\n")
    r = run_cli(["gpu-trace", str(SYNTHETIC), "--power-trace", str(power), "--json", str(tmp_path / "g.json")], tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    # 82% of the GPU's energy: no record busy (the summary's "top functions" leaves it out)
    (idle,) = [ln for ln in lines if ln.strip().endswith("[GPU idle]")]
    assert "24.6 J" in idle and "82.0%" in idle
    (device,) = [ln for ln in lines if ln.strip().startswith("gpu:0") and "kernels" in ln]
    assert "kernels 5.4 J (18.0%)" in device and "[GPU idle] 24.6 J (82.0%)" in device
    (forward,) = [ln for ln in lines if "forward  model.py:20" in ln and "\u00b1" in ln]
    assert "3.9 J \u00b1 195 mJ" in forward  # the GEMM and relu; a flat power: the sensor's 5% alone
    assert lines.index(idle) < [i for i, ln in enumerate(lines) if ln.startswith("energyprof: wrote")][0]


def test_the_console_and_the_page_give_the_same_figures_and_bars(tmp_path):
    """One computation: gpu-trace's console lists the report's GPU panel rows (analysis/gpu.py over the
    built profile), each with the page's joules and bar, and [GPU idle] with the profile's bar."""
    import html as html_module
    import re

    from energyprof.render.format import fmt_energy

    power = tmp_path / "power.csv"
    # power that changes inside the trace's busy spans: records of different lines share samples, so the
    # bars hold more than the sensor's error
    power.write_text("t_s,gpu:0\n0,300\n0.004,120\n0.021,260\n0.024,90\n0.060,200\n")
    out, page_path = tmp_path / "g.json", tmp_path / "g.html"
    r = run_cli(["gpu-trace", str(SYNTHETIC), "--power-trace", str(power), "--json", str(out), "-o", str(page_path)],
                tmp_path)
    assert r.returncode == 0, r.stderr
    row = re.compile(r"^\s+(\S+ \S+) \u00b1 (\S+ \S+)\s+\S+%\s+(.+)$")
    console = [m.groups() for m in map(row.match, r.stderr.splitlines()) if m and m.group(3) != "[GPU idle]"]
    page = page_path.read_text()
    section = page[page.index('id="gpu"'):]
    cells = re.findall(r"<tr><td><code>(.*?)</code></td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td>", section)
    panel = [(html_module.unescape(j), html_module.unescape(e),
              html_module.unescape(f) + (f"  {html_module.unescape(w)}" if w else "")) for f, w, j, e in cells]
    assert len(console) == min(8, len(panel)) >= 4
    assert console == panel[:len(console)]
    assert any(e not in ("0 J", "") for _, e, _ in console)
    # [GPU idle]: the profile's device figures and bar
    dev = load(out).gpu_kernels.devices["0"]
    (idle,) = [ln for ln in r.stderr.splitlines() if ln.strip().endswith("[GPU idle]") and "\u00b1" in ln]
    assert f"{fmt_energy(dev.idle_j)} \u00b1 {fmt_energy(dev.idle_error_j)}" in idle
