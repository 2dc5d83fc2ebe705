"""Every process of the job: forked and spawned Python children sample themselves, others are
measured from /proc; each sits under the stack that started it. Real processes throughout."""

from __future__ import annotations

import subprocess
import sys

import pytest

from energyprof import load
from energyprof.record import asdict

from conftest import BURN, installed_script, processes, profiled, run_cli, script

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

def process_nodes(node, prefix: str = "[process "):
    return [n for n, _ in node.walk() if n.function.startswith(prefix)]


def test_a_python_child_costs_what_the_same_work_costs_in_process(here):
    script(here, "child.py", BURN, """
        import sys
        def child_work(n):
            burn(n)
        child_work(int(sys.argv[1]))
    """)
    script(here, "parent.py", BURN, """
        import subprocess, sys
        N = 8_000_000  # ~1 s: the child's interpreter start-up (its own cost) stays a few %
        def in_process():
            burn(N)
        def run_child():
            subprocess.run([sys.executable, "child.py", str(N)], check=True)
        for _ in range(2):  # interleaved, so a busy machine slows both alike
            in_process()
            run_child()
    """)
    res = run_cli(["--idle", "share", *profiled("parent.py")], cwd=here, timeout=300)
    assert res.returncode == 0, res.stderr
    p = load(here / "p.json")
    waiting = p.find("run_child")[0]
    kids = process_nodes(waiting)
    assert len(kids) == 2 and all("child.py" in k.function for k in kids), [k.function for k in kids]
    for k in kids:
        assert [n.function for n, _ in k.walk() if n.function == "child_work"] == ["child_work"]
    mine, theirs = p.function_totals("in_process"), sum(k.energy_j["cpu"] for k in kids)
    # The same work does not always take the same CPU time on a loaded machine (two logical
    # CPUs sharing a core run each other's work up to twice as slow), so compare the energy
    # per CPU second: the same CPU costs the same energy whichever process burns it.
    my_cpu = sum(n.cpu_time_s for n in p.find("in_process"))
    their_cpu = sum(k.cpu_time_s for k in kids)
    assert theirs / their_cpu == pytest.approx(mine / my_cpu, rel=0.25), (mine, my_cpu, theirs, their_cpu)
    rows = {r["pid"]: r for r in processes(p)}
    for k in kids:  # a process's node holds exactly its row's energy
        assert k.energy_j["cpu"] == pytest.approx(rows[k.line]["energy_j"]["cpu"], rel=1e-9)
    # the processes table: one row each, energies adding up to the program's
    rows = processes(p)
    assert sorted(r["role"] for r in rows) == ["child", "child", "main"]
    total = sum(r["energy_j"]["cpu"] for r in rows)
    assert total == pytest.approx(p.totals["attributed_j"]["cpu"], rel=1e-6)
    fields = {"pid", "parent_pid", "command", "role", "rank", "local_rank", "cpu_time_s", "energy_j",
              "other_policy_energy_j", "peak_rss_bytes", "exit", "host"}
    assert all(set(asdict(r)) == fields for r in rows)
    children = [r for r in rows if r["role"] == "child"]
    assert all(r["cpu_time_s"] > 0.1 and r["peak_rss_bytes"] > 1_000_000 for r in children)


def test_fork_pool_used_five_times_prints_nothing_and_never_hangs(here):
    script(here, "pool.py", """
        import multiprocessing as mp

        def square(x):
            return x * x

        if __name__ == "__main__":
            ctx = mp.get_context("fork")
            for i in range(5):
                with ctx.Pool(2) as pool:
                    print(i, sum(pool.map(square, range(200))))
    """)
    expected = subprocess.run([sys.executable, "pool.py"], cwd=here, capture_output=True, text=True, timeout=60)
    for run in range(10):
        res = run_cli(profiled("pool.py"), cwd=here, timeout=120)
        assert (res.returncode, res.stdout, res.stderr) == (0, expected.stdout, expected.stderr), run
    p = load(here / "p.json")
    assert len([r for r in processes(p) if r["role"] == "child"]) >= 2


