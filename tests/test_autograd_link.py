"""Backward ops linked to their forward ops (core/autograd.py): known answers and invariants."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from energyprof.agent.kernels.autograd import (ACCUMULATE_GRAD, BACKWARD_FRAME, HOOK, NO_FORWARD, NO_SEQUENCE, Autograd, Op,
                                      backward_path, link_backward, parents)

MAIN, AUTOGRAD = 4037, 23695  # OS thread ids, as a saved trace names them; the profiler calls the main thread 1
LOOP = (("<module>", "train.py", 1), ("train", "train.py", 10))
FWD = LOOP + (("forward", "model.py", 20),)


def step() -> list[Op]:
    return [
        Op(1, "aten::linear", MAIN, 100, 200, seq=5, stack=FWD),
        Op(2, "aten::t", MAIN, 110, 120, seq=5, stack=FWD),  # made TBackward0 (seq 5), then advanced it
        Op(3, "aten::addmm", MAIN, 130, 190, seq=6, stack=FWD),  # made AddmmBackward0
        Op(4, "aten::relu", MAIN, 210, 220, seq=7, stack=FWD),
        # backward on autograd's thread, while the main thread waits in loss.backward()
        Op(10, "autograd::engine::evaluate_function: AddmmBackward0", AUTOGRAD, 500, 600, seq=6, fwd_tid=1),
        Op(11, "AddmmBackward0", AUTOGRAD, 501, 590, seq=6, fwd_tid=1),
        Op(12, "aten::mm", AUTOGRAD, 510, 580),
        Op(13, "autograd::engine::evaluate_function: TBackward0", AUTOGRAD, 610, 620, seq=5, fwd_tid=1),
        Op(14, "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", AUTOGRAD, 630, 640),
        Op(15, "aten::add_", AUTOGRAD, 631, 639),
        # its forward op ran before the window
        Op(16, "autograd::engine::evaluate_function: MulBackward0", AUTOGRAD, 650, 660, seq=3, fwd_tid=1),
        Op(17, "autograd::engine::evaluate_function: torch::autograd::CppFunctionTensorPreHook", AUTOGRAD, 670, 680),
        Op(20, "aten::add_", MAIN, 700, 710),  # the optimizer, after backward()
    ]


def test_each_backward_op_goes_to_the_latest_forward_op_of_its_sequence_number():
    links = link_backward(step())
    assert links.forward_thread == {1: MAIN}
    assert links.forward_of == {10: 3, 11: 3, 12: 3, 13: 2}  # TBackward0 -> aten::t, not the aten::linear holding it
    assert links.unlinked == {ACCUMULATE_GRAD: 2, NO_FORWARD: 1, HOOK: 1}
    assert set(links.root_of) == {10, 11, 12, 13, 14, 15, 16, 17}
    assert not any(links.is_backward(i) for i in (1, 2, 3, 4, 20))


def test_latest_started_before_the_backward_op():
    ops = [Op(1, "aten::mul", 1, 0, 10, seq=9), Op(2, "aten::mul", 1, 20, 30, seq=9), Op(3, "aten::mul", 1, 900, 910, seq=9),
           Op(4, "autograd::engine::evaluate_function: MulBackward0", 2, 500, 510, seq=9, fwd_tid=1)]
    assert link_backward(ops).forward_of == {4: 2}  # op 3 started after it: not what it differentiates


def test_sequence_numbers_are_per_thread():
    # two forward threads (profiler ids 1 and 2, OS ids 71 and 72) reuse sequence numbers
    ops = [Op(1, "aten::mul", 71, 0, 10, seq=4), Op(2, "aten::div", 72, 0, 10, seq=4), Op(3, "aten::exp", 72, 20, 30, seq=5),
           Op(4, "autograd::engine::evaluate_function: DivBackward0", 80, 100, 110, seq=4, fwd_tid=2),
           Op(5, "autograd::engine::evaluate_function: ExpBackward0", 80, 120, 130, seq=5, fwd_tid=2),
           Op(6, "autograd::engine::evaluate_function: MulBackward0", 81, 100, 110, seq=4, fwd_tid=1)]
    links = link_backward(ops)
    assert links.forward_thread == {2: 72, 1: 71}
    assert links.forward_of == {4: 2, 5: 3, 6: 1}


def test_in_process_ids_are_taken_as_they_are():
    # the profiler's own events: tid and fwd_tid are both its ids
    ops = [Op(1, "aten::mul", 1, 0, 10, seq=4), Op(2, "aten::div", 2, 0, 10, seq=4),
           Op(3, "autograd::engine::evaluate_function: DivBackward0", 3, 100, 110, seq=4, fwd_tid=2)]
    assert link_backward(ops).forward_of == {3: 2}


def test_a_fwdbwd_flow_is_the_link():
    ops = [Op(1, "aten::mul", 1, 0, 10, seq=4), Op(2, "aten::mul", 1, 20, 30, seq=4),
           Op(3, "autograd::engine::evaluate_function: MulBackward0", 2, 100, 110, seq=4, fwd_tid=1),
           Op(4, "autograd::engine::evaluate_function: MulBackward0", 2, 200, 210, fwd_tid=1)]
    links = link_backward(ops, flows={3: 1, 4: 2})
    assert links.forward_of == {3: 1, 4: 2}  # the flow wins over the rule, and links one with no sequence number
    assert link_backward(ops).unlinked == {NO_SEQUENCE: 1}


def test_backward_path_under_the_backward_call_then_the_forward_line():
    caller = LOOP + (("backward", "torch/_tensor.py", 570),)
    frames = {MAIN: [(0, 300, FWD), (400, 690, caller)]}

    def frames_at(tid, t):
        return next((f for a, b, f in frames.get(tid, ()) if a <= t < b), ())

    ag = Autograd(step(), frames_at=frames_at)
    def op(name):
        return (name, "", 0)

    # the forward line beneath [backward], less the loop's frames that hold both it and backward()
    below = (("forward", "model.py", 20),)
    assert ag.path(12) == caller + (BACKWARD_FRAME,) + below + (op("aten::linear"), op("aten::addmm"),
                                                               op("AddmmBackward0"), op("aten::mm"))
    assert ag.path(13) == caller + (BACKWARD_FRAME,) + below + (op("aten::linear"), op("aten::t"), op("TBackward0"))
    assert ag.path(15) == caller + (BACKWARD_FRAME, op("torch::autograd::AccumulateGrad"), op("aten::add_"))
    assert ag.path(3) == FWD + (op("aten::linear"), op("aten::addmm"))
    assert ag.path(20) == (op("aten::add_"),)  # no stack given for it
    # no frames_at: nothing above [backward]
    assert Autograd(step()).path(12)[0] == BACKWARD_FRAME


def test_a_backward_on_the_calling_thread_uses_its_own_stack():
    caller = LOOP + (("backward", "torch/_tensor.py", 570),)
    ops = [Op(1, "aten::mul", 1, 0, 10, seq=4, stack=FWD),
           Op(2, "autograd::engine::evaluate_function: MulBackward0", 1, 100, 110, seq=4, fwd_tid=1, stack=caller)]
    assert Autograd(ops).path(2) == caller + (BACKWARD_FRAME, FWD[-1], ("aten::mul", "", 0), ("MulBackward0", "", 0))


def test_backward_path_is_the_frames_in_order():
    assert backward_path((("a", "f", 1),), (("b", "g", 2),), ["x"], ["autograd::engine::evaluate_function: XBackward0"]) == (
        ("a", "f", 1), BACKWARD_FRAME, ("b", "g", 2), ("x", "", 0), ("XBackward0", "", 0))


def test_parents_by_nesting():
    ops = [Op(1, "a", 1, 0, 100), Op(2, "b", 1, 10, 20), Op(3, "c", 1, 20, 30), Op(4, "d", 1, 21, 22), Op(5, "e", 2, 5, 6)]
    assert parents(ops) == {1: None, 2: 1, 3: 1, 4: 3, 5: None}


NAMES = ["aten::mm", "aten::add", "autograd::engine::evaluate_function: MmBackward0",
         "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "MmBackward0", "hook"]


@st.composite
def op_lists(draw):
    n = draw(st.integers(0, 40))
    ops = []
    for i in range(n):
        start = draw(st.integers(0, 200))
        ops.append(Op(i, draw(st.sampled_from(NAMES)), draw(st.sampled_from([1, 2, 3, 70])), start,
                      start + draw(st.integers(0, 80)), seq=draw(st.integers(-1, 6)),
                      fwd_tid=draw(st.sampled_from([0, 0, 1, 2]))))
    flows = {}
    if ops and draw(st.booleans()):
        for _ in range(draw(st.integers(0, 5))):
            flows[draw(st.sampled_from(ops)).id] = draw(st.sampled_from(ops)).id
    return ops, flows


@settings(max_examples=300, deadline=None)
@given(op_lists())
def test_every_backward_op_is_linked_or_counted_never_both(case):
    ops, flows = case
    links = link_backward(ops, flows)
    backward = set(links.root_of)
    assert set(links.forward_of) <= backward
    assert len(links.forward_of) + sum(links.unlinked.values()) == len(backward)
    reasons: dict[str, int] = {}
    for b in backward:
        r = links.unlinked_reason(b)
        assert (r is None) == (b in links.forward_of)
        if r is not None:
            reasons[r] = reasons.get(r, 0) + 1
    assert reasons == links.unlinked
    by_id = {o.id: o for o in ops}
    for b, f in links.forward_of.items():
        assert f not in backward  # a forward op is never inside backward
        root = by_id[links.root_of[b]]
        if flows.get(b) != f and not any(links.root_of.get(x) == root.id and flows.get(x) == f for x in flows):
            assert by_id[f].seq >= 0 and by_id[f].start_ns <= root.start_ns
    # every op nested in a backward op on its thread is backward, with the same root
    par = parents(ops)
    for o in ops:
        p = par[o.id]
        if p is not None and p in backward:
            assert links.root_of[o.id] == links.root_of[p]
    ag = Autograd(ops, flows)
    for o in ops:
        path = ag.path(o.id)
        assert (BACKWARD_FRAME in path) == (o.id in backward)
