"""Ray and Dask jobs under `python -m energyprof`: each task and actor call a unit of work, the
machine counted once. One engine start per job, each job run once per module (a Ray start costs
seconds on two cores)."""

from __future__ import annotations

import json
import dataclasses
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest

from conftest import run_cli
from energyprof import load
from energyprof.agent.units import units
from energyprof.engines.roles import engine_role

WATTS = 40.0
SP = "/usr/lib/python3/site-packages"


def write_trace(folder: Path) -> Path:
    trace = folder / "w.csv"
    trace.write_text(f"t_s,cpu\n0,{WATTS}\n100000,{WATTS}\n")
    return trace


# Each task reports its own thread CPU, so the test knows what each unit should hold.
BURN = textwrap.dedent("""
    import json, sys, time

    def burn(n):
        t = time.thread_time()
        s = 0
        for i in range(n):
            s += i * i
        return time.thread_time() - t
""")

RAY_JOB = BURN + textwrap.dedent("""
    import ray

    @ray.remote
    def alpha(n): return burn(n)
    @ray.remote
    def beta(n): return burn(n)
    @ray.remote
    def gamma(n): return burn(n)
    @ray.remote
    def delta(n): return burn(n)

    @ray.remote
    class Counter:
        def work(self, n):
            return burn(n)

    if __name__ == "__main__":
        two_nodes = sys.argv[1] == "cluster"
        if two_nodes:
            from ray.cluster_utils import Cluster
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
            cluster.add_node(num_cpus=1)
            ray.init(address=cluster.address, log_to_driver=False)
        else:
            # One CPU: one worker runs all four tasks, one after another.
            ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        n = int(sys.argv[2])
        cpu = dict(zip(["alpha", "beta", "gamma", "delta"], ray.get([f.remote(n) for f in (alpha, beta, gamma, delta)])))
        if not two_nodes:  # an actor is a worker process of its own: the one-node job has the actor's tests
            actor = Counter.remote()
            cpu["Counter.work"] = ray.get(actor.work.remote(n))
        ray.shutdown()
        if two_nodes:
            cluster.shutdown()
        json.dump(cpu, open(sys.argv[3], "w"))
""")

DASK_JOB = BURN + textwrap.dedent("""
    from dask.distributed import Client, LocalCluster

    def alpha(n): return burn(n)
    def beta(n): return burn(n)

    if __name__ == "__main__":
        n = int(sys.argv[1])
        with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster, \\
                Client(cluster) as client:
            futures = [client.submit(f, n, pure=False) for f in (alpha, beta, alpha, beta)]
            cpu = client.gather(futures)
        json.dump({"alpha": cpu[0] + cpu[2], "beta": cpu[1] + cpu[3]}, open(sys.argv[2], "w"))
""")