def test_a_forked_child_returning_normally_writes_and_prints_nothing(here):
    script(here, "forker.py", BURN, """
        import os
        pid = os.fork()
        if pid == 0:
            burn_for(0.4)
            print("child", flush=True)
        else:
            os.waitpid(pid, 0)
            print("parent", flush=True)
    """)
    res = run_cli(["--power-trace", "trace.csv", "--json", "p.json", "-o", "r.html", "forker.py"], cwd=here)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "child\nparent\n"
    assert res.stderr.count("your functions by total energy") == 1 and res.stderr.count("wrote p.json") == 1
    p = load(here / "p.json")
    assert p.meta["exit"] == {"status": "completed"}
    rows = processes(p)
    assert [r["role"] for r in rows] == ["main", "child"] and rows[1]["parent_pid"] == rows[0]["pid"]
    node = process_nodes(p.root)
    assert len(node) == 1 and [n for n, _ in node[0].walk() if n.function == "burn"]


# "portable": the paths of a system without /proc (macOS), psutil's, taken on Linux
PATHS = [pytest.param({}, id="proc"), pytest.param({"ENERGYPROF_PORTABLE": "1"}, id="portable")]


@pytest.mark.parametrize("env", PATHS)
def test_no_follow_measures_children_by_cpu_only(here, env):
    script(here, "kid.py", """
        import subprocess, sys
        def wait_for_child():
            subprocess.run([sys.executable, "-c", "sum(i * i for i in range(8_000_000))"], check=True)
        wait_for_child()
    """)
    res = run_cli(["--no-follow", *profiled("kid.py")], cwd=here, env=env)
    assert res.returncode == 0, res.stderr
    p = load(here / "p.json")
    kids = process_nodes(p.find("wait_for_child")[0])
    assert len(kids) == 1 and kids[0].children == [] and kids[0].energy_j["cpu"] > 0
    assert p.totals["cpu_time_s"] > 0.3


@pytest.mark.parametrize("env", PATHS)
def test_ranks_and_spawned_multiprocessing_children(here, env):
    script(here, "worker.py", BURN, """
        def rank_work():
            burn(1_500_000)
        rank_work()
    """)
    script(here, "launch.py", BURN, """
        import multiprocessing as mp, os, subprocess, sys

        def spawned_work():
            burn(1_000_000)

        def launch():
            procs = [subprocess.Popen([sys.executable, "worker.py"], env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r)))
                     for r in range(2)]
            burn(300_000)  # CPU of its own: waiting alone, it may hold no sampled CPU on a loaded machine
            for pr in procs:
                pr.wait()

        if __name__ == "__main__":
            launch()
            p = mp.get_context("spawn").Process(target=spawned_work)
            p.start()
            p.join()
    """)
    res = run_cli(profiled("launch.py"), cwd=here, timeout=180, env=env)
    assert res.returncode == 0, res.stderr
    p = load(here / "p.json")
    ranks = sorted((r["rank"], r["local_rank"], r["role"]) for r in processes(p) if r["role"] == "rank")
    assert ranks == [(0, 0, "rank"), (1, 1, "rank")]
    names = {n.function for n, _ in p.find("launch")[0].walk()}
    assert {"[rank 0]", "[rank 1]", "rank_work"} <= names
    spawned = [n for n, _ in p.root.walk() if n.function == "spawned_work"]
    assert spawned and spawned[0].energy_j["cpu"] > 0


