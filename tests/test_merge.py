"""`energyprof merge` and core/merge.py: several nodes' (or ranks') profiles joined into one job,
each node's machine energy counted once, conservation under both idle policies."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyprof import load
from energyprof.core.merge import MergeError, merge
from energyprof.facts.profile import IDLE_NODE
from energyprof.facts.profile import SELF_NODE
from energyprof.facts.profile import Node
from energyprof.facts.profile import Profile
from energyprof.facts.profile import Process
from energyprof.facts.profile import Totals

from conftest import run_cli

WORK = """
import time

def node_work():
    end = time.process_time() + 0.6
    s = 0
    while time.process_time() < end:
        for i in range(10_000):
            s += i * i

node_work()
"""


def conserved(p: Profile) -> None:
    for policy in p.policies():
        q = p.with_policy(policy)
        for sid, total in q.totals.energy_j.items():
            got = sum(n.self_energy_j.get(sid, 0.0) for n, _ in q.walk())
            assert got == pytest.approx(total, rel=1e-9, abs=1e-9), (policy, sid)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real runs saved as the profiles of two nodes (their host names set apart)."""
    d = tmp_path_factory.mktemp("nodes")
    (d / "trace.csv").write_text("t_s,cpu\n0,50\n")
    (d / "work.py").write_text(textwrap.dedent(WORK))
    for name in ("a", "b"):
        res = run_cli(["-q", "--power-trace", "trace.csv", "--json", f"{name}.json", "-o", f"{name}.html", "work.py"],
                      cwd=d, timeout=300)
        assert res.returncode == 0, res.stderr
        doc = json.loads((d / f"{name}.json").read_text())
        doc["meta"]["host"]["name"] = f"node-{name}"
        doc["meta"]["host"]["boot_id"] = f"boot-{name}"  # two machines: two kernels
        (d / f"{name}.json").write_text(json.dumps(doc))
    res = run_cli(["merge", "a.json", "b.json", "-o", "job.json", "--html", "job.html", "-q"], cwd=d, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "" and res.stderr == ""
    return d


def test_merge_of_two_nodes_sums_each_source_exactly(two_nodes: Path) -> None:
    a, b, job = (load(two_nodes / f"{n}.json") for n in ("a", "b", "job"))
    for field in ("energy_j", "attributed_j", "energyprof_j", "idle_j"):
        want = {s: getattr(a.totals, field)[s] + getattr(b.totals, field)[s] for s in a.totals.energy_j}
        assert getattr(job.totals, field) == want, field  # exact: each node's figure once, summed
    conserved(job)
    nodes = {n.function: n for n in job.root.children}
    assert set(nodes) == {"[node node-a]", "[node node-b]", SELF_NODE, IDLE_NODE}
    for name, p in (("node-a", a), ("node-b", b)):
        node = nodes[f"[node {name}]"]
        assert node.energy_j == pytest.approx(p.totals.attributed_j, rel=1e-12)
        assert [n for n, _ in node.walk() if n.function == "node_work"]
    rows = {r["host"]: r for r in job.meta["distributed"]["nodes"]}
    assert rows["node-a"]["energy_j"] == a.totals.energy_j and rows["node-b"]["idle_j"] == b.totals.idle_j
    assert {p.host for p in job.processes} == {"node-a", "node-b"}
    # The joined file is an ordinary profile: `energyprof report` renders it again.
    res = run_cli(["report", "job.json", "-o", "again.html", "-q", "--idle", "all"], cwd=two_nodes)
    assert res.returncode == 0, res.stderr
    assert (two_nodes / "again.html").stat().st_size > 10_000


def test_a_machine_that_sent_nothing_is_named(two_nodes: Path) -> None:
    res = run_cli(["merge", "a.json", "b.json", "-o", "three.json", "--hosts", "node-a,node-b,node-c"], cwd=two_nodes)
    assert res.returncode == 0, res.stderr
    assert "machine node-c sent no profile" in res.stderr
    job = load(two_nodes / "three.json")
    assert [n.extra["hosts"] for n in job.notes if n.kind == "missing-machine"] == [["node-c"]]


def test_a_machine_is_known_by_its_boot_id_not_its_host_name(two_nodes: Path) -> None:
    """Two containers on one machine (or two of an engine's nodes) have their own host names and
    share the kernel: one machine, its runs each counted once, never two machines' idle."""
    a, b = (load(two_nodes / f"{n}.json") for n in ("a", "b"))
    for p in (a, b):
        p.meta["host"]["boot_id"] = "one-kernel"
    job = merge([a, b], ["a", "b"])
    holders = [n.function for n in job.root.children if n.function.startswith("[node ")]
    assert holders == []  # one machine: no node holders
    assert any(n.kind == "runs-added" for n in job.notes)  # the two runs did not overlap: each once
    assert job.totals.energy_j == {s: a.totals.energy_j[s] + b.totals.energy_j[s] for s in a.totals.energy_j}
    conserved(job)


def test_merge_twice_the_same_rank_is_refused(two_nodes: Path) -> None:
    a, b = load(two_nodes / "a.json"), load(two_nodes / "a.json")
    for p in (a, b):
        p.meta["distributed"] = {"mode": "per-rank", "rank": 0, "world_size": 2, "job": "j", "host": "h"}
    b.meta["pid"] += 1  # another run that says it was rank 0 too
    with pytest.raises(MergeError, match="both rank 0"):
        merge([a, b], ["x", "y"])
    joined = merge([a], ["x"])
    assert joined.meta["distributed"]["missing_ranks"] == [1]
    assert any(n.kind == "missing-rank" for n in joined.notes)


def test_merge_refuses_the_same_run_twice(two_nodes: Path) -> None:
    """`merge A.json A.json` (or A and a copy of it) doubled the program's energy: one line, exit 2, nothing
    written. A run is its machine's boot, its process and its start."""
    import shutil

    shutil.copy(two_nodes / "a.json", two_nodes / "a-copy.json")
    for args in (["a.json", "a.json"], ["a.json", "b.json", "a-copy.json"]):
        res = run_cli(["merge", *args, "-o", "twice.json"], cwd=two_nodes)
        assert res.returncode == 2 and res.stdout == "" and not (two_nodes / "twice.json").exists(), res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "same run" in res.stderr, res.stderr


@pytest.mark.browser
def test_merged_report_renders_in_chromium(two_nodes: Path) -> None:
    from test_report_browser import ARGS, Page, _chromium

    exe = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed")
    if exe is None:
        pytest.skip("no chromium on this machine")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=ARGS)
        try:
            page = Page(browser)
            page.open(two_nodes / "job.html")
            text = page.page.inner_text("body")
            assert page.errors == [] and page.blocked == []
            assert "node_work" in text
        finally:
            browser.close()


