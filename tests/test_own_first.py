"""The user's code first: the summary lists the program's own functions by total energy and folds
everything else into the library or import it ran in (analysis/own.py), through the real CLI too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from energyprof.analysis.own import home_groups, module_name, own_first
from energyprof.analysis.report import build
from energyprof.facts.profile import Node
from energyprof.facts.profile import Profile
from energyprof.facts.profile import Window
from energyprof.render.console import render_summary

from conftest import run_cli
from test_report_browser import Page, browser  # noqa: F401 - the fixture, asked for by name below

SITE = "/venv/lib/python3.11/site-packages"
BOOT = "<frozen importlib._bootstrap>"


def n(function: str, file: str, joules: float = 0.0, children: list[Node] | None = None, samples: int = 0) -> Node:
    return Node(function, file, 1, self_energy_j={"cpu": joules} if joules else {}, self_samples=samples,
                self_time_s=joules / 10, children=children or [])


def lenet_like() -> Profile:
    """A training script's shape: `import torch` at the top, a lazy import of torch._dynamo inside
    torch's SGD.__init__, the user's forward called back from torch's Module.__call__."""
    torch_import = n("_find_and_load", BOOT, 0.5, [n("<module>", f"{SITE}/torch/__init__.py", 30.0, [
        n("_find_and_load", BOOT, 0.0, [n("<module>", f"{SITE}/torch/nn/__init__.py", 5.0)])])])
    sgd = n("SGD.__init__", f"{SITE}/torch/optim/sgd.py", 1.0, [
        n("_find_and_load", BOOT, 0.0, [n("<module>", f"{SITE}/torch/_dynamo/__init__.py", 20.0)])])
    step = n("train_step", "/proj/train.py", 2.0, [
        n("Module._call_impl", f"{SITE}/torch/nn/modules/module.py", 4.0, [n("forward", "/proj/model.py", 6.0, [
            n("conv2d", f"{SITE}/torch/nn/functional.py", 12.0)])]),
        n("backward", f"{SITE}/torch/_tensor.py", 10.0)])
    main = n("main", "/proj/train.py", 0.5, [sgd, step, step_copy(step)])
    root = Node("/proj/train.py", children=[n("<module>", "/proj/train.py", 0.0, [torch_import, main]),
                                            n("<module>", "<string>", 0.5)])
    root.fill_inclusive()
    total = sum(node.self_total_energy for node, _ in root.walk())
    return Profile(meta={"idle_policy": "share", "target": "/proj/train.py"},
                   sources=[{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "rapl"}],
                   totals={"energy_j": {"cpu": total}, "attributed_j": {"cpu": total}, "duration_s": 10.0}, root=root)


def step_copy(step: Node) -> Node:
    """A second call path of train_step (another loop): a row merges both."""
    import copy

    return copy.deepcopy(step)


def test_the_users_functions_come_first_by_total_energy_and_the_rest_folds_into_groups() -> None:
    model = build(lenet_like())
    names = [r.function for r in model.top]
    assert names == ["<module>", "main", "train_step", "forward"]
    # inclusive: main holds SGD and two steps
    assert [r.total_energy for r in model.top] == pytest.approx([125.0, 89.5, 2 * 34.0, 2 * 18.0])
    groups = {g.label: g.total for g in model.groups}
    # the lazy import inside SGD.__init__ is an import, named by the module it imported
    assert groups["[import: torch._dynamo]"] == pytest.approx(20.0)
    assert groups["[import: torch]"] == pytest.approx(35.0)  # torch and torch.nn, imported by the script
    assert groups["[library: torch]"] == pytest.approx(1.0 + 2 * (4.0 + 12.0 + 10.0))  # conv2d under forward too
    assert groups["[import]"] == pytest.approx(0.5)  # importlib's own frames, before torch's module body
    # every joule is either the user's own or in one group, once
    own_self = sum(r.self_total_energy for r in model.top)
    assert own_self + sum(groups.values()) == pytest.approx(sum(model.totals.attributed_j.values()))
    assert "[other code: <string>]" in groups  # exec'd code is not the program's folder


def test_the_console_opens_on_the_users_functions() -> None:
    text = render_summary(build(lenet_like()))
    head = text[text.index("your functions by total energy"):]
    rows = [line.split()[-2] for line in head.splitlines()[1:5]]
    assert rows == ["<module>", "main", "train_step", "forward"]
    assert "outside your code" in head and "[import: torch._dynamo]" in head and "[library: torch]" in head