def run_job(folder: Path, script: str, args: list[str]) -> tuple[object, dict[str, float]]:
    (folder / "job.py").write_text(script)
    trace = write_trace(folder)
    proc = run_cli(["--power-trace", str(trace), "--json", "p.json", "-o", "/dev/null", "job.py", *args, "cpu.json"],
                   cwd=folder, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load(folder / "p.json"), json.loads((folder / "cpu.json").read_text())


def unit_nodes(profile: object) -> dict[str, list]:
    out: dict[str, list] = {}
    for node, _ in profile.walk():  # type: ignore[attr-defined]
        if node.function.startswith(("[ray task ", "[ray actor ", "[dask task ")):
            out.setdefault(node.function, []).append(node)
    return out


def check_machine_once(profile: object) -> None:
    """The replayed constant power over the run's span: the machine's energy, counted once,
    and every joule of it on exactly one node."""
    totals = profile.totals  # type: ignore[attr-defined]
    assert totals.energy_j["cpu"] == pytest.approx(WATTS * totals.duration_s, rel=1e-6)
    on_nodes = sum(n.self_energy_j.get("cpu", 0.0) for n, _ in profile.walk())  # type: ignore[attr-defined]
    assert on_nodes == pytest.approx(totals.energy_j["cpu"], rel=1e-9)


def check_unit(nodes: list, cpu_s: float, interval_s: float) -> None:
    """A unit's CPU is the CPU its own samples carried: its thread's clock over the task, less at most
    what the sample it was cut at had not yet seen, plus what the thread ran since the sample before
    the task began (the worker unpickling it: a sample's CPU goes to the stack it sees at its end, and
    under load a sample can cover more than its interval). So the task's own CPU is a floor, not a
    ceiling. Its energy is at least its CPU's share of a fully busy machine (power x CPU / cores:
    every interval's energy is shared by CPU among what the machine ran, at most all cores), but for
    the samples at its two edges, whose CPU is spread over time that can begin before the task did."""
    node_cpu = sum(n.cpu_time_s for n in nodes)
    assert node_cpu >= cpu_s - 4 * interval_s
    energy = sum(n.energy_j.get("cpu", 0.0) for n in nodes)
    edges = 4 * interval_s
    assert energy >= WATTS * max(0.0, node_cpu - edges) / (os.cpu_count() or 1) * (1 - 1e-9)


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, dict[str, float]]:
    pytest.importorskip("ray", reason="the [ray] extra is not installed")
    return run_job(tmp_path_factory.mktemp("ray"), RAY_JOB, ["local", "4000000"])


def test_ray_tasks_and_actor_calls_are_units_of_work(ray_local: tuple[object, dict[str, float]]) -> None:
    profile, cpu = ray_local
    check_machine_once(profile)
    found = unit_nodes(profile)
    for name in ("alpha", "beta", "gamma", "delta"):
        assert f"[ray task {name}]" in found, sorted(found)
        check_unit(found[f"[ray task {name}]"], cpu[name], profile.meta["interval_s"])  # type: ignore[attr-defined]
    assert "[ray actor Counter.work]" in found
    check_unit(found["[ray actor Counter.work]"], cpu["Counter.work"], profile.meta["interval_s"])  # type: ignore[attr-defined]


def test_a_reused_ray_worker_holds_each_of_its_tasks(ray_local: tuple[object, dict[str, float]]) -> None:
    """With one CPU, one worker ran the four tasks: four task nodes under one worker's node,
    each with its own CPU, not the worker's life."""
    profile, _ = ray_local
    holders = {}
    for node, _ in profile.walk():  # type: ignore[attr-defined]
        if node.function.startswith("[ray worker "):
            tasks = [c for c in node.children if c.function.startswith("[ray task ")]
            holders[node.function] = {c.function for c in tasks}
            if len(tasks) == 4:  # each task holds its own part of the worker's CPU, not the worker's life
                assert sum(c.cpu_time_s for c in tasks) <= node.cpu_time_s + 1e-9
                assert all(0 < c.cpu_time_s < node.cpu_time_s for c in tasks)
    assert any(len(tasks) == 4 for tasks in holders.values()), holders
    roles = {p.pid: engine_role(p.command) for p in profile.processes}  # type: ignore[attr-defined]
    assert "ray worker" in roles.values()


def test_each_run_of_a_task_is_a_window_of_its_worker(ray_local: tuple[object, dict[str, float]]) -> None:
    """One window per task run (its span from the samples that saw it), on the worker that ran it,
    holding that worker's part of the program's energy over the span."""
    profile, _ = ray_local
    workers = {p.pid for p in profile.processes if engine_role(p.command) == "ray worker"}  # type: ignore[attr-defined]
    runs = [w for w in profile.windows if w.name.startswith(("[ray task ", "[ray actor "))]  # type: ignore[attr-defined]
    assert sorted(w.name for w in runs) == sorted([f"[ray task {n}]" for n in ("alpha", "beta", "gamma", "delta")]
                                                 + ["[ray actor Counter.work]"])
    program = sum(profile.totals.attributed_j.values())  # type: ignore[attr-defined]
    for w in runs:
        assert w.pid in workers and w.time_s > 0 and w.program_energy_j["cpu"] > 0
        assert w.program_energy_j["cpu"] <= w.energy_j["cpu"] + 1e-9  # the worker's part of the machine's
    assert sum(w.program_energy_j["cpu"] for w in runs) <= program + 1e-9