# ---------------------------------------------------------------- property: conservation by construction


def _rank_profile(host: str, rank: int, machine: float, prog: float, own: float, prog_all: float,
                  duration: float) -> Profile:
    """A rank's profile with the ledger's shape: a function, [energyprof], idle; both policies."""
    idle = machine - prog - own
    own_all = own
    root = Node("train.py", self_energy_j={"cpu": 0.0}, other_policy_self_energy_j={"cpu": 0.0})
    root.children = [Node("step", self_energy_j={"cpu": prog}, other_policy_self_energy_j={"cpu": prog_all}),
                     Node(SELF_NODE, self_energy_j={"cpu": own}, other_policy_self_energy_j={"cpu": own_all}),
                     Node(IDLE_NODE, self_energy_j={"cpu": idle}, other_policy_self_energy_j={"cpu": 0.0})]
    root.fill_inclusive()
    meta = {"idle_policy": "share", "target": "train.py",
            "distributed": {"mode": "per-rank", "rank": rank, "world_size": 4, "job": "j", "host": host, "node": "0"}}
    return Profile(meta, [{"id": "cpu", "component": "cpu"}],
                   Totals({"cpu": machine}, {"cpu": prog}, {"cpu": own}, {"cpu": idle}, duration), root)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["h1", "h2"]), st.floats(1.0, 1e4), st.floats(0.0, 1.0),
                          st.floats(0.0, 0.1), st.floats(0.5, 5.0)), min_size=1, max_size=4))