def test_a_group_counts_its_functions_and_knows_its_heaviest() -> None:
    model = build(lenet_like())
    by_label = {g.label: g for g in model.groups}
    torch = by_label["[library: torch]"]
    # SGD.__init__, the import machinery it entered (0 J there), Module._call_impl, conv2d and backward
    assert torch.count == 5
    conv2d = ("conv2d", f"{SITE}/torch/nn/functional.py", 1)
    backward = ("backward", f"{SITE}/torch/_tensor.py", 1)
    assert torch.heaviest(2) == [(conv2d, pytest.approx(24.0), 0), (backward, pytest.approx(20.0), 0)]
    # a function in several groups folds once, under the one it spent the most in: importlib's
    # _find_and_load spent 0.5 J in [import] and nothing inside torch or its import
    home = home_groups(model.groups)
    assert model.groups[home[("_find_and_load", BOOT, 1)]].label == "[import]"
    assert model.groups[home[conv2d]].label == "[library: torch]"
    assert not any(r.function in home for r in model.own)  # the user's functions are never folded
    assert ("forward", "/proj/model.py", 1) not in home


def test_the_console_gives_each_group_its_count_and_its_heaviest_functions_beneath() -> None:
    lines = render_summary(build(lenet_like())).splitlines()
    at = next(i for i, line in enumerate(lines) if "[library: torch]" in line)
    assert lines[at].endswith("[library: torch] 5 functions")
    beneath = lines[at + 1:at + 4]
    assert [line.split()[-2] for line in beneath] == ["conv2d", "backward", "Module._call_impl"]
    assert all(line.startswith("      ") and not line.startswith("       " * 3) for line in beneath)
    assert "24 J" in beneath[0] and "torch/nn/functional.py:1" in beneath[0]
    # the group's figure is the sum of its functions' self energy there: 1 + 2 x (4 + 12 + 10)
    assert lines[at].split()[:2] == ["53", "J"]


def test_module_names() -> None:
    assert module_name(f"{SITE}/torch/_dynamo/__init__.py") == "torch._dynamo"
    assert module_name(f"{SITE}/torch/nn/functional.py") == "torch.nn.functional"
    assert module_name("/usr/lib/python3.11/json/decoder.py") == "json.decoder"


def test_a_profile_without_a_script_path_keeps_every_non_library_frame_as_the_users() -> None:
    prof = lenet_like()
    prof.meta["target"] = "<cell>"
    mine, _ = own_first(prof, build(prof).rows)
    assert {r.function for r in mine} >= {"main", "train_step", "forward"}


