"""The chart's first screen: a lazy import inside a library call is an import group, as in the console;
a wrapper that only calls one function shares its box with it."""

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


def test_a_wrapper_that_only_calls_one_function_shares_its_box() -> None:
    """`<module>` -> main -> (crunch, tidy): one labelled box for `<module> › main`, crunch a row higher."""
    from energyprof.analysis.report import RenderOptions
    from energyprof.analysis.report import build as build_model
    from energyprof.render.charts import icicle_trace

    me = "/home/u/quickstart.py"
    main = ("main", me, {}, 0.0, 0, [("crunch", me, {"cpu": 20.0}, 2.0, 200, []),
                                     ("tidy", me, {"cpu": 5.0}, 0.5, 50, [])])
    root = build(("<program>", "", {"cpu": 0.0}, 0.0, 0, [("<module>", me, {}, 0.0, 0, [main])]))
    model = build_model(profile_from(root, [CPU]), RenderOptions())
    trace = icicle_trace(model, model.chart)
    labels = [label or model.rows[row].function for label, row in zip(trace["labels"], trace["row"])]  # "": its row's name
    assert "&lt;module&gt; \u203a main" in labels and "main" not in labels
    box = labels.index("&lt;module&gt; \u203a main")
    assert trace["through"][str(box)] == "&lt;module&gt;"  # the page's tooltip says "called through" it
    crunch, tidy = labels.index("crunch"), labels.index("tidy")
    assert trace["parents"][crunch] == trace["parents"][tidy] == box and trace["parents"][box] == 0
    assert trace["row"][box] == next(i for i, r in enumerate(model.rows) if r.function == "main")
    value = trace["value_e"]["v"]  # scaled by one power of ten for the whole column
    assert value[box] == value[crunch] + value[tidy]
