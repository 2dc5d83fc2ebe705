"""Distributed training as one profile: two-rank DDP (gloo, CPU) under torchrun, wrapped by one
supervisor or with energyprof inside each rank, against a replayed 50 W trace. Real torchrun,
real ranks; the power trace is the only thing faked."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from energyprof import load
from energyprof.engines.distributed import expand
from energyprof.engines.distributed import gpu_ties
from energyprof.engines.distributed import per_rank
from energyprof.engines.distributed import placeholder_values
from energyprof.engines.distributed import rank_info
from energyprof.facts.profile import Process
from energyprof.facts.profile import Source

from conftest import installed_script, run_cli

try:
    import torch.distributed  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

TORCHRUN = installed_script("torchrun")
needs_torchrun = pytest.mark.skipif(not HAVE_TORCH or TORCHRUN is None, reason="torch with torchrun is not installed")

WATTS = 50.0
TIMEOUT = 600  # a loaded 2-core machine starts two torch interpreters slowly

DDP = """
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import energyprof.torch as ept


def burn_for(seconds):
    end = time.process_time() + seconds  # CPU seconds: the same work per rank however loaded the machine
    s = 0
    while time.process_time() < end:
        for i in range(10_000):
            s += i * i
    return s


def train_rank(model, opt, x):
    for step in range(6):
        with ept.window("step", step):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            burn_for(0.25)


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train_rank(model, opt, torch.randn(32, 16))
    if os.environ.get("KILL_RANK") == os.environ["RANK"]:
        sys.stdout.flush()
        os.kill(os.getppid(), 9)  # energyprof of this rank dies: it leaves no profile
        os._exit(1)
    dist.barrier()
    dist.destroy_process_group()
    os.write(1, f"rank {os.environ['RANK']} done\\n".encode())  # one write: the ranks share the terminal