def test_merge_conserves_under_both_policies(ranks) -> None:
    profiles = []
    for r, (host, machine, share, own_f, duration) in enumerate(ranks):
        own = own_f * machine
        prog = share * (machine - own) / len(ranks)
        profiles.append(_rank_profile(host, r, machine, prog, own, machine - own, duration))
    job = merge(profiles)
    conserved(job)
    # Each node's machine energy once: the longest reading on that node, not the sum of its ranks.
    for row in job.meta["distributed"]["nodes"]:
        group = [p for p in profiles if p.meta["distributed"]["host"] == row["host"]]
        longest = max(group, key=lambda p: p.totals.duration_s)
        assert row["energy_j"]["cpu"] >= longest.totals.energy_j["cpu"] * (1 - 1e-12)
        assert row["energy_j"]["cpu"] <= max(longest.totals.energy_j["cpu"],
                                             sum(p.totals.attributed_j["cpu"] + p.totals.energyprof_j["cpu"]
                                                 for p in group)) * (1 + 1e-12)
    assert job.meta["distributed"]["missing_ranks"] == list(range(len(ranks), 4))
    for policy in ("share", "all"):
        q = job.with_policy(policy)
        assert all(v >= -1e-9 for n, _ in q.walk() for v in n.self_energy_j.values())
    # under `all` every rank left nothing idle, so the job leaves nothing: zero, not float dust
    assert job.with_policy("all").find(IDLE_NODE)[0].self_energy_j["cpu"] == 0.0


# ---------------------------------------------------------------- runs in time, and windows


def _run(host: str, started: str, duration: float, machine: float, prog: float, rank: int | None = None) -> Profile:
    """One run of `duration` s from `started` on `host`: `machine` J measured, `prog` J the program's
    (all of it under `all`), with one window over the whole run holding both policies' parts."""
    from energyprof.facts.profile import Window

    p = _rank_profile(host, rank if rank is not None else 0, machine, prog, 0.0, machine, duration)
    if rank is None:
        del p.meta["distributed"]
        p.meta["host"] = {"name": host}
    else:
        p.meta["distributed"]["job"] = f"job@{started}"
    p.meta["started_at"] = started
    p.windows = [Window("epoch", 0, 0, 0.0, duration, duration, {"cpu": machine}, pid=1, rank=rank,
                        program_energy_j={"cpu": prog}, other_policy_program_energy_j={"cpu": machine})]
    return p


def test_runs_that_did_not_overlap_are_added_and_a_note_says_so() -> None:
    a = _run("h", "2026-01-01T10:00:00+00:00", 10.0, 329.0, 100.0)
    b = _run("h", "2026-01-01T11:00:00+00:00", 5.0, 164.0, 50.0)
    job = merge([a, b], ["a.json", "b.json"])
    assert job.totals.energy_j["cpu"] == pytest.approx(493.0, rel=1e-12)  # not one run's 329 J
    assert job.totals.attributed_j["cpu"] == pytest.approx(150.0, rel=1e-12)
    assert [n.kind for n in job.notes] == ["runs-added"] and "did not overlap" in job.notes[0].message
    conserved(job)
    # the same two runs, overlapping in time, are one reading of the machine: counted once
    c = _run("h", "2026-01-01T10:00:04+00:00", 5.0, 164.0, 50.0)
    once = merge([a, c], ["a.json", "c.json"])
    assert once.totals.energy_j["cpu"] == pytest.approx(329.0, rel=1e-12)
    assert not [n for n in once.notes if n.kind == "runs-added"]
    conserved(once)


def test_merged_windows_keep_the_programs_part_under_both_policies() -> None:
    r0 = _run("h", "2026-01-01T10:00:00+00:00", 10.0, 300.0, 120.0, rank=0)
    r1 = _run("h", "2026-01-01T10:00:00.5+00:00", 9.0, 270.0, 100.0, rank=1)
    r1.meta["distributed"]["job"] = r0.meta["distributed"]["job"]
    job = merge([r0, r1])
    assert [w.program_energy_j for w in job.windows] == [{"cpu": 120.0}, {"cpu": 100.0}]
    # under `all` the node (300 J, no energyprof) is split between the ranks as their figures are
    alls = [w.program_energy_j["cpu"] for w in job.with_policy("all").windows]
    assert alls == pytest.approx([300.0 * 300 / 570, 270.0 * 300 / 570], rel=1e-12)
    assert job.totals.energy_j["cpu"] == 300.0  # one node, one run: counted once
    back = Profile.from_dict(json.loads(job.to_json()))
    assert back.windows == job.windows


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.floats(1.0, 80.0)), min_size=1, max_size=5))
def test_a_nodes_runs_add_up_once_each(spans_in) -> None:
    """Any runs of one node on a 30 W machine, each program a tenth of it: the job's machine energy
    is, per group of runs that overlapped in time, the longest run's; groups are added."""
    runs = [(m, d, 30.0 * d) for m, d in spans_in]
    profiles = [_run("h", f"2026-01-01T10:{m:02d}:00+00:00", d, e, e / 10) for m, d, e in runs]
    job = merge(profiles)
    conserved(job)
    spans = sorted((m * 60.0, m * 60.0 + d, e) for m, d, e in runs)
    want, end, best = 0.0, None, None
    for lo, hi, e in spans:
        if end is not None and lo < end:
            end, best = max(end, hi), max(best, (hi - lo, e))
        else:
            want += best[1] if best else 0.0
            end, best = hi, (hi - lo, e)
    want += best[1] if best else 0.0
    assert job.totals.energy_j["cpu"] == pytest.approx(want, rel=1e-9)