def opens_on_tasks(profile: object, units: list[str], engine: str) -> object:
    """The report model's first screen: each task a box at the top of the chart (its runs on every worker
    in one), the engine's start-up one folded box holding the workers, the task functions among the user's."""
    from energyprof.analysis.report import build

    model = build(profile)  # type: ignore[arg-type]
    first = {c.function: c for c in model.chart.children}
    assert set(units) <= set(first), sorted(first)
    inside = [n.function for n in model.chart.preorder() if n.function.startswith(("[ray task", "[ray actor", "[dask task"))]
    assert sorted(inside) == sorted(units)  # no task left under the start-up
    assert all(first[u].value_e > 0 for u in units)
    (box,) = [n for n in model.chart.preorder() if n.function == f"[{engine} start-up]"]
    assert box.kind == "group" and all(n.group is box for n in box.preorder() if n is not box)
    return model


def test_a_ray_job_opens_on_its_tasks(ray_local: tuple[object, dict[str, float]]) -> None:
    profile, _ = ray_local
    model = opens_on_tasks(profile, [f"[ray task {n}]" for n in ("alpha", "beta", "gamma", "delta")]
                           + ["[ray actor Counter.work]"], "ray")
    assert {"alpha", "beta", "gamma", "delta", "burn"} <= {r.function for r in model.own}  # type: ignore[attr-defined]
    from energyprof.render.cards import process_rows

    roles = {r["role"] for r in process_rows(model)["rows"]}  # type: ignore[arg-type]
    assert {"ray worker", "ray daemon raylet"} <= roles


