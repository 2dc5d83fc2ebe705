"""The GPU error bars (core/kernels.py): what a power sample shared between lines could move between
them, for any power inside it between 0 and the peak, plus the sensor's relative error. Tested
against the truth on power that varies inside each sample: the truth is the same split on the
fine-grained power (flat within each fine step), the estimate the split on the samples' means."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyprof.core.kernels import DEFAULT_SENSOR_ERROR, IDLE_KEY, attribute, split_energy

MS = 1_000_000


def _per_key(split, keys):
    out: dict = {}
    for k, j in zip(keys, split.joules):
        out[k] = out.get(k, 0.0) + j
    out[IDLE_KEY] = out.get(IDLE_KEY, 0.0) + split.idle_j
    return out


def test_known_answer_a_sliver_of_a_hot_sample():
    # 10 ms at a mean of 300 W (3 J); a busy for its first 1 ms; the card's peak 700 W
    s = split_energy([(0, 10 * MS, 3.0)], [(0, 1 * MS)], keys=["a"], peak_w=700.0)
    assert s.joules == [pytest.approx(0.3)]
    # at most 700 W x 1 ms = 0.7 J can have gone to a (+0.4), and as little as 0 (-0.3): the bar is 0.4
    assert s.bars["a"] == pytest.approx(0.4)
    assert s.bars[IDLE_KEY] == pytest.approx(0.4)  # what a gains idle loses
    # with no peak given, the hottest sample's mean is the peak: this one alone, so flat power and no bar
    assert split_energy([(0, 10 * MS, 3.0)], [(0, 1 * MS)], keys=["a"]).bars.get("a", 0.0) == pytest.approx(0.0, abs=1e-12)


def test_a_sample_one_line_holds_whole_has_no_sharing_error():
    # a holds [0, 10) ms whole (two records back to back), b the next sample whole: no power inside
    # either sample can move joules between them, whatever the peak
    s = split_energy([(0, 10 * MS, 5.0), (10 * MS, 20 * MS, 1.0)], [(0, 4 * MS), (4 * MS, 10 * MS), (10 * MS, 20 * MS)],
                     keys=["a", "a", "b"], peak_w=10_000.0)
    assert s.bars.get("a", 0.0) == 0.0 and s.bars.get("b", 0.0) == 0.0
    att = attribute([("a", 0, "k", 0, 4 * MS), ("a", 0, "k", 4 * MS, 10 * MS), ("b", 0, "k", 10 * MS, 20 * MS)],
                    {0: [(0, 10 * MS, 5.0), (10 * MS, 20 * MS, 1.0)]}, {0: 10 * MS}, peak_w={0: 10_000.0})
    assert att.stacks["a"][0].error_j == pytest.approx(DEFAULT_SENSOR_ERROR * 5.0)  # the sensor's error alone
    assert att.stacks["b"][0].sharing_j == 0.0 and att.stacks["b"][0].sensor_j == pytest.approx(0.05)


# launch stacks as tree paths: ("f",) and ("f", "g") share the node ("f",)
LINES = [("f",), ("f", "g"), ("f", "h"), ("k",)]


def fine_power(paths=tuple(LINES), record=lambda path, s, e: (path, s, e)):
    """Samples, each made of fine steps at their own power (0..peak), and records of a few `paths`
    (each made by `record(path, start, end)`): what the sensor saw and what truly happened inside."""

    @st.composite
    def draw_power(draw):
        peak = 500.0
        samples, fine, t = [], [], 0
        for _ in range(draw(st.integers(1, 5))):
            a, j = t, 0.0
            for _ in range(draw(st.integers(1, 5))):
                w = draw(st.integers(1, 20)) * 1000
                watts = draw(st.sampled_from([0.0, peak, 37.5, 120.0, 333.0]))
                fine.append((t, t + w, watts * w / 1e9))
                j += watts * w / 1e9
                t += w
            samples.append((a, t, j))
        records = []
        for _ in range(draw(st.integers(0, 12))):
            s = draw(st.integers(0, t))
            records.append(record(draw(st.sampled_from(paths)), s, s + draw(st.integers(0, t // 2 + 1))))
        return samples, fine, records, peak

    return draw_power()


@settings(max_examples=400, deadline=None)
@given(fine_power())
def test_the_true_error_lies_inside_each_lines_bar(case):
    samples, fine, records, peak = case
    spans = [(s, e) for _, s, e in records]
    keys = [k for k, _, _ in records]
    true = _per_key(split_energy(fine, spans), keys)
    est_split = split_energy(samples, spans, keys=keys, peak_w=peak)
    est = _per_key(est_split, keys)
    total = sum(j for _, _, j in samples)
    for key in set(keys) | {IDLE_KEY}:
        err = abs(true.get(key, 0.0) - est.get(key, 0.0))
        bar = est_split.bars.get(key, 0.0)
        assert err <= bar + 1e-9 * max(1.0, total), (key, err, bar)
        assert bar <= total + 1e-12  # never more than the joules there are
    # through attribute: the stack's bar is the sharing bar plus the sensor's share, never less
    att = attribute([(k, 0, "k", s, e) for k, s, e in records], {0: samples}, {0: 0.0}, peak_w={0: peak},
                    sensor_error=0.03)
    for key, per in att.stacks.items():
        fig = per[0]
        assert fig.error_j == pytest.approx(fig.sharing_j + 0.03 * fig.joules)
        assert abs(true[key] - fig.joules) <= fig.error_j + 1e-9 * max(1.0, total)
    idle = att.devices[0]
    assert abs(true[IDLE_KEY] - idle.idle_j) <= idle.idle_error_j + 1e-9 * max(1.0, total)
    # a tree node: the joules of every stack beneath it, and one bar for them together, within the
    # sum of theirs (what they share among themselves moves nothing out of the node)
    for node, per in att.group_error_j.items():
        under = [k for k in att.stacks if k[:len(node)] == node]
        true_j = sum(true[k] for k in under)
        est_j = sum(att.stacks[k][0].joules for k in under)
        assert abs(true_j - est_j) <= per[0] + 1e-9 * max(1.0, total)
        assert per[0] <= sum(att.stacks[k][0].error_j for k in under) + 1e-9 * max(1.0, total)


def _phases(heavy_w=700.0, gap_w=100.0, light_w=300.0):
    """A compute phase (2 ms kernels, 20 us launch gaps at 700 / 100 W) then a memory phase (1 ms
    kernels, 300 W), each launched by its own line; the fine power, and 20 ms samples of it whose
    edges do not meet the phase boundary."""
    fine, records, t = [], [], 0
    while t < 4_000 * MS:
        records.append(("heavy", t, t + 2 * MS))
        fine.append((t, t + 2 * MS, heavy_w * 2e-3))
        fine.append((t + 2 * MS, t + 2 * MS + 20_000, gap_w * 20e-6))
        t += 2 * MS + 20_000
    end = t + 3_750 * MS
    while t < end:
        records.append(("light", t, t + MS))
        fine.append((t, t + MS, light_w * 1e-3))
        t += MS
    samples, a = [], 0
    while a < t:
        b = min(t, a + 20 * MS)
        j = sum(e * (min(b, f1) - max(a, f0)) / (f1 - f0) for f0, f1, e in fine if f1 > a and f0 < b)
        samples.append((a, b, j))
        a = b
    return fine, records, samples


def test_a_line_whose_operators_share_its_samples_has_the_bar_of_the_line():
    # forward launches a GEMM then a relu inside every 10-ms sample, back to back: each operator's
    # stack shares every sample with the other (a large bar each), the forward line holds all of them
    fwd, gemm, relu = ("forward",), ("forward", "aten::addmm"), ("forward", "aten::relu")
    recs, samples = [], []
    for i in range(10):
        t = i * 10 * MS
        recs += [(gemm, 0, "gemm", t, t + 7 * MS), (relu, 0, "relu", t + 7 * MS, t + 10 * MS)]
        samples.append((t, t + 10 * MS, 3.0))
    att = attribute(recs, {0: samples}, {0: 10 * MS}, peak_w={0: 700.0})
    assert att.stacks[gemm][0].sharing_j > 0.5 and att.stacks[relu][0].sharing_j > 0.5
    assert att.group_error_j[fwd][0] == pytest.approx(0.05 * 30.0)  # the sensor's alone: forward holds every instant


@pytest.mark.parametrize("peak", [700.0, None], ids=["card-peak", "hottest-sample"])
def test_a_phase_long_kernel_stream_gets_a_bar_of_a_few_percent(peak):
    fine, records, samples = _phases()
    recs = [(k, 0, "gemm" if k == "heavy" else "mul", s, e) for k, s, e in records]
    att = attribute(recs, {0: samples}, {0: 20 * MS}, peak_w=None if peak is None else {0: peak})
    truth = attribute(recs, {0: fine}, {0: 0.0})
    for line in ("heavy", "light"):
        fig, true_j = att.stacks[line][0], truth.stacks[line][0].joules
        assert abs(true_j - fig.joules) <= fig.error_j
        # the sensor's 5%, and what the launch gaps and the one sample across the boundary could move
        assert fig.sensor_j / fig.joules == pytest.approx(0.05)
        assert fig.sharing_j / fig.joules < 0.015, (line, fig.sharing_j / fig.joules)
        assert fig.error_j / fig.joules < 0.07
    # every kernel is shorter than a sample: the former bar, J x P / (d + P), charged each nearly all its joules
    dev = att.devices[0]
    assert dev.short_j == pytest.approx(dev.total_j - dev.idle_j)