# ---------------------------------------------------------------- the idle policy travels with the job


def test_a_join_of_ranks_run_under_all_stays_all_and_conserves() -> None:
    """Ranks run with `--idle all` join into a job under `all` (before, merge wrote every job as
    `share`, whatever its ranks were run under); `policy=` chooses the other view, and both conserve."""
    ranks = [_rank_profile("h1", r, 100.0, 20.0, 1.0, 99.0 / 2, 2.0).with_policy("all") for r in (0, 1)]
    job = merge(ranks)
    assert job.idle_policy == "all"
    conserved(job)
    # under all the two ranks paid for the whole node, less energyprof's part: nothing is idle
    assert job.totals.idle_j["cpu"] == 0.0
    assert job.totals.attributed_j["cpu"] + job.totals.energyprof_j["cpu"] == pytest.approx(100.0, rel=1e-12)
    seen_as_share = merge(ranks, policy="share")
    assert seen_as_share.idle_policy == "share"
    assert seen_as_share.totals.attributed_j["cpu"] == pytest.approx(40.0, rel=1e-12)
    assert merge([_rank_profile("h1", 0, 100.0, 20.0, 1.0, 99.0, 2.0)]).idle_policy == "share"
    with pytest.raises(MergeError, match="idle policy must be one of share, all"):
        merge(ranks, policy="most")


def test_merge_subcommand_keeps_the_ranks_policy_and_takes_idle(tmp_path: Path) -> None:
    ranks = [_rank_profile("h1", r, 100.0, 20.0, 1.0, 99.0 / 2, 2.0).with_policy("all") for r in (0, 1)]
    for r, p in enumerate(ranks):
        p.save(tmp_path / f"r{r}.json")
    assert run_cli(["merge", "r0.json", "r1.json", "-o", "job.json", "-q"], cwd=tmp_path).returncode == 0
    assert load(tmp_path / "job.json").idle_policy == "all"
    assert run_cli(["merge", "r0.json", "r1.json", "-o", "s.json", "-q", "--idle", "share"], cwd=tmp_path).returncode == 0
    assert load(tmp_path / "s.json").idle_policy == "share"
    bad = run_cli(["merge", "r0.json", "r1.json", "-o", "x.json", "--idle", "most"], cwd=tmp_path)
    assert bad.returncode == 2 and "idle policy must be one of share, all" in bad.stderr
    assert not (tmp_path / "x.json").exists()


# ---------------------------------------------------------------- I/O facts


def _io(reads: list[int]) -> dict:
    """A profile's `io` as collect/io.py writes it: one disk, counters at 0, 1, 2 s."""
    return {"t_s": [0.0, 1.0, 2.0], "process": {"read_bytes": [r * 512 for r in reads]},
            "disks": {"vda": {"reads": [0, 10, 20], "read_sectors": reads, "writes": [0, 0, 0],
                              "write_sectors": [0, 0, 0], "busy_ms": [0, 100, 200]}},
            "sector_bytes": 512, "method": "measured"}


def test_merged_profiles_keep_each_nodes_io() -> None:
    from energyprof.analysis.io import io_in_span, io_of

    a = _run("h1", "2026-01-01T10:00:00+00:00", 2.0, 60.0, 20.0, rank=0)
    b = _run("h2", "2026-01-01T10:00:01+00:00", 2.0, 60.0, 20.0, rank=1)
    b.meta["distributed"]["job"] = a.meta["distributed"]["job"]
    a.extra["io"], b.extra["io"] = _io([0, 2000, 4000]), _io([0, 6000, 6000])
    job = merge([a, b])
    nodes = job.extra["io"]["nodes"]
    assert nodes["h1"][0]["disks"]["vda"]["read_sectors"] == [0, 2000, 4000]
    assert nodes["h2"][0]["t_s"] == [1.0, 2.0, 3.0]  # on the job's clock: h2 started 1 s later
    back = Profile.from_dict(json.loads(job.to_json()))
    assert back.extra["io"] == job.extra["io"]
    # one node, one run: its io as it was (shifted to the job's clock), so its windows' MB read still come from it
    one = merge([a])
    assert io_in_span(io_of(one), 0.0, 2.0)["disk_read_mb"] == pytest.approx(4000 * 512 / 1e6)


