"""Where /proc is missing (macOS), the recorder reads nothing and the report and its JSON say I/O is absent
and why, instead of leaving the columns out silently."""

from __future__ import annotations

from pathlib import Path

from energyprof.analysis.report import build
from energyprof.collect.io import ABSENT, IoRecorder
from energyprof.facts.profile import IDLE_NODE
from energyprof.facts.profile import Node
from energyprof.facts.profile import Profile
from energyprof.facts.profile import Totals
from energyprof.render.html import render_html


def _profile() -> Profile:
    root = Node("train.py", self_energy_j={"cpu": 0.0})
    root.children = [Node("step", self_energy_j={"cpu": 8.0}), Node(IDLE_NODE, self_energy_j={"cpu": 2.0})]
    root.fill_inclusive()
    return Profile({"idle_policy": "share", "target": "train.py"}, [{"id": "cpu", "component": "cpu"}],
                   Totals({"cpu": 10.0}, {"cpu": 8.0}, {"cpu": 0.0}, {"cpu": 2.0}, 1.0), root)


def test_no_proc_means_io_said_absent_in_the_json_and_the_report(tmp_path: Path) -> None:
    rec = IoRecorder(lambda: 1, proc_root=str(tmp_path / "no-proc"), sys_root=str(tmp_path / "no-sys"))
    rec(1_000)  # a tick reads nothing
    p = _profile()
    p.extra["io"] = rec.fact(0)
    assert p.extra["io"] == {"absent": ABSENT}
    model = build(p)
    assert model.derived()["io"] == {"absent": ABSENT}
    html = render_html(model)
    assert "I/O is not recorded on this system" in html and "no MB read, IOPS or disk busy time" in html


def test_a_profile_with_io_says_nothing_of_absence(tmp_path: Path) -> None:
    p = _profile()
    p.extra["io"] = {"t_s": [0.0, 1.0], "process": {"read_bytes": [0, 10**6]}, "disks": {}, "sector_bytes": 512}
    model = build(p)
    assert model.derived()["io"]["process_read_mb"] == 1.0
    assert "no MB read, IOPS or disk busy time" not in render_html(model)
