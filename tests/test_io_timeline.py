"""The disks' read MB/s (IOPS in the hover) on the report's timeline, from the profile's recorded counters."""

from __future__ import annotations

import pytest

from energyprof.analysis.io import read_rates
from energyprof.facts.blocks import read_io
from energyprof.analysis.report import build
from energyprof.facts.profile import IDLE_NODE
from energyprof.facts.profile import Node
from energyprof.facts.profile import Profile
from energyprof.facts.profile import Timeline
from energyprof.facts.profile import Totals
from energyprof.render.charts import timeline_figure

# one disk read at 0, 1, 2, 4 s: 20,000 sectors (10.24 MB) and 100 reads in the first second, none in
# the next, 40,000 sectors and 400 reads over the last two seconds
IO = {"t_s": [0.0, 1.0, 2.0, 4.0], "process": {},
      "disks": {"vda": {"reads": [0, 100, 100, 500], "read_sectors": [0, 20000, 20000, 60000], "writes": [0] * 4,
                        "write_sectors": [0] * 4, "busy_ms": [0] * 4}}, "sector_bytes": 512}


def test_read_rates_per_interval_and_pooled() -> None:
    r = read_rates(read_io(IO), 100)
    assert r["t_s"] == [0.0, 1.0, 2.0, 4.0]
    assert r["mb_s"] == pytest.approx([10.24, 0.0, 10.24])
    assert r["iops"] == pytest.approx([100.0, 0.0, 200.0])
    two = read_rates(read_io(IO), 2)  # pooled in pairs: [0, 2] then [2, 4]
    assert two["t_s"] == [0.0, 2.0, 4.0] and two["mb_s"] == pytest.approx([5.12, 10.24])
    assert read_rates(read_io({"absent": "no /proc"}), 100) is None


def _profile(io: dict | None) -> Profile:
    root = Node("train.py", self_energy_j={"cpu": 0.0})
    root.children = [Node("step", self_energy_j={"cpu": 30.0}), Node(IDLE_NODE, self_energy_j={"cpu": 10.0})]
    root.fill_inclusive()
    p = Profile({"idle_policy": "share", "target": "train.py"}, [{"id": "cpu", "component": "cpu"}],
                Totals({"cpu": 40.0}, {"cpu": 30.0}, {"cpu": 0.0}, {"cpu": 10.0}, 4.0), root,
                timeline=Timeline(t_s=[0.5, 1.5, 2.5, 3.5], start_s=[0.0, 1.0, 2.0, 3.0], end_s=[1.0, 2.0, 3.0, 4.0],
                                  power_w={"cpu": [10.0] * 4}))
    if io is not None:
        p.extra["io"] = io
    return p


def test_the_timeline_draws_disk_reads_on_its_own_axis() -> None:
    fig = timeline_figure(build(_profile(IO)))
    disk = next(t for t in fig["data"] if t["name"] == "disk read (MB/s)")
    assert disk["x"] == [0.0, 1.0, 2.0, 4.0] and disk["y"] == pytest.approx([10.24, 0.0, 10.24, 10.24])
    assert disk["customdata"][:3] == pytest.approx([100.0, 0.0, 200.0]) and "measured" in disk["hovertemplate"]
    assert disk["yaxis"] == "y4" and fig["layout"]["yaxis4"]["overlaying"] == "y"
    plain = timeline_figure(build(_profile(None)))
    assert all(t["name"] != "disk read (MB/s)" for t in plain["data"]) and "yaxis4" not in plain["layout"]


def test_a_loops_cache_readings_are_not_shaded_as_windows() -> None:
    from energyprof.facts.profile import Window

    p = _profile(IO)
    p.windows = [Window("epoch", 0, 0, 0.5, 3.5, 3.0, {"cpu": 30.0}),
                 Window("step.cache.start", 0, 0, 0.6, 0.6, 0.0, {"cpu": 0.0}, loop={"residency": 0.0})]
    layout = timeline_figure(build(p))["layout"]
    assert [a["text"] for a in layout["annotations"]] == ["epoch"] and len(layout["shapes"]) == 1
