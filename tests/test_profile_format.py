"""The saved profile: /2 (flat node table) written and read at any depth, /1 still read, crafted
files refused with one line, and the idle policy as a render option of a saved profile."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import run_cli
from conftest_report import hostile_profile, small_profile
from energyprof import load
from energyprof.analysis.report import build
from energyprof.core.tree import attribute
from energyprof.facts.profile import IDLE_NODE
from energyprof.facts.profile import Node
from energyprof.facts.profile import Profile
from energyprof.facts.profile import ProfileFormatError
from energyprof.core.recording import Recording, Sample, Tick

S = 1_000_000_000


def test_round_trip_keeps_every_fact(tmp_path: Path) -> None:
    p = small_profile()
    p.save(tmp_path / "p.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["schema"] == "energyprof.profile/2" and "root" not in doc
    assert doc["nodes"][0]["parent"] == -1
    assert all(0 <= n["parent"] < i for i, n in enumerate(doc["nodes"]) if i)
    again = load(tmp_path / "p.json")
    assert again.to_table() == p.to_table()
    assert [(n.function, d) for n, d in again.walk()] == [(n.function, d) for n, d in p.walk()]
    for a, b in zip(again.walk(), p.walk()):
        assert a[0].energy_j == pytest.approx(b[0].energy_j)  # inclusive figures rebuilt from self ones


def test_a_600_deep_program_is_written_read_and_rendered(tmp_path: Path) -> None:
    """A real program recursing 600 deep: the JSON loads with Python's json, `report` renders it."""
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,20\n")
    (tmp_path / "deep.py").write_text(
        "import sys, time\nsys.setrecursionlimit(5000)\n"
        "def down(n):\n    if n == 0:\n        end = time.perf_counter() + 0.3\n"
        "        while time.perf_counter() < end: pass\n        return 0\n    return down(n - 1) + 1\n"
        "print(down(600))\n")
    res = run_cli(["--power-trace", "trace.csv", "--json", "p.json", "-q", "-o", "r.html", "deep.py"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "600\n"
    doc = json.loads((tmp_path / "p.json").read_text())  # plain json, default recursion limit
    depth = max(_depths(doc["nodes"]))
    assert depth > 600
    again = run_cli(["report", "p.json", "-o", "again.html", "--folded", "f.txt", "-q"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again.html").stat().st_size > 1000
    assert max(line.count(";") for line in (tmp_path / "f.txt").read_text().splitlines()) > 600


def _depths(nodes: list[dict]) -> list[int]:
    depth: list[int] = []
    for n in nodes:
        depth.append(0 if n["parent"] < 0 else depth[n["parent"]] + 1)
    return depth


def test_version_1_files_are_still_read(tmp_path: Path) -> None:
    p = small_profile()
    v1 = p.to_dict()
    assert v1["schema"] == "energyprof.profile/1" and v1["root"]["children"]
    v1["root"]["carbon_g"] = 1.0  # /1 saved derived figures on nodes: ignored now
    (tmp_path / "old.json").write_text(json.dumps(v1))
    old = load(tmp_path / "old.json")
    assert old.total_energy_j == pytest.approx(p.total_energy_j)
    assert old.policies() == ("share",)  # /1 kept one policy's figures
    res = run_cli(["report", "old.json", "-o", "r.html", "-q"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    res = run_cli(["report", "old.json", "--idle", "all", "-o", "r.html"], cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "older" in res.stderr


def _crafted(kind: str) -> str:
    doc = small_profile().to_table()
    if kind == "nan":
        return json.dumps(doc).replace('"self_time_s": 0.6', '"self_time_s": NaN', 1)
    if kind == "negative":
        doc["nodes"][2]["self_energy_j"]["cpu"] = -5.0
    elif kind == "string-energy":
        doc["nodes"][2]["self_energy_j"]["cpu"] = "5"
    elif kind == "bool-line":
        doc["nodes"][2]["line"] = True
    elif kind == "parent-forward":
        doc["nodes"][1]["parent"] = 5
    elif kind == "totals-list":
        doc["totals"] = [1, 2]
    elif kind == "schema0":
        doc["schema"] = "energyprof.profile/0"
    elif kind == "schema3":
        doc["schema"] = "energyprof.profile/3"
    elif kind == "idle-policy":
        doc["meta"]["idle_policy"] = "most"
    elif kind == "infinity-window":
        return json.dumps(doc).replace('"time_s": ', '"time_s": Infinity, "x": ', 1)
    return json.dumps(doc)


@pytest.mark.parametrize("kind,needle", [
    ("nan", "NaN"), ("negative", "negative"), ("string-energy", "finite number"), ("bool-line", "integer"),
    ("parent-forward", "earlier node"), ("totals-list", "totals"), ("schema0", "older"), ("schema3", "newer"),
    ("idle-policy", "idle_policy"), ("infinity-window", "Infinity"),
])
def test_crafted_profiles_are_one_line_and_exit_2(tmp_path: Path, kind: str, needle: str) -> None:
    (tmp_path / "bad.json").write_text(_crafted(kind))
    with pytest.raises(ProfileFormatError, match=needle):
        load(tmp_path / "bad.json")
    res = run_cli(["report", "bad.json", "-o", "r.html"], cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("energyprof: error:") and needle in lines[0], res.stderr
    assert not (tmp_path / "r.html").exists()


def test_idle_all_is_a_render_of_a_saved_profile(tmp_path: Path) -> None:
    """Defect: `report --idle all` was refused for saved profiles. Both policies are facts now."""
    rec = _recording()
    share, everything = attribute(rec, "share", cpus=2), attribute(rec, "all", cpus=2)
    assert share.policies() == ("share", "all")
    seen = share.with_policy("all")
    assert seen is not share and share.idle_policy == "share"  # a new Profile; the old one untouched
    for a, b in zip(seen.walk(), everything.walk()):
        assert (a[0].function, a[0].energy_j) == (b[0].function, pytest.approx(b[0].energy_j))
    assert seen.totals.attributed_j == pytest.approx(everything.totals.attributed_j)
    assert seen.with_policy("share").totals.idle_j == pytest.approx(share.totals.idle_j)
    share.save(tmp_path / "p.json")
    res = run_cli(["report", "p.json", "--idle", "all", "--json", "all.json", "-o", "all.html"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "idle policy all" in res.stderr
    rendered = load(tmp_path / "all.json")
    assert rendered.idle_policy == "all"
    assert rendered.totals.attributed_j == pytest.approx(everything.totals.attributed_j)
    assert IDLE_NODE not in {r.function for r in build(rendered).rows}  # nothing in it under `all`


def _recording() -> Recording:
    rec = Recording(sources=[{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}])
    a = rec.stacks.intern([("main", "m.py", 1), ("a", "m.py", 5)])
    b = rec.stacks.intern([("main", "m.py", 1), ("b", "m.py", 9)])
    # 40 W for 2 s on a 2-core machine busy at 1.5 cores, the program using 1 core
    rec.ticks = [Tick(k * S // 10, (40.0 * k / 10,), k * S // 10, 0, 15 * k * S // 100) for k in range(21)]
    rec.samples = [Sample(k * S // 10, (k + 1) * S // 10, a if k < 12 else b, S // 10) for k in range(20)]
    return rec


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 1e3), st.integers(0, 50)), min_size=1, max_size=40))
def test_any_tree_round_trips(shape: list[tuple[int, float, int]]) -> None:
    """Property: whatever the tree's shape, /2 gives back the same facts and inclusive = self + children."""
    root = Node("root")
    nodes = [root]
    for parent_hint, joules, samples in shape:
        child = Node(f"f{len(nodes)}", "x.py", len(nodes), self_samples=samples, self_energy_j={"cpu": joules})
        nodes[min(parent_hint, len(nodes) - 1) * 7 % len(nodes)].children.append(child)
        nodes.append(child)
    root.fill_inclusive()
    p = Profile(meta={"target": "t"}, sources=[{"id": "cpu"}], totals={"energy_j": dict(root.energy_j)}, root=root)
    again = Profile.from_dict(json.loads(p.to_json()))
    assert again.to_table() == p.to_table()
    for n, _ in again.walk():
        kids = math.fsum(c.energy_j.get("cpu", 0.0) for c in n.children)
        assert math.isclose(n.energy_j.get("cpu", 0.0), n.self_energy_j.get("cpu", 0.0) + kids, rel_tol=1e-9,
                            abs_tol=1e-9)


def test_derived_block_is_written_and_ignored_on_load(tmp_path: Path) -> None:
    p = hostile_profile()
    model = build(p)
    (tmp_path / "p.json").write_text(p.to_json(derived=model.derived()))
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["derived"]["totals"]["carbon_g"] == pytest.approx(model.carbon.program_g)
    assert doc["derived"]["totals"]["machine_carbon_g"] == pytest.approx(model.carbon.machine_g)
    doc["derived"]["totals"]["carbon_g"] = "anything"  # not facts: never read back
    (tmp_path / "p.json").write_text(json.dumps(doc))
    assert "derived" not in load(tmp_path / "p.json").extra


def test_idle_node_is_kept_with_nothing_under_all() -> None:
    everything = attribute(_recording(), "all", cpus=2)
    idle = [c for c in everything.root.children if c.function == IDLE_NODE]
    assert idle and idle[0].total_energy == 0.0 and (idle[0].other_policy_self_energy_j or {}).get("cpu", 0) > 0
    assert IDLE_NODE not in {r.function for r in build(everything).rows}  # and not shown


def test_a_damaged_gpu_kernels_record_is_one_line_naming_the_field() -> None:
    import pytest

    from energyprof.facts import records
    from energyprof.facts.profile import ProfileFormatError

    for reader, raw, said in (
            (records._read_gpu_device, [], "d must be an object"),
            (records._read_gpu_device, {"busy_lane": [[0.0, 1.0]]}, "d.busy_lane must be a list of [start_s, end_s, busy_s]"),
            (records._read_gpu_stack, {"path": "f"}, "d.path must be a list of [function, file, line]"),
            (records._read_gpu_stack, {"path": [["f", "a.py", 1]], "kernels": [1]}, "d.kernels must be a list of objects")):
        with pytest.raises(ProfileFormatError) as err:
            reader(raw, "d")
        assert str(err.value) == said
    lane = records._read_gpu_device({"busy_lane": [[0.0, 1.0, None]]}, "d").busy_lane
    assert lane == [[0.0, 1.0, None]]
