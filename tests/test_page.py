"""The report page written by render/page.py: program strings escaped in every section it writes,
and the file's bytes the same page as the string."""

from __future__ import annotations

from types import SimpleNamespace

from conftest_report import XSS_FUNCTION, hostile_profile, small_profile

from energyprof.analysis.report import RenderOptions, build
from energyprof.record import replace
from energyprof.render import html as html_module
from energyprof.render.html import render_html, render_html_bytes
from energyprof.render.format import esc
from energyprof.render.page import truncate
from energyprof.render.registry import renderers
from energyprof.store.files import FileBytes


def test_the_file_is_the_page_as_utf8() -> None:
    model = build(hostile_profile(), RenderOptions())
    page = render_html(model)
    assert render_html_bytes(model) == page.encode("utf-8")
    parts = renderers()["output"](model)  # written part after part, plotly.js copied from its file
    assert b"".join(p.read() if isinstance(p, FileBytes) else p for p in parts) == page.encode("utf-8")
    assert page.count("</script>") == 3  # data, plotly.js and report.js: nothing of the program's closes one


def test_escapes_the_five_characters_and_truncates_at_a_word() -> None:
    assert esc("<a href=\"x\" title='y'>&</a>") == "&lt;a href=&#34;x&#34; title=&#39;y&#39;&gt;&amp;&lt;/a&gt;"
    assert truncate("short") == "short"
    long = "volta_sgemm " + "word " * 30
    cut = truncate(long)
    assert cut.endswith("...") and len(cut) <= 90 and long.startswith(cut[:-3])


def test_program_strings_are_text_in_windows_training_gpu_and_methodology(monkeypatch) -> None:
    model = build(small_profile(), RenderOptions())
    evil = XSS_FUNCTION
    epoch = {"epoch": 0, "steps": 2, "fetch_s": 0.1, "compute_s": 0.2, "stall_s": None, "fetch_j": 1.0, "compute_j": 2.0}
    loop = {"stall_definition": evil, "step_energy_j": {"mean": 1.0, "stdev": 0.1, "n": 2}, "epochs": [epoch]}
    model.training = {evil: loop}
    model.training_ranks = {evil: {0: loop, 1: loop}}
    model.meta["host"] = {"cpu_model": evil, "cores": 2}
    model.meta["exit"] = {"status": evil}
    kernel = SimpleNamespace(name=evil, count=1, time_s=0.1, joules=0.5)
    device = SimpleNamespace(source=evil, energy_j=1.0, idle_j=0.1, busy_s=0.5, update_period_s=0.1, short_share=0.5)
    panel = {"devices": [device], "functions": [{"function": evil, "file": evil, "line": 1, "joules": 1.0, "error_j": 0.1,
                                                  "busy_s": 0.1, "kernels": [kernel]}], "more": 0}
    monkeypatch.setattr(html_module, "_gpu_panel", lambda m: panel)
    if model.window_groups:
        model.window_groups = [replace(model.window_groups[0], name=evil)]
    page = render_html(model)
    assert evil not in page
    shown = esc(evil)
    for section in ('id="gpu"', "Training loop: " + shown, "Training loop per rank: " + shown, "exit: " + shown,
                    "<dt>host</dt><dd>" + shown + ", 2 cores"):
        assert section in page, section
    assert "&ndash;</td>" in page  # a rank whose stall was not measured shows a dash, not 0


def test_a_window_row_shows_the_programs_energy_and_the_machines_in_its_own_column() -> None:
    """One number per window: its group's figures are the program's part of the span (the kind of
    figure the program's total is), the machine's mean is its own column, never mixed."""
    import re

    from energyprof.facts.profile import Node
    from energyprof.facts.profile import Profile

    windows = [{"name": "epoch", "index": i, "depth": 0, "start_s": float(i), "end_s": i + 1.0, "time_s": 1.0,
                "energy_j": {"cpu": 40.0 + 2 * i}, "program_energy_j": {"cpu": 27.0 + 3 * i}} for i in range(2)]
    p = Profile(meta={"target": "t"}, sources=[{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "rapl",
                                                 "detail": {}, "update_period_s": 0.001}],
                totals={"energy_j": {"cpu": 82.0}, "attributed_j": {"cpu": 57.0}, "duration_s": 2.0},
                root=Node("t", energy_j={"cpu": 57.0}, self_energy_j={"cpu": 57.0}), windows=windows)
    model = build(p)
    (epoch,) = model.window_groups
    assert (epoch.total_j, epoch.mean_j, epoch.min_j, epoch.max_j) == (57.0, 28.5, 27.0, 30.0)  # the program's
    assert epoch.machine_mean_j == 41.0  # the machine's: 40 and 42 J
    page = render_html(model)
    table = page[page.index('<section id="windows"'):page.index("<details>", page.index('<section id="windows"'))]
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", table, flags=re.S)]
    assert cells[0] == "epoch" and cells[2] == "57 J" and cells[3] == "28.5 J" and cells[-1] == "41 J", cells
    assert "machine per window" in table
    each = page[page.index("Each window"):]
    assert "27 J</td><td>40 J" in each and "30 J</td><td>42 J" in each  # program, then machine, per window


def test_a_name_with_a_lone_surrogate_is_escaped_in_the_page_and_every_export(monkeypatch) -> None:
    """Defect: a kernel or function name holding a lone surrogate ("\\ud800", which has no UTF-8 form) broke
    the page (the JSON was written). Names are escaped whatever their code points: the page shows the
    escape as text, its data block gives the scripts the name itself, and every export is written."""
    import gzip

    from energyprof.render.html import unpacked_json

    p = small_profile()
    bad = "bad\ud800name"
    node = next(n for n, d in p.walk() if d == 2)
    node.function, node.file = bad, "/src/f\udfffile.py"
    p.meta["target"] = "t\ud800.py"
    model = build(p, RenderOptions())
    kernel = SimpleNamespace(name="volta\ud800sgemm", count=1, time_s=0.1, joules=0.5)
    device = SimpleNamespace(source="gpu:0", energy_j=1.0, idle_j=0.1, busy_s=0.5, update_period_s=0.1, short_share=0.5)
    panel = {"devices": [device], "functions": [{"function": bad, "file": "f.py", "line": 1, "joules": 1.0,
                                                  "error_j": 0.1, "busy_s": 0.1, "kernels": [kernel]}], "more": 0}
    monkeypatch.setattr(html_module, "_gpu_panel", lambda m: panel)
    page = render_html_bytes(model).decode("utf-8")  # valid UTF-8, no surrogate in it
    assert render_html(model) == page  # the page as a string (a notebook shows it) is the same
    assert "volta\\ud800sgemm" in page and "t\\ud800.py" in page
    block = page.split('data-encoding="deflate">', 1)[1].split("</script>", 1)[0]
    names = repr(unpacked_json(block))  # repr shows a lone surrogate as \ud800, a backslash as \\
    assert "bad\\ud800name" in names and "bad\\\\ud800name" not in names  # the scripts get the name as it was
    table = renderers()
    for name in ("json", "speedscope", "folded", "csv", "pprof"):
        out = table[name](model)
        raw = out if isinstance(out, bytes) else out.encode("utf-8", "backslashreplace")
        if name == "pprof":
            raw = gzip.decompress(raw)
        assert b"ud800" in raw, name