# ---------------------------------------------------------------- the processes rows add up under either policy


def _with_processes(p: Profile, pid: int) -> Profile:
    """A rank's profile with its processes table as the ledger writes it: the rank and a worker, their
    energies under the profile's policy and the other's beside them, each adding up to the program."""
    from energyprof.record import replace

    prog, prog_all = p.totals.attributed_j["cpu"], p.root.children[0].other_policy_self_energy_j["cpu"]
    procs = [Process(pid, None, "python train.py", "main", energy_j={"cpu": 0.75 * prog},
                     other_policy_energy_j={"cpu": 0.75 * prog_all}),
             Process(pid + 1, pid, "python -c worker", "worker", energy_j={"cpu": 0.25 * prog},
                     other_policy_energy_j={"cpu": 0.25 * prog_all})]
    return replace(p, processes=procs)


def _rows_add_up(p: Profile) -> None:
    for policy in ("share", "all"):
        q = p.with_policy(policy)
        rows = sum(sum(proc.energy_j.values()) for proc in q.processes)
        assert rows == pytest.approx(sum(q.totals.attributed_j.values()), rel=1e-9, abs=1e-9), policy


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["h1", "h2"]), st.floats(1.0, 1e4), st.floats(0.0, 1.0),
                          st.floats(0.0, 0.1), st.floats(0.3, 1.0)), min_size=1, max_size=4),
       st.sampled_from(["share", "all"]))
def test_merged_processes_rows_equal_the_program_under_both_policies(ranks, run_under) -> None:
    """Defect: with `--idle all` a joined job's processes rows summed 1.65% below the program: merge scales
    the ranks' `all` figures so a node's ranks share its program energy, and left their processes' as they
    were. They are scaled alike now, and under `share` they still add up."""
    profiles = []
    for r, (host, machine, share, own_f, all_f) in enumerate(ranks):
        own = own_f * machine
        prog = share * (machine - own) / len(ranks)
        rank = _with_processes(_rank_profile(host, r, machine, prog, own, all_f * (machine - own), 1.0), 1000 * r)
        _rows_add_up(rank)
        profiles.append(rank.with_policy(run_under))
    job = merge(profiles)
    assert job.idle_policy == run_under and len(job.processes) == 2 * len(ranks)
    _rows_add_up(job)


def test_a_real_runs_processes_rows_equal_the_program_under_both_policies(two_nodes: Path) -> None:
    """Defect: `report --idle all` kept the processes rows of the run's own policy (share): 74% below the
    program in a run with a child. Each row keeps both policies' figures, as the tree's nodes do."""
    for name in ("a", "b", "job"):
        p = load(two_nodes / f"{name}.json")
        assert p.processes and all(proc.other_policy_energy_j is not None for proc in p.processes)
        _rows_add_up(p)
    res = run_cli(["report", "job.json", "--idle", "all", "--json", "all.json", "-q"], cwd=two_nodes)
    assert res.returncode == 0, res.stderr
    again = load(two_nodes / "all.json")
    assert again.idle_policy == "all"
    _rows_add_up(again)


# ---------------------------------------------------------------- GPU kernels

MS = 1_000_000
FORWARD = (("train", "t.py", 1), ("forward", "m.py", 5))
BACKWARD = (("train", "t.py", 1), ("backward", "t.py", 9))


def _gpu_rank_profile(host: str, rank: int, watts: list[float]) -> Profile:
    """One rank's kernels on its node's gpu:0 (core/gpu_tree.py, as gpu-trace makes them): a forward GEMM
    alone, then relu and a backward GEMM overlapping, under power that changes every 10 ms."""
    from energyprof.core.gpu_tree import profile_from
    from energyprof.core.kernels import attribute

    kernels = [(FORWARD, 0, "gemm", 0, 10 * MS), (FORWARD, 0, "relu", 20 * MS, 24 * MS),
               (BACKWARD, 0, "gemm_bwd", 22 * MS, 30 * MS)]
    power = {0: [(k * 10 * MS, (k + 1) * 10 * MS, w * 0.01) for k, w in enumerate(watts)]}
    att = attribute(iter(kernels), power, {0: 10 * MS})
    meta = {"target": "train.py", "started_at": "2026-01-01T00:00:00+00:00",
            "host": {"name": host, "boot_id": f"boot-{host}"},
            "distributed": {"rank": rank, "world_size": 2, "host": host}}
    return profile_from(att, start_ns=0, end_ns=len(watts) * 10 * MS, meta=meta, records=len(kernels))


