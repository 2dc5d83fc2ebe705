"""The chart's first screen: a lazy import inside a library call is an import group, as in the console;
a wrapper that only calls one function shares its box with it; a Ray or Dask job opens on its tasks, the
engine's start-up one folded box."""

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


# --- engines: a Ray or Dask job opens on its tasks ----------------------------------------------------
RAY = "/venv/lib/python3.11/site-packages/ray/"
DIST = "/venv/lib/python3.11/site-packages/distributed/"
STD = "/usr/lib/python3.11/"
JOB = "/home/u/job.py"


def _worker(pid: int, task_j: float) -> tuple:
    """A Ray worker: its own start (importing ray) and one task, `burn`, that ran on it."""
    return (f"[ray worker {pid}]", "", {}, 0.0, 0, [
        ("<module>", RAY + "_private/workers/default_worker.py", {"cpu": 1.0}, 0.1, 10, [
            ("<module>", RAY + "__init__.py", {"cpu": 3.0}, 0.3, 30, []),
            ("Worker.main_loop", RAY + "_private/worker.py", {"cpu": 0.5}, 0.05, 5, [])]),
        ("[ray task burn]", "", {}, 0.0, 0, [("burn", JOB, {"cpu": task_j}, task_j / 10, 100, [])])])


def ray_job() -> object:
    """ray.init started the raylet (from Popen), which started two workers; `burn` ran on both. A daemon
    the engine started from a process of its own sits at the root."""
    raylet = ("[ray daemon raylet]", "", {"cpu": 2.0}, 0.2, 0, [_worker(41, 6.0), _worker(42, 4.0)])
    init = ("init", RAY + "_private/worker.py", {"cpu": 1.0}, 0.1, 10, [
        ("Popen._execute_child", STD + "subprocess.py", {"cpu": 0.5}, 0.05, 5, [raylet])])
    module = ("<module>", JOB, {"cpu": 0.5}, 0.05, 5, [init, ("<module>", RAY + "__init__.py", {"cpu": 5.0}, 0.5, 50, [])])
    root = build(("<program>", "", {}, 0.0, 0, [module, ("[ray daemon runtime_env agent]", "", {"cpu": 1.5}, 0.1, 0, [])]))
    return profile_from(root, [CPU], meta={"target": JOB})


def dask_job() -> object:
    """LocalCluster started two worker processes (one node, counted); `work`, shipped by value by cloudpickle
    (file `<dynamic-code>`), ran on each worker's task thread."""
    def thread(n: int, j: float) -> tuple:
        return (f"[threads: {n}-Dask-Default-Threads x1]", "", {}, 0.0, 0, [
            ("[dask task work]", "", {}, 0.0, 0, [("work", "<dynamic-code>", {"cpu": j}, j / 10, 100, [])])])

    workers = ("[processes: dask worker x2]", "", {}, 0.0, 0, [
        ("<module>", JOB, {"cpu": 0.4}, 0.04, 4, [("<module>", DIST + "__init__.py", {"cpu": 2.0}, 0.2, 20, [])]),
        thread(0, 5.0), thread(1, 3.0)])
    cluster = ("LocalCluster.__init__", DIST + "deploy/local.py", {"cpu": 0.5}, 0.05, 5, [
        ("Condition.wait", STD + "threading.py", {}, 0.0, 0, [workers])])
    module = ("<module>", JOB, {"cpu": 0.2}, 0.02, 2, [cluster])
    return profile_from(build(("<program>", "", {}, 0.0, 0, [module])), [CPU], meta={"target": JOB})


def _check_opens_on_tasks(model, unit: str, function: str, task_j: float, engine: str) -> None:
    chart = model.chart
    first = {c.function: c for c in chart.children}
    assert unit in first, sorted(first)  # the task at the top, beside the program's own code
    assert first[unit].value_e == task_j and {c.function for c in first[unit].children} == {function}
    assert chart.value_e == model.profile.root.total_energy  # nothing lost or counted twice
    units = [n for n in chart.preorder() if n.function.startswith(("[ray task", "[dask task"))]
    assert units == [first[unit]]  # every run, on every worker, in one box
    boxes = [n for n in chart.preorder() if n.kind == "group" and "start-up" in n.function]
    assert [b.function for b in boxes] == [f"[{engine} start-up]"]
    (box,) = boxes
    inside = [n for n in box.preorder() if n is not box]
    assert inside and all(n.group is box and n.kind in ("library", "import") for n in inside)  # folds as one box
    assert function in {r.function for r in model.top}  # the task's function among the user's, with its share
    assert sum(r.total_energy for r in model.own if r.function == function) == task_j