main()
"""


@pytest.fixture
def job(tmp_path: Path) -> Path:
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    (tmp_path / "train.py").write_text(textwrap.dedent(DDP))
    return tmp_path


def env(**more: str) -> dict[str, str]:
    out = dict(os.environ)
    out.pop("ENERGYPROF_POWERCAP_ROOT", None)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        out.pop(k, None)
    out.update(OMP_NUM_THREADS="1", **more)
    return out


def torchrun(*args: str) -> list[str]:
    assert TORCHRUN is not None
    return [TORCHRUN, "--standalone", "--nproc_per_node", "2", *args]


def conserved(p) -> None:
    """Every source: the self energies of all nodes add up to what the sensors measured."""
    for policy in p.policies():
        q = p.with_policy(policy)
        for sid, total in q.totals.energy_j.items():
            got = sum(n.self_energy_j.get(sid, 0.0) for n, _ in q.walk())
            assert got == pytest.approx(total, rel=1e-9, abs=1e-9), (policy, sid)


def rank_energy(p) -> dict[int, float]:
    return {r: p.find(f"[rank {r}]")[0].total_energy for r in (0, 1)}


def check_two_ranks(p) -> tuple[float, dict[int, float]]:
    """Machine energy counted once (50 W x the readings' span), both ranks' work under their own
    node, each rank 25-75% of the program's energy. Returns the figures for the record."""
    machine = sum(p.totals.energy_j.values())
    assert machine == pytest.approx(WATTS * p.totals.duration_s, rel=0.03)
    assert p.totals.duration_s > 0.5
    conserved(p)
    energy = rank_energy(p)
    program = sum(p.totals.attributed_j.values())
    for r in (0, 1):
        node = p.find(f"[rank {r}]")
        assert len(node) == 1
        assert [n for n, _ in node[0].walk() if n.function == "train_rank"], f"rank {r}'s training is not under it"
        assert 0.25 <= energy[r] / program <= 0.75, (energy, program)
    assert sum(energy.values()) <= program + 1e-6 and program <= machine + 1e-6
    return machine, energy


# ---------------------------------------------------------------- the pure parts


def test_rank_env_and_placeholders() -> None:
    assert rank_info({}) is None
    assert rank_info({"RANK": "0", "WORLD_SIZE": "1"}) is None  # one rank is an ordinary run
    info = rank_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "1",
                      "TORCHELASTIC_RUN_ID": "abc"})
    assert info is not None and (info.rank, info.local_rank, info.world_size, info.node, info.job) == (3, 1, 4, "1", "abc")
    slurm = {"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_NODEID": "2", "SLURM_JOB_ID": "7"}
    assert rank_info(slurm) is not None and rank_info(slurm).rank == 2  # type: ignore[union-attr]
    assert rank_info(slurm, command_form=True) is None  # srun ... energyprof -- torchrun: one task per node
    mpi = rank_info({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"})
    assert mpi is not None and (mpi.rank, mpi.local_rank, mpi.world_size) == (1, 1, 2)
    assert per_rank("/dev/null") == "/dev/null"
    values = placeholder_values({}, info, 42)
    assert expand("out/{node}/r{rank}-{local_rank}-{pid}.{x}.json", values) == "out/1/r3-1-42.{x}.json"
    assert per_rank("p.json") == "p.rank{rank}.json"
    assert per_rank("out/energyprof-report.html") == "out/energyprof-report.rank{rank}.html"
    assert per_rank("p{rank}.json") == "p{rank}.json"
    assert per_rank("noext") == "noext.rank{rank}"


def test_gpu_sources_are_tied_to_the_rank_using_them() -> None:
    from test_nvml import FakeGpu, FakeNvml

    gpus = [FakeGpu(bus="00000000:3B:00.0"), FakeGpu(bus="00000000:86:00.0")]
    fake = FakeNvml(gpus)
    ranks = [Process(pid=101, role="rank", rank=0, local_rank=0), Process(pid=102, role="rank", rank=1, local_rank=1)]
    sources = [Source(id="gpu:0", component="gpu:0"), Source(id="gpu:1", component="gpu:1"), Source(id="cpu", component="cpu")]
    ties = gpu_ties(sources, ranks, {}, None)
    assert [(ties.get(s.id, {}).get("rank"), ties.get(s.id, {}).get("tied_by")) for s in sources] == \
        [(0, "LOCAL_RANK"), (1, "LOCAL_RANK"), (None, None)]
    # Each rank sees one device through its own CUDA_VISIBLE_DEVICES (the SLURM way): rank 0 uses 1.
    sources = [Source(id="gpu:0", component="gpu:0"), Source(id="gpu:1", component="gpu:1")]
    ties = gpu_ties(sources, [Process(pid=101, role="rank", rank=0, local_rank=0),
                              Process(pid=102, role="rank", rank=1, local_rank=0)], {101: "1", 102: "0"}, None)
    assert [ties[s.id]["rank"] for s in sources] == [1, 0]
    # NVML's process list has the last word: a rank it never saw on a device is not tied to it.
    gpus[0].processes = [102]
    listed = {f"gpu:{i}": {p.pid if hasattr(p, "pid") else p for p in fake.nvmlDeviceGetComputeRunningProcesses(g)}
              for i, g in enumerate(gpus)}
    sources = [Source(id="gpu:0", component="gpu:0"), Source(id="gpu:1", component="gpu:1")]
    ties = gpu_ties(sources, ranks, {}, None, nvml_pids=listed)
    assert "gpu:0" not in ties
    assert ties["gpu:1"]["rank"] == 1
    # the ledger's plain source dicts (before the Profile is built) tie the same way
    assert gpu_ties([{"id": "gpu:1", "component": "gpu:1"}], [{"pid": 102, "role": "rank", "rank": 1,
                                                               "local_rank": 1}], {}, None, listed) == \
        {"gpu:1": ties["gpu:1"]}


# ---------------------------------------------------------------- wrap the launcher


@needs_torchrun
def test_wrapped_torchrun_two_ranks_one_machine(job: Path) -> None:
    res = run_cli(["-q", "--power-trace", "trace.csv", "--json", "p.json", "-o", "r.html", "--", *torchrun("train.py")],
                  cwd=job, timeout=TIMEOUT, env={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["rank 0 done", "rank 1 done"]
    p = load(job / "p.json")
    machine, energy = check_two_ranks(p)
    ranks = {r.rank: r for r in p.processes if r.role == "rank"}
    assert sorted(ranks) == [0, 1]
    for r in (0, 1):  # the processes table and the tree agree on each rank's energy
        assert sum(ranks[r].energy_j.values()) == pytest.approx(energy[r], rel=0.02, abs=0.5)
    steps = [w for w in p.windows if w.name == "step"]
    assert sorted({w.rank for w in steps}) == [0, 1] and {w.pid for w in steps} == {ranks[0].pid, ranks[1].pid}
    print(f"wrapped: machine {machine:.1f} J vs 50 W x {p.totals.duration_s:.2f} s = {WATTS * p.totals.duration_s:.1f} J;"
          f" ranks {energy}, program {sum(p.totals.attributed_j.values()):.1f} J")


# ---------------------------------------------------------------- energyprof inside each rank


def per_rank_run(job: Path, *more: str, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(torchrun("-m", "energyprof", "-q", "--power-trace", "trace.csv", *more, "train.py"),
                          cwd=job, capture_output=True, text=True, timeout=TIMEOUT, env=env(**extra_env))


@pytest.fixture(scope="module")
def in_each_rank(tmp_path_factory) -> Path:
    """One job with energyprof inside each rank, read by the three tests below: `--idle all` (each rank's
    file holds its share of the node) and `--mlflow` (one run for the job). A torchrun of two torch
    ranks is the heaviest thing this module starts, so it is started once."""
    d = tmp_path_factory.mktemp("in_each_rank")
    (d / "trace.csv").write_text("t_s,cpu\n0,50\n")
    (d / "train.py").write_text(textwrap.dedent(DDP))
    uri = (d / "mlruns").as_uri()
    res = per_rank_run(d, "--idle", "all", "--json", "p.json", "--mlflow", MLFLOW_TRACKING_URI=uri,
                       MLFLOW_ALLOW_FILE_STORE="true")
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["rank 0 done", "rank 1 done"]
    return d


@needs_torchrun
def test_energyprof_in_each_rank_never_overwrites_nor_double_counts(in_each_rank: Path) -> None:
    job = in_each_rank
    for name in ("p.rank0.json", "p.rank1.json", "energyprof-report.rank0.html", "energyprof-report.rank1.html",
                 "p.json", "energyprof-report.html"):
        assert (job / name).is_file(), name
    assert not list(job.glob("*checkpoint*"))
    # read as each rank's share of what it measured: `--idle all` only adds the idle the ranks left
    per = {r: load(job / f"p.rank{r}.json").with_policy("share") for r in (0, 1)}
    for r, p in per.items():
        d = p.meta["distributed"]
        assert (d["rank"], d["world_size"]) == (r, 2)
        # A rank is charged its CPU share of the machine, never the whole.
        assert sum(p.totals.attributed_j.values()) < 0.9 * sum(p.totals.energy_j.values())
    assert [p.meta["distributed"]["reader"] for p in per.values()].count(True) == 1
    joined = load(job / "p.json").with_policy("share")
    machine, energy = check_two_ranks(joined)
    # Counted once: the job's machine energy is one rank's readings, not their sum.
    assert machine == pytest.approx(max(sum(p.totals.energy_j.values()) for p in per.values()), rel=1e-9)
    for r in (0, 1):
        assert energy[r] == pytest.approx(sum(per[r].totals.attributed_j.values()), rel=1e-9)
    assert sum(joined.totals.attributed_j.values()) == pytest.approx(sum(energy.values()), rel=1e-9)
    assert joined.meta["distributed"]["missing_ranks"] == []
    # torchrun's agent keeps the job's store up until every rank has exited: rank 1 came through it.
    assert joined.meta["distributed"]["gathered"] == {"1": "torch.distributed store"}
    steps = [w for w in joined.windows if w.name == "step"]
    assert sorted(w.rank for w in steps) == [0] * 6 + [1] * 6
    print(f"per-rank: machine {machine:.1f} J vs 50 W x {joined.totals.duration_s:.2f} s ="
          f" {WATTS * joined.totals.duration_s:.1f} J; ranks {energy}")


@needs_torchrun
def test_energyprof_in_each_rank_gives_one_mlflow_run(in_each_rank: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One job, one run: each rank's windows (logged live by its program) and totals under its own
    keys, the joined job's totals under the run's own, and the run ended by rank 0."""
    mlflow = pytest.importorskip("mlflow", reason="mlflow (energyprof[mlflow]) is not installed")
    job = in_each_rank
    uri = (job / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this test's own client reads the same store
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, [(r.info.run_id, r.data.tags) for r in runs]
    (run,) = runs
    assert run.info.status == "FINISHED" and run.data.tags["energyprof.job"]
    joined, per = load(job / "p.json"), {r: load(job / f"p.rank{r}.json") for r in (0, 1)}
    m = run.data.metrics
    assert m["energyprof.program_energy_j"] == pytest.approx(sum(joined.totals.attributed_j.values()), rel=1e-6)
    for r in (0, 1):
        assert m[f"energyprof.rank{r}.program_energy_j"] == pytest.approx(sum(per[r].totals.attributed_j.values()),
                                                                          rel=1e-6)
        history = sorted((x.step, x.value) for x in client.get_metric_history(run.info.run_id,
                                                                              f"energyprof.rank{r}.window.step.energy_j"))
        assert [step for step, _ in history] == list(range(6))  # each step once: live, not again at the end
        windows = sorted((w.index, sum(w.energy_j.values())) for w in per[r].windows if w.name == "step")
        assert [v for _, v in history] == pytest.approx([v for _, v in windows], rel=1e-6)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "energyprof")}
    assert {"energyprof/rank0", "energyprof/rank1", "energyprof/profile.json", "energyprof/report.html"} <= artifacts


@needs_torchrun
def test_a_killed_rank_is_named_in_the_joined_profile(job: Path) -> None:
    (job / "out").mkdir()
    res = per_rank_run(job, "--json", "out/p{rank}.json", "-o", "out/r{rank}.html", KILL_RANK="1",
                       ENERGYPROF_GATHER_TIMEOUT="3")
    assert res.returncode != 0
    out = job / "out"
    assert (out / "p0.json").is_file() and not (out / "p1.json").exists()
    assert load(out / "p0.json").meta["distributed"]["rank"] == 0
    # The per-rank name was given with {rank}: the job's profile takes "job" in its place.
    m = load(out / "pjob.json")
    assert m.meta["distributed"]["mode"] == "merged"
    assert m.meta["distributed"]["missing_ranks"] == [1]
    assert any(n.kind == "missing-rank" and "rank 1" in n.message for n in m.notes)
    assert (out / "rjob.html").is_file()
    assert [n for n, _ in m.walk() if n.function == "train_rank"]
    conserved(m)


def test_merge_subcommand_refuses_bad_input(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{}")
    res = run_cli(["merge", "bad.json", "-o", "job.json"], cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "energyprof: error:" in res.stderr
    res = run_cli(["merge", "missing.json", "-o", "job.json"], cwd=tmp_path)
    assert res.returncode == 2 and "missing.json" in res.stderr
    assert not (tmp_path / "job.json").exists()
    res = run_cli(["merge", "bad.json"], cwd=tmp_path)
    assert res.returncode == 2
    assert sys.executable


# ---------------------------------------------------------------- placeholders everywhere


def test_placeholder_values_cannot_leave_the_folder() -> None:
    hostile = {"RANK": "x/../..", "LOCAL_RANK": "/etc", "GROUP_RANK": ".."}
    values = placeholder_values(hostile, None, 7)
    assert values == {"rank": "x_.._..", "local_rank": "_etc", "node": "_", "pid": "7"}
    path = expand("out/p{rank}-{local_rank}-{node}.json", values)
    assert path == "out/px_.._..-_etc-_.json" and os.path.dirname(path) == "out"
    assert expand("{rank}", {"rank": "../../x"}) == ".._.._x"  # even a value given directly
    assert expand("{rank}/{pid}", {"rank": ".", "pid": ""}) == "_/_"


def test_cli_placeholders_from_a_hostile_environment_stay_in_the_folder(tmp_path: Path) -> None:
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    (tmp_path / "w.py").write_text("print('ok')\n")
    res = run_cli(["-q", "--power-trace", "trace.csv", "--json", "p{rank}.json", "-o", "r{node}.html", "w.py"],
                  cwd=tmp_path, env={"RANK": "x/../..", "GROUP_RANK": "../y"})
    assert res.returncode == 0, res.stderr
    assert res.stdout == "ok\n"
    assert (tmp_path / "px_.._...json").is_file() and (tmp_path / "r.._y.html").is_file()


DECORATED = """
import os
import time

import torch.distributed as dist

from energyprof import energy_profile


@energy_profile(json="dec.{rank}.json", output="dec.{rank}.{local_rank}.html", power_trace="trace.csv", quiet=True)
def train():
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass


dist.init_process_group("gloo")
train()
dist.barrier()
dist.destroy_process_group()
"""


@needs_torchrun
def test_decorator_under_torchrun_writes_one_file_per_rank(tmp_path: Path) -> None:
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    (tmp_path / "dec.py").write_text(textwrap.dedent(DECORATED))
    res = subprocess.run(torchrun("dec.py"), cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT, env=env())
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "dec.{rank}.json").exists()
    for r in (0, 1):
        p = load(tmp_path / f"dec.{r}.json")
        d = p.meta["distributed"]
        assert (d["rank"], d["local_rank"], d["world_size"], d["mode"]) == (r, r, 2, "per-rank")
        assert (tmp_path / f"dec.{r}.{r}.html").is_file()
    a, b = (load(tmp_path / f"dec.{r}.json") for r in (0, 1))
    assert a.meta["distributed"]["job"] == b.meta["distributed"]["job"]


def test_with_block_and_profiler_expand_placeholders(tmp_path: Path) -> None:
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    (tmp_path / "w.py").write_text(textwrap.dedent("""
        import os
        from energyprof import energy_profile
        from energyprof.drive.profiler import Profiler

        with energy_profile(json="w.{pid}.json", output=None, power_trace="trace.csv", quiet=True):
            sum(range(10_000))
        prof = Profiler(json="p{rank}-{node}.json", power_trace="trace.csv", quiet=True).start()
        sum(range(10_000))
        from energyprof.output.writer import write_outputs
        write_outputs(prof.stop(), prof.options)
        print(os.getpid())
        """))
    res = subprocess.run([sys.executable, "w.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=env(RANK="3", GROUP_RANK="../1"))
    assert res.returncode == 0, res.stderr
    pid = res.stdout.strip()
    assert (tmp_path / f"w.{pid}.json").is_file()
    assert (tmp_path / "p3-.._1.json").is_file()
    assert "distributed" not in load(tmp_path / f"w.{pid}.json").meta  # RANK without WORLD_SIZE: no job


@needs_torchrun
def test_rank_files_under_idle_all_add_up_to_the_node(in_each_rank: Path) -> None:
    """energyprof in each rank, `--idle all`: each rank's file holds its share of the node (its CPU
    plus half of what no rank used), not the whole machine, so the two files add up to the node:
    before, 1,348 J were charged against 696 J measured. The margin: the ranks' readings start and
    end apart (each its own supervisor), and the peers' CPU is read from /proc every 250 ms."""
    job = in_each_rank
    per = [load(job / f"p.rank{r}.json") for r in (0, 1)]
    node = max(sum(p.totals.energy_j.values()) for p in per)
    charged = [sum(p.totals.attributed_j.values()) + sum(p.totals.energyprof_j.values()) for p in per]
    assert all(p.idle_policy == "all" and p.meta["distributed"]["local_world_size"] == 2 for p in per)
    assert sum(charged) == pytest.approx(node, rel=0.10), (charged, node)
    for p, c in zip(per, charged):
        assert 0.2 * node <= c <= 0.8 * node  # a share, never the whole machine
        conserved(p)
    # the joined job, its report and `energyprof merge` of the rank files keep the run's policy:
    # before, rank 0 wrote the job as `share`, and so did merge
    written = load(job / "p.json")
    assert written.idle_policy == "all"
    remerged = run_cli(["merge", "p.rank0.json", "p.rank1.json", "-o", "again.json", "-q"], cwd=job, timeout=TIMEOUT)
    assert remerged.returncode == 0, remerged.stderr
    again = load(job / "again.json")
    assert again.idle_policy == "all"
    conserved(again)
    assert again.totals.attributed_j == pytest.approx(written.totals.attributed_j, rel=1e-9)
    assert "as on a dedicated machine" in (job / "energyprof-report.html").read_text()  # the job's report says so
    joined = written.with_policy("all")
    conserved(joined)
    assert sum(joined.totals.attributed_j.values()) + sum(joined.totals.energyprof_j.values()) == \
        pytest.approx(sum(joined.totals.energy_j.values()), rel=1e-9)
    # the processes rows add up to the program under either policy (they were 1.65% below it under all)
    for profile in (written, again):
        for policy in ("share", "all"):
            q = profile.with_policy(policy)
            rows = sum(sum(p.energy_j.values()) for p in q.processes)
            assert rows == pytest.approx(sum(q.totals.attributed_j.values()), rel=1e-9), policy
    print(f"rank files under all: {charged[0]:.1f} + {charged[1]:.1f} J against the node's {node:.1f} J")