def test_a_two_node_ray_cluster_on_one_machine_counts_the_machine_once(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the [ray] extra is not installed")
    profile, cpu = run_job(tmp_path, RAY_JOB, ["cluster", "2000000"])
    check_machine_once(profile)
    found = unit_nodes(profile)
    assert {f"[ray task {n}]" for n in ("alpha", "beta", "gamma", "delta")} <= set(found)


def test_dask_local_cluster_tasks_are_units_of_work(tmp_path: Path) -> None:
    pytest.importorskip("distributed", reason="the [dask] extra is not installed")
    profile, cpu = run_job(tmp_path, DASK_JOB, ["4000000"])
    check_machine_once(profile)
    found = unit_nodes(profile)
    for name in ("alpha", "beta"):
        assert f"[dask task {name}]" in found, sorted(found)
        check_unit(found[f"[dask task {name}]"], cpu[name], profile.meta["interval_s"])  # type: ignore[attr-defined]
        # each ran twice: one or two windows (two runs back to back on one thread, no sample between, are one)
        runs = [w for w in profile.windows if w.name == f"[dask task {name}]"]  # type: ignore[attr-defined]
        assert 1 <= len(runs) <= 2 and all(w.pid is not None and w.time_s > 0 for w in runs)
    # the first screen: the tasks, their functions (shipped by value: `<dynamic-code>`) the user's; the workers by role
    model = opens_on_tasks(profile, ["[dask task alpha]", "[dask task beta]"], "dask")
    assert {"alpha", "beta"} <= {r.function for r in model.top}  # type: ignore[attr-defined]
    assert [p.role for p in profile.processes].count("dask worker") == 2  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the pure rule, on recorded stacks

RAY_TASK = [("<module>", f"{SP}/ray/_private/workers/default_worker.py", 1),
            ("Worker.main_loop", f"{SP}/ray/_private/worker.py", 900),
            ("t", "/home/ray/job.py", 3), ("burn", "/home/ray/job.py", 10)]
RAY_ACTOR = [*RAY_TASK[:2],
             ("FunctionActorManager._make_actor_method_executor.<locals>.actor_method_executor",
              f"{SP}/ray/_private/function_manager.py", 600),
             ("_inject_tracing_into_class.<locals>.span_wrapper.<locals>._resume_span",
              f"{SP}/ray/util/tracing/tracing_helper.py", 400),
             ("A.m", "/home/ray/job.py", 7)]
DASK_TASK = [("Thread.run", "/usr/lib/python3.11/threading.py", 975),
             ("_worker", f"{SP}/distributed/threadpoolexecutor.py", 50),
             ("_run_task", f"{SP}/distributed/worker.py", 2900),
             ("_run_task_simple", f"{SP}/distributed/worker.py", 2950),
             ("Task.__call__", f"{SP}/dask/_task_spec.py", 700),
             ("f", "<dynamic-code>", 3)]


def test_units_on_the_engines_recorded_stacks() -> None:
    # A user folder named `ray` (Ray's images run as user ray) is the user's, not the engine's.
    assert units(RAY_TASK) == [("[ray task t]", "", 0), *RAY_TASK[2:]]
    assert units(RAY_ACTOR) == [("[ray actor A.m]", "", 0), RAY_ACTOR[-1]]
    assert units(DASK_TASK) == [("[dask task f]", "", 0), DASK_TASK[-1]]
    # Between tasks, or unpickling a task's function (its imports), a worker runs no unit.
    assert units(RAY_TASK[:2]) == RAY_TASK[:2]
    loading = [*RAY_TASK[:2], ("<module>", f"{SP}/pydantic/__init__.py", 1)]
    assert units(loading) == loading
    plain = [("main", "/home/u/train.py", 1)]
    assert units(plain) == plain
    # Ray's loop calling a library (seen under load) or code a library made with exec is the engine's too
    for engines in [("packb", f"{SP}/msgpack/__init__.py", 30), ("_process_class", dataclasses.__file__, 900),
                    ("<lambda>", "<string>", 1), ("Point.__new__", "<string>", 1)]:
        assert units([*RAY_TASK[:2], engines]) == [*RAY_TASK[:2], engines]
    # Ray's loop asking `inspect.isgenerator` of a task's function or result, through the patch Cython's compiled
    # _raylet installed with exec (the frame seen beside two hogs, then named as a task in place of `delta`):
    # the engine's dispatch, whether the sample caught the patch or the standard library below it
    shim = ("cy_wrap.<locals>.cy_isgenerator", "<string>", 5)
    below = ("isgenerator", dataclasses.__file__.replace("dataclasses", "inspect"), 428)
    for caught in ([shim], [shim, below]):
        assert units([*RAY_TASK[:2], *caught]) == [*RAY_TASK[:2], *caught]
    # ... but a task defined in a script given as text is a task
    assert units([*RAY_TASK[:2], ("t", "<string>", 3)])[0] == ("[ray task t]", "", 0)


def test_engine_roles_from_command_lines() -> None:
    assert engine_role(f"/usr/bin/python {SP}/ray/_private/workers/default_worker.py --node-ip-address=1") == "ray worker"
    assert engine_role(f"{SP}/ray/core/src/ray/raylet/raylet --raylet_socket_name=x") == "ray daemon raylet"
    assert engine_role(f"{SP}/ray/core/src/ray/gcs/gcs_server --log_dir=x") == "ray daemon gcs_server"
    assert engine_role("/usr/bin/python train.py") is None
    assert engine_role("/opt/raylet") is None  # a binary of that name outside Ray's package


EXEC_NATIVE = textwrap.dedent("""
    import json, resource, subprocess, sys
    # A preexec_fn makes subprocess fork through Python's at-fork hooks (Ray starts its raylet so):
    # the child's agent says hello under this command line, then the exec replaces it.
    subprocess.run(["sh", "-c", "i=0; while [ $i -lt 1500000 ]; do i=$((i+1)); done"], preexec_fn=lambda: None, check=True)
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    json.dump({"sh": ru.ru_utime + ru.ru_stime}, open(sys.argv[1], "w"))
""")


def test_a_fork_that_execs_a_native_program_is_read_from_proc_under_its_own_name(tmp_path: Path) -> None:
    profile, cpu = run_job(tmp_path, EXEC_NATIVE, [])
    check_machine_once(profile)
    nodes = [n for n, _ in profile.walk() if n.function.startswith("[process ")]  # type: ignore[attr-defined]
    sh = [n for n in nodes if ": sh -c" in n.function]
    assert sh, [n.function for n in nodes]
    # Its CPU from /proc from where its agent's last tick left it: all of it, give or take a tick.
    assert sum(n.cpu_time_s for n in sh) == pytest.approx(cpu["sh"], rel=0.1, abs=0.05)


DRIVER = BURN + textwrap.dedent("""
    import ray

    @ray.remote
    def alpha(n): return burn(n)
    @ray.remote
    def beta(n): return burn(n)

    if __name__ == "__main__":
        ray.init(address="auto", log_to_driver=False)
        cpu = dict(zip(["alpha", "beta"], ray.get([alpha.remote(int(sys.argv[1])), beta.remote(int(sys.argv[1]))])))
        ray.shutdown()
        json.dump(cpu, open(sys.argv[2], "w"))
""")


def test_a_running_ray_cluster_started_under_energyprof_and_joined_by_merge(tmp_path: Path) -> None:
    """docs/distributed.md's recipe for a cluster started elsewhere: each machine's `ray start`
    runs under energyprof (one reader of that machine's sensors, every worker its raylet starts
    followed), a driver connects from outside, and `energyprof merge` joins the pieces, each
    machine once."""
    import signal
    import subprocess
    import sys

    pytest.importorskip("ray", reason="the [ray] extra is not installed")
    ray_bin = Path(sys.executable).parent / "ray"
    trace = write_trace(tmp_path)
    # Ray's own folder for this cluster (its sockets, its `ray_current_cluster` that `ray.init()`
    # connects to): a short path of the test's, so no later ray.init() on this machine finds it.
    ray_tmp = tempfile.mkdtemp(prefix="ep-ray-", dir="/tmp")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": ray_tmp}
    seen: list[str] = []
    head = subprocess.Popen([sys.executable, "-m", "energyprof", "--power-trace", str(trace), "--json", "head.json",
                             "-o", "/dev/null", "-q", "--", str(ray_bin), "start", "--head", "--block", "--num-cpus", "1",
                             "--port", "0", "--include-dashboard", "false", "--disable-usage-stats"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        (tmp_path / "driver.py").write_text(DRIVER)
        for line in head.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if "will now block" in line:  # `ray start` has started every process and waits
                break
        assert any("will now block" in line for line in seen), "".join(seen)[-3000:]
        driver = subprocess.run([sys.executable, "driver.py", "3000000", "cpu.json"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)
        assert driver.returncode == 0, driver.stderr[-2000:]
    finally:
        head.send_signal(signal.SIGTERM)  # energyprof forwards it; `ray start --block` stops its processes
        out = "".join(seen) + head.communicate(timeout=120)[0]
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert (tmp_path / "head.json").exists(), out[-3000:]
    merged = run_cli(["merge", "head.json", "-o", "job.json", "-q"], cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    job = load(tmp_path / "job.json")
    found = unit_nodes(job)
    cpu = json.loads((tmp_path / "cpu.json").read_text())
    for name in ("alpha", "beta"):
        assert f"[ray task {name}]" in found, sorted(found)
        check_unit(found[f"[ray task {name}]"], cpu[name], load(tmp_path / "head.json").meta["interval_s"])
    check_machine_once(job)