def test_a_ray_job_opens_on_its_tasks_with_the_start_up_one_folded_box() -> None:
    from energyprof.analysis.report import build as build_model

    model = build_model(ray_job())
    _check_opens_on_tasks(model, "[ray task burn]", "burn", 10.0, "ray")
    box = next(n for n in model.chart.preorder() if n.function == "[ray start-up]")
    names = {n.function for n in box.preorder()}
    assert {"[ray worker 41]", "[ray worker 42]", "[ray daemon raylet]", "[ray daemon runtime_env agent]"} <= names
    from energyprof.render.charts import icicle_trace

    trace = icicle_trace(model, model.chart)  # the page's boxes: the task one level under the program
    labels = [label or model.rows[row].function for label, row in zip(trace["labels"], trace["row"])]
    task = next(i for i, label in enumerate(labels) if label.startswith("[ray task burn]"))
    assert trace["parents"][task] == 0 and "[ray start-up]" in labels


def test_a_dask_job_opens_on_its_tasks_and_code_shipped_by_value_is_the_users() -> None:
    from energyprof.analysis.report import build as build_model

    model = build_model(dask_job())
    _check_opens_on_tasks(model, "[dask task work]", "work", 8.0, "dask")
    box = next(n for n in model.chart.preorder() if n.function == "[dask start-up]")
    assert "[processes: dask worker x2]" in {n.function for n in box.preorder()}


def test_the_processes_table_names_engine_processes_by_role() -> None:
    from energyprof.analysis.report import build as build_model
    from energyprof.facts.records import Process
    from energyprof.record import replace
    from energyprof.render.cards import process_rows

    raylet = RAY + "core/src/ray/raylet/raylet --raylet_socket_name=/tmp/ray/s"
    worker = "/usr/bin/python3 " + RAY + "_private/workers/default_worker.py --node-ip-address=127.0.0.1"
    spawn = "/usr/bin/python3 -B -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)"
    procs = [Process(1, None, "python job.py", "main"), Process(2, 1, raylet, "ray daemon raylet"),
             Process(3, 2, worker, "ray worker"), Process(4, 1, spawn, "dask worker"), Process(5, 1, spawn),
             Process(6, 1, worker)]
    profile = replace(ray_job(), processes=procs)
    roles = [r["role"] for r in process_rows(build_model(profile))["rows"]]
    # the role the facts hold, never one read again from the command line (pid 6 says child, as its JSON does)
    assert roles == ["the program", "ray daemon raylet", "ray worker", "dask worker", "child", "child"]
    from energyprof.engines.roles import process_role

    assert process_role(spawn, "[processes: dask worker]") == "dask worker" and process_role(spawn) is None


def test_a_childs_engine_role_is_a_fact_the_page_and_the_json_share(tmp_path) -> None:
    """An in-process profile's child whose command line names it a Ray worker: its role is taken where the
    collector first sees it, so the processes table, the profile's JSON and its re-render all say so."""
    import json
    import subprocess
    import sys

    from energyprof.analysis.report import build as build_model
    from energyprof.collect.collector import LocalFeed
    from energyprof.collect.probes import OwnClocks
    from energyprof.core.ledger import Ledger
    from energyprof.core.tree import build_profile
    from energyprof.facts.profile import load
    from energyprof.render.cards import process_rows

    script = tmp_path / "ray" / "_private" / "workers" / "default_worker.py"
    script.parent.mkdir(parents=True)
    script.write_text("import sys\nsys.stdin.read()\n")  # lives until its stdin closes
    child = subprocess.Popen([sys.executable, str(script), "--node-ip-address=127.0.0.1"], stdin=subprocess.PIPE)
    try:
        led = Ledger([{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}])
        feed = LocalFeed(led, OwnClocks())
        feed._poll_live_children()
    finally:
        child.communicate(b"")
    assert feed.child_processes[child.pid]["role"] == "ray worker"
    profile = build_profile(led, "share", {"target": "job.py"}, child_processes=feed.child_processes.values())
    (proc,) = [p for p in profile.processes if p.pid == child.pid]
    assert proc.role == "ray worker"
    profile.save(tmp_path / "p.json")
    (saved,) = [p for p in json.loads((tmp_path / "p.json").read_text())["processes"] if p["pid"] == child.pid]
    assert saved["role"] == "ray worker"
    for model in (build_model(profile), build_model(load(tmp_path / "p.json"))):
        (row,) = [r for r in process_rows(model)["rows"] if r["pid"] == child.pid]
        assert row["role"] == "ray worker"


def test_an_old_files_children_get_their_role_where_the_rows_are_built() -> None:
    """A file written before processes were kept lists children under `child_processes`, with no role: the
    analysis that builds the rows from it takes the role by the collector's rule, once, for every view."""
    from energyprof.analysis.report import build as build_model
    from energyprof.analysis.report import processes_of
    from energyprof.record import replace
    from energyprof.render.cards import process_rows

    worker = "/usr/bin/python3 " + RAY + "_private/workers/default_worker.py --node-ip-address=127.0.0.1"
    old = replace(ray_job(), processes=[], extra={"child_processes": [{"pid": 7, "command": worker, "cpu_time_s": 1.0},
                                                                      {"pid": 8, "command": "sleep 1"}]})
    assert [(p.pid, p.role) for p in processes_of(old)] == [(7, "ray worker"), (8, "child")]
    assert [r["role"] for r in process_rows(build_model(old))["rows"]] == ["ray worker", "child"]