def test_merged_profiles_keep_their_gpu_kernels_each_rank_apart() -> None:
    from energyprof.analysis.gpu import gpu_functions

    a = _gpu_rank_profile("node-a", 0, [300.0, 100.0, 250.0, 50.0])
    b = _gpu_rank_profile("node-b", 1, [200.0, 80.0, 120.0, 60.0, 40.0])
    job = merge([a, b], ["a", "b"])
    gpu = job.gpu_kernels
    assert gpu is not None and gpu.records == 6
    prefix = {0: (("[node node-a]", "", 0), ("[rank 0]", "", 0)), 1: (("[node node-b]", "", 0), ("[rank 1]", "", 0))}
    # every stack kept, under the nodes its rank's samples went under, with its own figures
    want = sorted((prefix[r] + tuple(map(tuple, s.path)), s.joules, s.error_j, s.busy_s)
                  for r, p in ((0, a), (1, b)) for s in p.gpu_kernels.stacks)
    got = sorted((tuple(map(tuple, s.path)), s.joules, s.error_j, s.busy_s) for s in gpu.stacks)
    assert got == want
    # the device: both nodes' gpu:0, added as the source is
    da, db, d = a.gpu_kernels.devices["0"], b.gpu_kernels.devices["0"], gpu.devices["0"]
    assert d.energy_j == pytest.approx(da.energy_j + db.energy_j)
    assert d.idle_j == pytest.approx(da.idle_j + db.idle_j) and d.busy_s == pytest.approx(da.busy_s + db.busy_s)
    assert d.idle_error_j == pytest.approx(da.idle_error_j + db.idle_error_j)
    assert sum(s.joules for s in gpu.stacks) + d.idle_j == pytest.approx(job.totals.energy_j["gpu:0"], rel=1e-12)
    conserved(job)
    # the views: a function in both ranks holds both ranks' joules and bars; each rank's node its own
    rows = {r.function: r for r in gpu_functions(job)}
    alone = [{r.function: r for r in gpu_functions(p)} for p in (a, b)]
    assert rows["forward"].joules == pytest.approx(alone[0]["forward"].joules + alone[1]["forward"].joules)
    assert rows["forward"].error_j == pytest.approx(alone[0]["forward"].error_j + alone[1]["forward"].error_j)
    assert rows["forward"].error_j > 0
    for r, one in enumerate(alone):
        rank = rows[f"[rank {r}]"]
        assert rank.joules == pytest.approx(one["train"].joules) and rank.error_j == pytest.approx(one["train"].error_j)
    # the tree holds the same joules as the kernel facts, rank by rank ([GPU idle] is in the rank's tree)
    for r, p in ((0, a), (1, b)):
        (node,) = job.find(f"[rank {r}]")
        kernels_j = sum(s.joules for s in gpu.stacks if tuple(s.path[1]) == prefix[r][1])
        assert kernels_j == pytest.approx(rows[f"[rank {r}]"].joules)
        assert node.energy_j["gpu:0"] == pytest.approx(kernels_j + p.gpu_kernels.devices["0"].idle_j, rel=1e-12)


def test_merge_subcommand_keeps_gpu_kernels(tmp_path: Path) -> None:
    a = _gpu_rank_profile("node-a", 0, [300.0, 100.0, 250.0, 50.0])
    b = _gpu_rank_profile("node-b", 1, [200.0, 80.0, 120.0, 60.0, 40.0])
    a.save(tmp_path / "a.json")
    b.save(tmp_path / "b.json")
    res = run_cli(["merge", "a.json", "b.json", "-o", "job.json", "--html", "job.html", "-q"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    saved = load(tmp_path / "job.json").gpu_kernels
    assert saved is not None
    assert saved.to_dict() == merge([load(tmp_path / "a.json"), load(tmp_path / "b.json")], ["a.json", "b.json"]
                                    ).gpu_kernels.to_dict()
    page = (tmp_path / "job.html").read_text()
    assert 'id="gpu"' in page and "gemm_bwd" in page