def test_a_real_run_lists_the_scripts_functions_not_the_imports(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("def work(n):\n    return sum(i * i for i in range(n))\n")
    (tmp_path / "prog.py").write_text("import json, decimal\nfrom helper import work\n"
                                      "def outer():\n    return work(3_000_000)\nouter()\n")
    (tmp_path / "t.csv").write_text("t_s,cpu\n0,40\n")
    res = run_cli(["--power-trace", "t.csv", "--interval", "0.002", "-o", "/dev/null", "prog.py"], tmp_path)
    assert res.returncode == 0, res.stderr
    head = res.stderr[res.stderr.index("your functions by total energy"):].splitlines()[1:]
    funcs = [line.split()[-2] for line in head if line.startswith("    ") and "[" not in line]
    assert {"outer", "work"} <= set(funcs[:4]), res.stderr


@pytest.mark.browser
def test_the_table_opens_on_the_users_functions_by_total_energy(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    chromium = request.getfixturevalue("browser")
    from energyprof.render.html import render_html

    path = tmp_path / "r.html"
    path.write_text(render_html(build(lenet_like())), encoding="utf-8")
    page = Page(chromium)
    page.open(path)
    assert page.first_column()[:4] == ["<module>", "main", "train_step", "forward"]
    assert page.page.get_attribute("#fn-head th[data-key=tot_e]", "aria-sort") == "descending"
    page.page.click("#fn-head th[data-key=self_e]")  # a click sorts every row: torch's module body leads
    page.page.wait_for_function("() => document.querySelector('#fn-head th[data-key=self_e]')"
                                ".getAttribute('aria-sort') === 'descending'")
    assert page.first_column()[0] == "<module>" and "torch" in page.page.eval_on_selector(
        "#fn-body tr td.fn .where", "e => e.title")
    assert page.errors == []
    page.close()


def test_how_a_figure_was_made_is_in_methodology_not_above_the_chart() -> None:
    from energyprof.facts.profile import Note
    from energyprof.render.html import render_html

    prof = lenet_like()
    prof.notes = [Note("wait-cpu", "0.642 CPU-s that threads were seen with while sampled in a wait went elsewhere"),
                  Note("checkpoint", "rebuilt from a checkpoint: the run ended without writing its profile")]
    page = render_html(build(prof))
    chart = page.index('<section id="chart"')
    method = page.index('<section id="methodology"')
    wait, checkpoint = page.index("0.642 CPU-s"), page.index("rebuilt from a checkpoint")
    assert wait > method  # jargon: in Methodology
    assert checkpoint < chart  # a warning that figures may be off stays above the chart


@pytest.mark.browser
def test_the_table_folds_libraries_and_imports_under_their_group_until_opened(tmp_path: Path,
                                                                           request: pytest.FixtureRequest) -> None:
    chromium = request.getfixturevalue("browser")
    from energyprof.render.html import render_html

    model = build(lenet_like())
    path = tmp_path / "r.html"
    path.write_text(render_html(model), encoding="utf-8")
    page = Page(chromium)
    page.open(path)
    p = page.page
    rows = "() => [...document.querySelectorAll('#fn-body tr')].map(r => [r.className, r.querySelector('.name').textContent])"
    shown = p.evaluate(rows)
    groups = [name for cls, name in shown if cls.startswith("group")]
    # the user's functions, then one row per group, largest first, each with its count; nothing of torch's in between
    assert [name for _, name in shown[:4]] == ["<module>", "main", "train_step", "forward"]
    assert groups == ["\u25b8 " + g.label for g in model.groups]
    assert not any(name in ("conv2d", "backward", "SGD.__init__") for _, name in shown)
    torch = next(i for i, (_, name) in enumerate(shown) if name.endswith("[library: torch]"))
    cells = p.eval_on_selector_all("#fn-body tr", "rs => rs.map(r => [...r.children].map(c => c.textContent))")[torch]
    assert cells[0].endswith("5 functions") and cells[1].endswith("53 J")  # 1 + 2 x (4 + 12 + 10)
    p.click(f"#fn-body tr >> nth={torch}")  # opens it: its functions beneath it by self energy
    shown = p.evaluate(rows)
    assert shown[torch] == ["group open", "\u25be [library: torch]"]
    members = [name for cls, name in shown[torch + 1:] if cls == "member"]
    assert members[:3] == ["conv2d", "backward", "Module._call_impl"]
    p.click(f"#fn-body tr >> nth={torch}")  # and folds it again
    assert "conv2d" not in [name for _, name in p.evaluate(rows)]
    # a box clicked in the chart for a folded function opens its group and selects it
    p.uncheck("#chart-collapse")
    p.locator("#icicle g.slice", has_text="conv2d").last.click()  # the frame's box, under its group's
    p.wait_for_function("() => document.querySelector('#fn-body tr.selected .name')")
    assert p.text_content("#fn-body tr.selected .name") == "conv2d"
    assert p.get_attribute("#fn-body tr.selected", "class") == "member selected"
    assert page.errors == []
    page.close()


@pytest.mark.browser
def test_idle_above_the_programs_energy_reads_as_a_multiple_never_above_100_percent(tmp_path: Path,
                                                                                      request: pytest.FixtureRequest) -> None:
    chromium = request.getfixturevalue("browser")
    from energyprof.facts.profile import IDLE_NODE
    from energyprof.render.html import render_html

    prof = lenet_like()
    program = sum(prof.totals.attributed_j.values())
    prof.root.children.append(Node(IDLE_NODE, self_energy_j={"cpu": 1.53 * program}))
    prof.root.fill_inclusive()
    prof.totals.energy_j = {"cpu": 2.53 * program}
    path = tmp_path / "r.html"
    path.write_text(render_html(build(prof)), encoding="utf-8")
    page = Page(chromium)
    page.open(path)
    cells = page.page.eval_on_selector_all("#fn-body tr", "rs => rs.map(r => [...r.children].map(c => c.textContent))")
    idle = next(c for c in cells if IDLE_NODE in c[0])
    assert "1.5\u00d7 the program" in idle
    assert not any(c.endswith("%") and float(c.rstrip("%")) > 100 for row in cells for c in row[1:] if c[:1].isdigit())
    page.close()


def test_nothing_is_rendered_for_dev_null_and_no_run_needs_jinja2(tmp_path: Path) -> None:
    """`-o /dev/null` asks for no page: a run with jinja2 unimportable still succeeds; and the page
    asked for by name is written without it too (jinja2's import alone was ~17 ms of the fixed cost)."""
    import os

    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['jinja2'] = None  # as if not installed\n")
    (tmp_path / "prog.py").write_text("pass\n")
    (tmp_path / "t.csv").write_text("t_s,cpu\n0,40\n")
    env = {"PYTHONPATH": os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")])}
    res = run_cli(["--power-trace", "t.csv", "-o", os.devnull, "--json", "p.json", "prog.py"], tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "p.json").is_file() and "error" not in res.stderr
    res = run_cli(["-q", "--power-trace", "t.csv", "-o", "r.html", "prog.py"], tmp_path, env=env)
    assert res.returncode == 0 and "could not write" not in res.stderr, res.stderr
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<bdi>prog.py</bdi>" in page and 'id="report-data"' in page and page.rstrip().endswith("</html>")


def test_compare_labels_per_side_and_command_lines_relative_to_here(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "prog.py").write_text("pass\n")
    (work / "t.csv").write_text("t_s,cpu\n0,40\n")
    for i in range(4):  # absolute paths on the command line, as a script or CI would give them
        res = run_cli(["-q", "--power-trace", str(work / "t.csv"), "-o", "/dev/null", "--json", f"r{i}.json",
                       str(work / "prog.py")], work)
        assert res.returncode == 0, res.stderr
    res = run_cli(["compare", "--base", "r0.json", "r1.json", "--head", "r2.json", "r3.json",
                   "--label", "main", "--label", "feature"], work)
    assert res.returncode == 0, res.stderr
    runs = [line.strip().split("  ")[0] for line in res.stdout.splitlines() if re.match(r"  \[\d+\] ", line)]
    assert runs == ["[0] main #1", "[1] main #2", "[2] feature #1", "[3] feature #2"]
    res = run_cli(["compare", "r0.json", "r1.json"], work)
    assert str(tmp_path) not in res.stdout  # labels, functions and files: no absolute path
    assert "--power-trace t.csv -o /dev/null --json r0.json prog.py" in res.stdout
    res = run_cli(["compare", "--base", "r0.json", "--head", "r1.json", "r2.json", "--label", "a", "--label", "b",
                   "--label", "c", "--label", "d"], work)
    assert res.returncode == 2 and "one per side" in res.stderr and res.stderr.count("\n") == 1


def test_the_differential_icicle_leaves_idle_and_energyprof_out_until_asked() -> None:
    from energyprof.analysis.compare import compare
    from energyprof.facts.profile import IDLE_NODE
    from energyprof.facts.profile import SELF_NODE
    from energyprof.render.compare import figures, render_html

    runs = []
    for scale in (1.0, 1.3):
        prof = lenet_like()
        prof.root.children += [Node(IDLE_NODE, self_energy_j={"cpu": 500.0 * scale}),
                               Node(SELF_NODE, self_energy_j={"cpu": 5.0},
                                    children=[Node("tick", "ep.py", 1, self_energy_j={"cpu": 1.0})])]
        prof.root.fill_inclusive()
        runs.append(prof)
    figs = figures(compare(runs))
    shown = figs["icicle"]["data"][0]["labels"]
    everything = figs["icicle_all"]["data"][0]["labels"]
    assert IDLE_NODE not in shown and SELF_NODE not in shown and "tick" not in shown and "train_step" in shown
    assert {IDLE_NODE, SELF_NODE, "tick"} <= set(everything)
    assert 'id="diff-outside"' in render_html(compare(runs))  # the toggle that shows them


def test_compares_window_table_and_plot_show_the_same_number_the_programs() -> None:
    from energyprof.analysis.compare import compare
    from energyprof.render.compare import render_text

    runs = []
    for machine, program in ((39.6, 27.0), (44.0, 30.0)):
        prof = lenet_like()
        prof.windows = [Window(name="epoch:bs32", index=0, start_s=0.0, end_s=1.0, time_s=1.0,
                               energy_j={"cpu": machine}, program_energy_j={"cpu": program})]
        runs.append(prof)
    cmp = compare(runs, windows="epoch")
    (row,) = cmp.windows
    assert row.program and row.mean_j == pytest.approx([27.0, 30.0])  # not the machine's 39.6 J
    assert sorted(p.energy_j for p in cmp.sweep_points) == pytest.approx([27.0, 30.0])
    assert "mean program energy per window" in render_text(cmp)


def test_repeats_of_one_side_are_one_point_with_their_spread_and_no_front_tags() -> None:
    import statistics

    from energyprof.analysis.compare import compare
    from energyprof.render.compare import figures, render_html, render_text

    runs = []
    for scale in (1.0, 1.1, 0.9, 1.5, 1.6, 1.4):
        prof = lenet_like()
        prof.totals.attributed_j = {"cpu": 100.0 * scale}
        prof.totals.duration_s = 10.0 * scale
        runs.append(prof)
    cmp = compare(runs, base_count=3)
    pts = figures(cmp)["scatter"]["data"][0]
    assert pts["x"] == pytest.approx([10.0, 15.0]) and pts["y"] == pytest.approx([100.0, 150.0])
    assert pts["error_y"]["array"] == pytest.approx([statistics.stdev([100.0, 110.0, 90.0]),
                                                     statistics.stdev([150.0, 160.0, 140.0])])
    assert pts["text"] == ["base (3 runs)", "head (3 runs)"]
    assert "Pareto front" not in render_text(cmp) and "tag measured\">Pareto front" not in render_html(cmp)
