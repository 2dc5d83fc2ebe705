"""The profile's typed GPU facts (facts/records.GpuKernels) and the error bar of each tree node of the
launch stacks, written while the tree is built (core/gpu_tree.py) and shown per function
(analysis/gpu.py): a node's stacks taken together, so samples they share only among themselves move
nothing out of it. Known answers, the truth on power that varies inside each sample, the JSON round
trip, and profiles written when the field was an untyped object."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from energyprof.analysis.gpu import gpu_functions
from energyprof.core.gpu_tree import profile_from
from energyprof.core.kernels import attribute
from energyprof.facts.profile import Profile, ProfileFormatError, load
from energyprof.facts.records import GpuKernels
from test_gpu_error_bars import fine_power  # the same known-answer power, drawn for tree stacks

MS = 1_000_000
FWD = ("forward", "model.py", 20)
GEMM, RELU = ("aten::addmm", "", 0), ("aten::relu", "", 0)


def _round_trip(prof: Profile, tmp_path) -> Profile:
    path = tmp_path / "p.json"
    prof.save(path)
    return load(path)


def _rows(prof: Profile) -> dict:
    return {(r.function, r.file, r.line): r for r in gpu_functions(prof)}


def _turns(n: int = 10):
    """forward launches a GEMM (7 ms) then a relu (3 ms) inside every 10-ms sample; the samples
    alternate 3 J and 7 J (a mean of 300 W, then 700 W: the hottest sample's mean is the peak)."""
    recs, samples = [], []
    for i in range(n):
        t = i * 10 * MS
        recs += [((FWD, GEMM), 0, "gemm", t, t + 7 * MS), ((FWD, RELU), 0, "relu", t + 7 * MS, t + 10 * MS)]
        samples.append((t, t + 10 * MS, 3.0 if i % 2 == 0 else 7.0))
    return recs, samples


def test_a_function_whose_operators_take_turns_in_every_sample_has_the_sensors_error_alone(tmp_path):
    recs, samples = _turns()
    total = sum(j for _, _, j in samples)
    att = attribute(recs, {0: samples}, {0: 10 * MS})
    prof = _round_trip(profile_from(att, start_ns=0, end_ns=100 * MS, meta={"target": "t"}), tmp_path)
    rows = _rows(prof)
    fwd = rows[FWD]
    assert fwd.joules == pytest.approx(total, rel=1e-12)
    assert fwd.error_j == pytest.approx(0.05 * total, rel=1e-9)  # forward holds every busy instant of every sample
    stacks = {s.path[-1]: s for s in prof.gpu_kernels.stacks}
    for op in (GEMM, RELU):  # each operator shares every sample with the other: a large bar of its own
        assert stacks[op].error_j - 0.05 * stacks[op].joules > 0.1 * stacks[op].joules
        assert rows[op].error_j == pytest.approx(stacks[op].error_j, rel=1e-12)  # a node of one stack: its bar
    # by hand: in a 3-J sample (0.3 of the 700-W peak) the GEMM's 7 ms can have drawn all 3 J or only
    # 0.9 J (the relu's 3 ms at 700 W first), against the split's 2.1 J: 1.2 J each way for either
    # stack; a 7-J sample is at the peak throughout, nothing to move. 5 x 1.2 J + the sensor's 5%:
    assert stacks[GEMM].error_j == pytest.approx(6.0 + 0.05 * 35.0) and stacks[RELU].error_j == pytest.approx(6.0 + 0.05 * 15.0)
    # so the former figure, each stack's bar summed, read 14.5 J (29%) where forward's is 2.5 J (5%)
    assert stacks[GEMM].node_error_j[0] == pytest.approx(fwd.error_j) == stacks[RELU].node_error_j[0]


def test_the_run_s_kernel_split_writes_the_node_bars_while_the_tree_is_built():
    """The same turns through a run's reduced kernels (the fold, the split, the graft into a sampled tree)."""
    from test_gpu_kernels import _kernel, _sampled_profile, graft_into

    prof = _sampled_profile()
    path = [("<module>", "train.py", 42), ("train", "train.py", 5), FWD]
    kernels, power = [], []
    for i in range(10):
        kernels += [_kernel("gemm", 10 * i, 7, path, ops=("aten::addmm",)),
                    _kernel("relu", 10 * i + 7, 3, path, ops=("aten::relu",))]
        power.append((i * 10 * MS, (i + 1) * 10 * MS, 3.0 if i % 2 == 0 else 7.0))
    graft_into(prof, kernels, {0: power}, period_ns=10 * MS)
    rows = _rows(prof)
    held = rows[FWD].joules  # the program's share of the GPU inside the profiled span
    assert held > 0
    assert rows[FWD].error_j == pytest.approx(0.05 * held, rel=1e-9)
    assert rows[("train", "train.py", 5)].error_j == pytest.approx(0.05 * held, rel=1e-9)
    assert rows[GEMM].error_j > 0.1 * rows[GEMM].joules
    # the report's panel shows the node's bar
    from energyprof.analysis.report import build
    from energyprof.render.gpu import gpu_panel

    (row,) = [r for r in gpu_panel(build(prof))["functions"] if r["function"] == "forward"]
    assert row["error_j"] == pytest.approx(0.05 * held, rel=1e-9)
    # under the other idle policy the program held twice the GPU (the sampled tree says so): the
    # panel's joules and bars follow the tree's, the same split scaled
    other = "all" if prof.idle_policy == "share" else "share"
    seen = prof.with_policy(other)
    fwd_node = next(n for n, _ in seen.walk() if n.function == "Net.forward")
    again = _rows(seen)
    assert fwd_node.energy_j["gpu:0"] == pytest.approx(2 * held, rel=1e-9)
    assert again[FWD].joules == pytest.approx(2 * held, rel=1e-9)
    assert again[FWD].error_j == pytest.approx(0.05 * 2 * held, rel=1e-9)
    assert seen.gpu_kernels.devices["0"].idle_j == pytest.approx(2 * prof.gpu_kernels.devices["0"].idle_j)
    assert seen.with_policy(prof.idle_policy).gpu_kernels == prof.gpu_kernels


# launch stacks: f on its own and above g and h; g also under k (two nodes: its bar is the sum of
# theirs); f again under g (recursion: counted once, at the outer node)
F, G, H, K = ("f", "a.py", 1), ("g", "a.py", 5), ("h", "a.py", 9), ("k", "b.py", 1)
STACKS = [(F,), (F, G), (F, H), (K,), (K, G), (F, G, F)]




@settings(max_examples=300, deadline=None)
@given(fine_power(STACKS, lambda path, s, e: (path, 0, "k", s, e)))
def test_the_true_error_lies_inside_each_functions_node_bar(case):
    samples, fine, records, peak = case
    truth = attribute(records, {0: fine}, {0: 0.0})
    att = attribute(records, {0: samples}, {0: 0.0}, peak_w={0: peak}, sensor_error=0.03)
    prof = profile_from(att, start_ns=0, end_ns=samples[-1][1], meta={"target": "t"})
    prof = Profile.from_dict(json.loads(prof.to_json()))  # what a saved profile gives back
    total = sum(j for _, _, j in samples)
    eps = 1e-9 * max(1.0, total)
    for row in gpu_functions(prof):
        frame = (row.function, row.file, row.line)
        under = [s for s in truth.stacks if frame in s]
        true_j = sum(truth.stacks[s][0].joules for s in under)
        assert row.joules == pytest.approx(sum(att.stacks[s][0].joules for s in under), rel=1e-9, abs=eps)
        assert abs(true_j - row.joules) <= row.error_j + eps, (frame, true_j, row.joules, row.error_j)
        assert row.error_j <= sum(att.stacks[s][0].error_j for s in under) + eps  # never wider than the former sum


def _old_profile(tmp_path) -> dict:
    """A profile as written when `gpu_kernels` was an untyped object: no node bars, no idle bar."""
    recs, samples = _turns()
    att = attribute(recs, {0: samples}, {0: 10 * MS})
    doc = profile_from(att, start_ns=0, end_ns=100 * MS, meta={"target": "t"}).to_table()
    for s in doc["gpu_kernels"]["stacks"]:
        del s["node_error_j"]
    for d in doc["gpu_kernels"]["devices"].values():
        del d["idle_error_j"]
    return doc


def test_a_profile_with_the_untyped_field_loads_into_the_record(tmp_path):
    doc = _old_profile(tmp_path)
    doc["gpu_kernels"]["from_a_newer_version"] = {"x": 1}  # an unknown field is kept for the round trip
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    prof = load(path)
    assert isinstance(prof.gpu_kernels, GpuKernels) and "gpu_kernels" not in prof.extra
    assert all(s.node_error_j is None for s in prof.gpu_kernels.stacks)
    assert prof.gpu_kernels.devices["0"].idle_error_j is None and prof.gpu_kernels.cycles is None
    # without node bars a function's bar is its stacks' summed, the bound it always was
    fwd = _rows(prof)[FWD]
    assert fwd.error_j == pytest.approx(sum(s.error_j for s in prof.gpu_kernels.stacks), rel=1e-12)
    # written again, the same shape and fields
    again = prof.to_table()["gpu_kernels"]
    assert again == doc["gpu_kernels"]


def test_the_record_survives_a_round_trip(tmp_path):
    recs, samples = _turns()
    prof = profile_from(attribute(recs, {0: samples}, {0: 10 * MS}), start_ns=0, end_ns=100 * MS, meta={"target": "t"})
    back = _round_trip(prof, tmp_path)
    assert back.gpu_kernels == prof.gpu_kernels


@pytest.mark.parametrize("where, value, words", [
    (("stacks", 0, "joules"), -1.0, "must not be negative"),
    (("stacks", 0, "node_error_j"), [0.1], "one number per frame"),
    (("stacks", 0, "path"), [["f", "a.py", "one"]], "must be an integer"),
    (("devices", "0", "busy_lane"), [[0.0, 1.0]], "busy_lane"),
    (("devices", "0", "energy_j"), 1e300, "1e100"),
    (("stacks",), {"not": "a list"}, "stacks a list"),
])
def test_a_crafted_gpu_field_is_refused_with_one_line(tmp_path, where, value, words):
    doc = _old_profile(tmp_path)
    doc["gpu_kernels"]["stacks"][0]["node_error_j"] = [0.0] * len(doc["gpu_kernels"]["stacks"][0]["path"])
    target = doc["gpu_kernels"]
    for k in where[:-1]:
        target = target[k]
    target[where[-1]] = value
    with pytest.raises(ProfileFormatError, match=words):
        Profile.from_dict(doc)