@pytest.mark.torch
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_dataloader_workers_carry_their_getitem(here):
    script(here, "loader.py", BURN, """
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Burn(Dataset):
            def __len__(self):
                return 16

            def __getitem__(self, i):
                burn(600_000)  # 8 items a worker: ~24 samples each at the default rate
                return torch.tensor([i])

        def train():
            for batch in DataLoader(Burn(), batch_size=2, num_workers=2):
                pass

        if __name__ == "__main__":
            torch.set_num_threads(1)
            train()
    """)
    res = run_cli(profiled("loader.py"), cwd=here, timeout=300, env={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr
    p = load(here / "p.json")
    workers = process_nodes(p.find("train")[0], "[DataLoader worker ")
    assert sorted({w.function for w in workers}) == ["[DataLoader worker 0]", "[DataLoader worker 1]"]
    for w in workers:
        getitem = [n for n, _ in w.walk() if n.function == "Burn.__getitem__"]
        assert getitem and getitem[0].energy_j["cpu"] > 0
    # the workers' energy is theirs alone: their nodes hold exactly their rows' energy
    rows = processes(p)
    assert [r["role"] for r in rows] == ["main", "worker", "worker"]  # forked DataLoader workers, by role
    assert all(r["cpu_time_s"] > 0 for r in rows)
    in_nodes = sum(w.energy_j["cpu"] for w in workers)
    assert in_nodes == pytest.approx(sum(r["energy_j"]["cpu"] for r in rows[1:]), rel=1e-9)
    assert in_nodes < p.totals["attributed_j"]["cpu"]


@pytest.mark.torch
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_torchrun_after_double_dash_shows_each_rank(here):
    torchrun = installed_script("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not on PATH")
    script(here, "ddp.py", BURN, """
        import os, sys
        def rank_work():
            burn_for(0.5)
        rank_work()
        # one write: torchrun's workers run unbuffered, and print() writes its pieces one by one
        sys.stdout.write("rank " + os.environ["RANK"] + "\\n")
    """)
    res = run_cli([*profiled(), "--", torchrun, "--standalone", "--nproc_per_node", "2", "ddp.py"], cwd=here,
                  timeout=300, env={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["rank 0", "rank 1"]
    p = load(here / "p.json")
    rows = processes(p)
    assert [r["role"] for r in rows].count("main") == 1 and "torchrun" in rows[0]["command"]
    assert sorted((r["rank"], r["local_rank"]) for r in rows if r["role"] == "rank") == [(0, 0), (1, 1)]
    for rank in ("[rank 0]", "[rank 1]"):
        node = [n for n, _ in p.root.walk() if n.function == rank]
        assert len(node) == 1 and [n for n, _ in node[0].walk() if n.function == "rank_work"]


def test_gpu_energy_goes_to_the_process_that_uses_cuda(here):
    """The trainer (here a stand-in `torch` whose CUDA is initialised) gets the GPU's energy;
    a forked worker as busy as it gets none once the trainer's sampler has said so (within
    its first second)."""
    (here / "gpu.csv").write_text("t_s,cpu,gpu:0\n0,50,100\n")
    script(here, "trainer.py", BURN, """
        import os, sys, types
        sys.modules["torch"] = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
        def worker_loop():
            burn_for(3.0)
        def train():
            burn_for(3.0)
        pid = os.fork()
        if pid == 0:
            del sys.modules["torch"]  # the worker runs no CUDA
            worker_loop()
            os._exit(0)
        train()
        os.waitpid(pid, 0)
    """)
    res = run_cli(["--idle", "all", "--power-trace", "gpu.csv", "-q", "--json", "p.json", "-o", "r.html",
                   "trainer.py"], cwd=here)
    assert res.returncode == 0, res.stderr
    p = load(here / "p.json")
    rows = {r["role"]: r["energy_j"]["gpu:0"] for r in processes(p)}
    assert rows["main"] > 0.6 * (rows["main"] + rows["child"]), rows
    # within the trainer, GPU energy follows the main thread's wall time: at a steady 100 W,
    # `train` holds 100 W x its own wall time, however long start-up, the fork and the final
    # waitpid took on a busy machine
    train = [n for n, _ in p.root.walk() if n.function == "train"][0]
    assert train.energy_j["gpu:0"] == pytest.approx(100.0 * train.time_s, rel=0.02), (train.energy_j, train.time_s)
    assert train.time_s >= 3.0 * 0.9 and train.energy_j["gpu:0"] <= rows["main"] * (1 + 1e-9), (train.time_s, rows)


def test_a_pool_of_four_workers_is_one_node_with_their_functions_beneath(here):
    script(here, "pool4.py", """
        import multiprocessing as mp, time
        def square(i):
            end = time.process_time() + 0.02
            while time.process_time() < end:
                pass
            return i * i
        def run_pool():
            with mp.get_context("fork").Pool(4) as pool:
                print(sum(pool.map(square, range(40), chunksize=1)))
                pool.close()
                pool.join()
        if __name__ == "__main__":
            run_pool()
    """)
    res = run_cli(profiled("pool4.py"), cwd=here, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"{sum(i * i for i in range(40))}\n"
    p = load(here / "p.json")
    workers = [r for r in processes(p) if r["role"] != "main"]
    assert len(workers) == 4, workers
    groups = process_nodes(p.root, "[processes: ")
    assert [g.function for g in groups] == ["[processes: pool worker x4]"], [g.function for g in groups]
    assert not process_nodes(p.root)  # no worker on a node of its own
    # 40 tasks x 20 ms of the workers' CPU, all under the one node (a task's CPU is a floor of what it shows).
    assert sum(n.cpu_time_s for n, _ in groups[0].walk() if n.function == "square") >= 0.8 * 40 * 0.02
