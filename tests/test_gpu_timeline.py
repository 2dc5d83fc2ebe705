"""The timeline's GPU busy lane: busy seconds per cell from the kernels, drawn as a share of time."""

from __future__ import annotations

import copy

import pytest

from energyprof.analysis.report import build
from energyprof.core.gpu_tree import busy_per_cell
from energyprof.facts.records import GpuDevice, GpuKernels
from energyprof.render import charts
from test_report import small  # noqa: F401 - the fixture

MS = 1_000_000


def test_busy_is_the_union_per_cell():
    cells = [(0, 100 * MS), (100 * MS, 200 * MS), (200 * MS, 300 * MS)]
    # two overlapping kernels (10-60 and 40-80 ms: 70 ms of union), one across the second boundary
    spans = [(10 * MS, 60 * MS), (40 * MS, 80 * MS), (190 * MS, 230 * MS)]
    assert busy_per_cell(spans, cells) == pytest.approx([0.070, 0.010, 0.030])
    assert busy_per_cell([], cells) == [0.0, 0.0, 0.0]


def test_the_timeline_draws_each_devices_busy_share(small):  # noqa: F811
    lane = [[0.0, 0.5, 0.25], [0.5, 1.0, 0.5], [1.0, 2.0, 0.0], [2.0, 3.0, None]]
    prof = copy.deepcopy(small)  # the fixture is shared by the module
    prof.gpu_kernels = GpuKernels("kernels", devices={"0": GpuDevice("gpu:0", busy_lane=lane)})
    fig = charts.timeline_figure(build(prof))
    (busy,) = [t for t in fig["data"] if t["name"] == "gpu:0 busy (%)"]
    assert busy["yaxis"] == "y3" and fig["layout"]["yaxis3"]["range"] == [0, 100]
    # a cell outside a scheduled window (None) is a gap, not 0 %
    assert busy["x"] == [0.0, 0.5, 1.0, 2.0, 3.0] and busy["y"] == [50.0, 100.0, 0.0, None, None]
    assert not busy.get("stackgroup")  # not added to the stacked power


def test_no_kernel_table_no_busy_lane(small):  # noqa: F811
    fig = charts.timeline_figure(build(small))
    assert not any("busy" in t["name"] for t in fig["data"]) and "yaxis3" not in fig["layout"]
