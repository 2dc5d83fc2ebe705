"""A lazy import inside a library call is an import group in the chart, as in the console."""

from __future__ import annotations

from conftest_report import CPU, build, profile_from

from energyprof.analysis.chart import grouped_tree

SITE = "/venv/lib/python3.11/site-packages/torch/"


def test_a_module_body_run_inside_a_library_call_is_its_own_import_group() -> None:
    dynamo = ("<module>", SITE + "_dynamo/__init__.py", {"cpu": 1.0}, 0.1, 10, [
        ("compile_fx", SITE + "_dynamo/convert.py", {"cpu": 3.0}, 0.3, 30, [])])
    step = ("SGD.__init__", SITE + "optim/sgd.py", {"cpu": 0.5}, 0.05, 5, [dynamo])
    script = ("<module>", "/home/u/lenet.py", {"cpu": 0.2}, 0.02, 2, [
        ("train", "/home/u/lenet.py", {"cpu": 2.0}, 0.2, 20, [step])])
    root = build(("<program>", "", {"cpu": 0.0}, 0.0, 0, [script]))
    chart = grouped_tree(profile_from(root, [CPU]))
    nodes = list(chart.preorder())
    library = next(n for n in nodes if n.kind == "group" and n.function.startswith("[library: torch]"))
    inside = [n for n in library.preorder() if n is not library and n.kind == "group"]
    assert [n.function for n in inside] == ["[import: torch._dynamo]"]
    lazy = inside[0]
    assert lazy.value_e == 4.0  # the module body and what it ran, not the optimizer's 0.5 J
    body = next(n for n in lazy.children if n.function == "<module>")
    assert body.group is lazy and all(c.group is lazy for c in body.children)
    sgd = next(n for n in library.children if n.function == "SGD.__init__")
    assert sgd.group is library and sum(sgd.self_e.values()) == 0.5
