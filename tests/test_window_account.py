"""One typed window account (facts/policy.WindowAccount), produced by the ledger and read by every
view of a window; and the agent, which holds no policy: the supervisor hands back the figures of
the run's one policy."""

from __future__ import annotations

from energyprof.core import ledger_state
import ast
from pathlib import Path

import pytest

from energyprof.core.ledger import Ledger
from energyprof.core.recording import Tick
from energyprof.core.tree import build_profile
from energyprof.facts.policy import IDLE_POLICIES, PolicyPair, WindowAccount
from energyprof.record import fields

PACKAGE = Path(__file__).resolve().parent.parent / "energyprof"
CPU = {"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}
RAM = {"id": "ram", "component": "dram", "method": "estimated", "sensor": "estimate"}


def charged_ledger() -> Ledger:
    """Two cores; over one second the CPU spends 10 J and the DRAM 2 J; the program burns 0.5 core
    of the 1.0 busy, so under `share` it pays half, under `all` the whole. A window marks the
    middle half of the second."""
    led = Ledger([CPU, RAM], cpus=2)
    led.add_tick(Tick(0, (0.0, 0.0), 0, 0, 0))
    led.begin_window(250_000_000, "step", 3)
    led.end_window(750_000_000, "step", facts={"pipeline_s": 0.125})
    led.add_tick(Tick(1_000_000_000, (10.0, 2.0), 500_000_000, 0, 1_000_000_000))
    led.finish()
    return led


def test_the_ledger_accounts_a_window_by_overlap_under_both_policies() -> None:
    led = charged_ledger()
    (a,) = led.accounts()
    assert isinstance(a, WindowAccount)
    assert (a.name, a.index, a.depth, a.pid) == ("step", 3, 0, None)
    assert (a.start_ns, a.end_ns, a.time_s) == (250_000_000, 750_000_000, 0.5)
    assert a.sources == ("cpu", "ram")
    assert a.machine_j == pytest.approx((5.0, 1.0))  # half the second: half of each source
    assert a.program_j.share == pytest.approx((2.5, 0.5))  # the program's CPU share, 0.5 of the busy 1.0
    assert a.program_j.all == pytest.approx((5.0, 1.0))  # the whole machine, energyprof used none
    assert a.done and a.estimated  # the DRAM figure is an estimate
    assert dict(a.loop) == {"pipeline_s": 0.125}
    assert a.program("share") == pytest.approx({"cpu": 2.5, "ram": 0.5})
    assert a.machine() == pytest.approx({"cpu": 5.0, "ram": 1.0})


def test_an_account_is_frozen() -> None:
    a = charged_ledger().accounts()[0]
    with pytest.raises(AttributeError):
        a.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("policy", IDLE_POLICIES)
def test_the_profiles_window_is_built_from_the_account(policy: str) -> None:
    led = charged_ledger()
    a = led.accounts()[0]
    (w,) = build_profile(led, policy, {}).windows
    other = "all" if policy == "share" else "share"
    assert w.program_energy_j == a.program(policy)  # type: ignore[arg-type]
    assert w.other_policy_program_energy_j == a.program(other)  # type: ignore[arg-type]
    assert w.energy_j == a.machine() and (w.start_s, w.end_s, w.time_s) == (0.25, 0.75, 0.5)
    assert w.loop == {"pipeline_s": 0.125} and w.index == 3


@pytest.mark.parametrize("policy", IDLE_POLICIES)
def test_the_supervisor_hands_back_the_runs_policy_and_the_agent_takes_it_as_it_comes(tmp_path, policy) -> None:
    from energyprof import Measurement
    from energyprof.agent import supervised
    from energyprof.supervise.job import reply_windows

    led = charged_ledger()
    left = reply_windows(str(tmp_path), led, [(7, led.windows[0])], policy)
    assert left == []
    m = Measurement(name="step")
    supervised._Replies({"spool": str(tmp_path)}, 7).fill(m, 250_000_000, 750_000_000)
    a = led.accounts()[0]
    assert m.complete and m.estimated is True
    assert m.energy_j == a.machine()
    assert m.program_energy_j == a.program(policy)  # type: ignore[arg-type]
    assert m.program_energy_j != a.program("all" if policy == "share" else "share")  # type: ignore[arg-type]


def test_a_window_still_open_is_not_handed_back() -> None:
    from energyprof.supervise.job import reply_windows

    led = Ledger([CPU])
    led.add_tick(Tick(0, (0.0,), 0, 0, 0))
    led.begin_window(10, "open")
    waiting = [(7, led.windows[0])]
    assert reply_windows("/nonexistent", led, waiting, "share") == waiting
    assert led.account(led.windows[0]).done is False


def _agent_sources() -> list[Path]:
    agent = PACKAGE / "agent"
    return sorted(agent.rglob("*.py"))


def test_the_agent_names_no_policy_and_reads_no_idle_setting() -> None:
    """The agent runs inside the program and holds no policy choice: no policy's name, no
    `idle` key, no `program_all` column anywhere in its code (docstrings and comments aside)."""
    forbidden = {*IDLE_POLICIES, "idle", "program_all"}
    found = []
    files = _agent_sources()
    assert len(files) >= 8  # the scan reads the agent's modules, not an empty folder
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        docs = {id(node.body[0].value) for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                if node.value in forbidden:
                    found.append(f"{path.name}:{node.lineno} {node.value!r}")
            elif isinstance(node, ast.Attribute) and node.attr in forbidden | {"share"}:
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert found == []


def test_the_agents_environment_carries_no_idle_policy(tmp_path) -> None:
    from energyprof.agent.wire import ENV
    from energyprof.setup.options import Options
    from energyprof.supervise.bootstrap import child_env

    for policy in IDLE_POLICIES:
        env = child_env(Options.from_kwargs({"idle": policy}), str(tmp_path), base={})
        keys = {item.split("=", 1)[0] for item in env[ENV].split("\x1f")}
        assert "spool" in keys and "idle" not in keys


def test_a_pair_of_sources_picks_the_whole_row() -> None:
    pair = PolicyPair(share=(1.0, 2.0), all=(3.0, 4.0))
    a = WindowAccount("w", None, 0, None, 0, 2_000_000_000, ("cpu", "gpu"), (5.0, 6.0), pair)
    assert a.time_s == 2.0 and a.program("all") == {"cpu": 3.0, "gpu": 4.0} and not a.done


def test_the_ledgers_window_is_a_typed_tally_that_a_checkpoint_keeps() -> None:
    """A window inside the ledger is one record (not a dict of columns), and a checkpoint's round trip
    gives back the same tally and so the same account."""
    import json

    from energyprof.core.ledger import WindowTally

    led = Ledger([CPU, RAM], cpus=2)
    led.add_tick(Tick(0, (0.0, 0.0), 0, 0, 0))
    led.begin_window(250_000_000, "step", 3, pid=11)
    led.begin_window(300_000_000, "inner", pid=11)
    led.end_window(750_000_000, "step", pid=11, facts={"pipeline_s": 0.125, "bad": float("nan")})
    led.add_tick(Tick(1_000_000_000, (10.0, 2.0), 500_000_000, 0, 1_000_000_000))
    assert all(isinstance(w, WindowTally) for w in led.windows)
    step, inner = led.windows
    assert (step.depth, inner.depth, step.pid, step.end_ns, inner.end_ns) == (0, 1, 11, 750_000_000, None)
    assert step.loop == {"pipeline_s": 0.125}  # a figure that is not a number is not kept
    back = ledger_state.restore(json.loads(json.dumps(ledger_state.save(led))))  # the interval is not charged yet
    assert back.windows == led.windows and not any(w.done for w in back.windows)
    for ledger in (led, back):
        ledger.finish()
    assert back.windows == led.windows and step.done and step.machine == pytest.approx([5.0, 1.0])
    assert back.accounts() == led.accounts() and back.accounts()[1].end_ns == 1_000_000_000


def test_every_view_of_a_saved_window_reads_its_two_totals_from_the_fact() -> None:
    """The profile's Window holds a window's totals (the machine's, the program's part); the report's
    row, the sweep's points and a comparison read them there, never summing a window again."""
    from energyprof.analysis import compare as compare_mod
    from energyprof.analysis.pareto import program_energy, window_points
    from energyprof.analysis.windows import WindowRow, window_groups
    from energyprof.facts.records import Window

    w = Window("epoch", 0, 0, 0.0, 2.0, 2.0, {"cpu": 30.0, "gpu": 10.0}, program_energy_j={"cpu": 12.0, "gpu": 10.0})
    old = Window("epoch", 1, 0, 2.0, 4.0, 2.0, {"cpu": 20.0})  # written before windows held the program's part
    assert (w.total_j, w.program_total_j, old.total_j, old.program_total_j) == (40.0, 22.0, 20.0, None)
    assert "total_j" not in w.to_dict() and "program_total_j" not in w.to_dict()  # read from the fact, not saved
    assert [(WindowRow(x).energy, WindowRow(x).program) for x in (w, old)] == [(40.0, 22.0), (20.0, 20.0)]
    assert (program_energy(w), program_energy(old)) == (22.0, None)
    points, program = window_points([[w, old]], "epoch")
    assert not program and [p.energy_j for p in points] == [40.0, 20.0]  # one window lacks the part: the machine's
    (group,) = window_groups([WindowRow(w), WindowRow(old)])
    assert (group.total_j, group.machine_mean_j) == (42.0, 30.0)
    # one row type for one window: a comparison's row is a window name across runs, not a second WindowRow
    assert not hasattr(compare_mod, "WindowRow") or compare_mod.WindowRow is WindowRow
    assert {f.name for f in fields(compare_mod.WindowChange)} >= {"name", "count", "mean_j", "mean_time_s"}
