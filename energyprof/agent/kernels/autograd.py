"""Backward ops linked to the forward ops they differentiate, and the tree path of backward's work. Pure.

Autograd runs backward on its own C++ thread (one per device), which has no Python stack. The
profiler marks each backward node's run with an `autograd::engine::evaluate_function: XBackward0`
op; it and the `XBackward0` op nested in it carry the node's sequence number and the forward
thread's id. On the forward thread, every op that runs while grad mode is on records the thread's
next sequence number (`at::sequence_number::peek()`), and the op that creates a node takes that
number and advances it. So several forward ops share one number (`aten::linear` and the `aten::t`
inside it); the latest-started of them is the one that made the node. This is PyTorch's own rule
(`EventList._set_backward_stacktraces` in torch/autograd/profiler_util.py keys forward stacks by
(sequence number, thread); `generateForwardBackwardLink` in the Kineto glue keeps, per key, the
op with the latest start and draws the `fwdbwd` flow from it). Sequence numbers are per thread, so
the key is (forward thread, sequence number).

Two thread ids: `Op.tid` is the thread the op ran on as the source names it (an OS thread id in a
Chrome trace), `Op.fwd_tid` the profiler's own id of the forward thread (1, 2, ... in the order
threads first recorded). In the profiler's in-process events both are the profiler's ids; in a
saved trace they are not, so each `fwd_tid` is resolved to the thread whose forward ops match
most of its backward ops' sequence numbers (a `fwdbwd` flow counts as a certain match).

The tree path of a backward op's work (agent/kernels/frames.py's names): the Python stack of the thread
that called `backward()` at that moment, then `[backward]`, then the forward op's Python stack
(below the frames it shares with that caller) and its operator chain, then the backward ops
holding the work. So `loss.backward()` holds the whole
backward pass, and beneath `[backward]` each model line holds the backward of what it computed.
What cannot be linked (AccumulateGrad, which has no forward op; hooks; a forward op outside the
profiled window) stays under `[backward]` on its backward ops, and is counted by reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .frames import Frame

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterable, Mapping, Sequence

BACKWARD_FRAME: Frame = ("[backward]", "", 0)
EVALUATE_PREFIX = "autograd::engine::evaluate_function: "

# reasons a backward op is not linked (Links.unlinked's keys)
ACCUMULATE_GRAD = "AccumulateGrad (a leaf's gradient: no forward op)"
HOOK = "hook (no forward op)"
NO_SEQUENCE = "no sequence number"
NO_FORWARD = "no forward op with that sequence number in the window"


@dataclass(frozen=True)
class Op:
    """One profiled CPU op. `stack`: the Python frames holding it, outermost first (empty on autograd's thread)."""

    id: int
    name: str
    tid: int
    start_ns: int
    end_ns: int
    seq: int = -1  # sequence number; -1: none
    fwd_tid: int = 0  # on backward ops: the profiler's id of the forward thread (0: not a backward op)
    stack: tuple[Frame, ...] = ()


@dataclass
class Links:
    forward_of: dict[int, int]  # backward op id -> forward op id
    unlinked: dict[str, int]  # reason -> backward ops not linked
    root_of: dict[int, int] = field(default_factory=dict)  # every backward op id -> its outermost backward op's id
    forward_thread: dict[int, int] = field(default_factory=dict)  # fwd_tid -> the Op.tid its forward ops ran on
    reason: dict[int, str] = field(default_factory=dict)  # each unlinked outermost backward op's id -> why

    def unlinked_reason(self, op_id: int) -> str | None:
        """Why a backward op is not linked (None: linked, or not a backward op)."""
        root = self.root_of.get(op_id)
        return None if root is None or op_id in self.forward_of else self.reason.get(root)

    def is_backward(self, op_id: int) -> bool:
        return op_id in self.root_of

    @property
    def unlinked_total(self) -> int:
        return sum(self.unlinked.values())


def parents(ops: Iterable[Op]) -> dict[int, int | None]:
    """Each op's innermost holder on its own thread (None: outermost). Ops on one thread nest (a
    profiler's record functions open and close in order); a span holds another when it starts at or
    before it and has not ended when the other starts."""
    by_thread: dict[int, list[Op]] = {}
    for op in ops:
        by_thread.setdefault(op.tid, []).append(op)
    out: dict[int, int | None] = {}
    for thread_ops in by_thread.values():
        thread_ops.sort(key=lambda o: (o.start_ns, -o.end_ns, o.id))
        open_: list[Op] = []
        for op in thread_ops:
            while open_ and (open_[-1].end_ns < op.start_ns
                             or (open_[-1].end_ns == op.start_ns and open_[-1].start_ns < op.start_ns)):
                open_.pop()
            out[op.id] = open_[-1].id if open_ else None
            open_.append(op)
    return out


def _is_backward_root(op: Op) -> bool:
    return op.name.startswith(EVALUATE_PREFIX) or op.fwd_tid > 0


def _roots(ops: Sequence[Op], by_id: Mapping[int, Op], parent: Mapping[int, int | None]) -> dict[int, int]:
    """Every backward op id -> its outermost backward op's id (an op outside backward has none)."""
    root_of: dict[int, int] = {}
    none: set[int] = set()  # ops neither backward nor held by one: a later walk up stops there, not at the top
    up = parent.get
    for op in ops:
        cur: int | None = op.id
        if cur in root_of or cur in none:
            continue
        chain = []
        found = None
        while cur is not None and cur not in none:
            found = root_of.get(cur)
            if found is not None:
                break
            chain.append(cur)
            cur = up(cur)
        if found is None:  # the outermost backward op on the chain, if any
            for c in reversed(chain):
                if _is_backward_root(by_id[c]):
                    found = c
                    break
            if found is None:
                none.update(chain)
                continue
            outer = chain.index(found)
            none.update(chain[outer + 1:])  # above the outermost backward op: outside backward
            chain = chain[:outer + 1]
        for c in chain:
            root_of[c] = found
    return root_of


def _key_of(r: int, by_id: Mapping[int, Op], members: Mapping[int, list[int]]) -> tuple[int, int]:
    """A root's (sequence number, fwd_tid), from itself or the first nested op that carries them."""
    op = by_id[r]
    if op.seq >= 0:
        return op.seq, op.fwd_tid
    for m in sorted(members[r], key=lambda i: (by_id[i].start_ns, i)):
        if by_id[m].seq >= 0 and by_id[m].fwd_tid > 0:
            return by_id[m].seq, by_id[m].fwd_tid
    return -1, op.fwd_tid


class _Forward:
    """Forward ops (sequence-numbered, not inside backward): per (thread, seq) their (start, id), in order."""

    def __init__(self, ops: Sequence[Op], root_of: Mapping[int, int]) -> None:
        self.by_key: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for op in ops:
            if op.seq >= 0 and op.id not in root_of:
                self.by_key.setdefault((op.tid, op.seq), []).append((op.start_ns, op.id))
        for v in self.by_key.values():
            v.sort()
        self.threads = sorted({t for t, _ in self.by_key})

    def latest(self, thread: int, seq: int, before: int) -> int | None:
        """The latest-started forward op with that number on that thread, started by `before`."""
        found = None
        for start, op_id in self.by_key.get((thread, seq), ()):
            if start > before:
                break
            found = op_id
        return found


def _forward_threads(roots: list[int], keys: Mapping[int, tuple[int, int]], flow_of: Mapping[int, int],
                     forward: _Forward, by_id: Mapping[int, Op]) -> dict[int, int]:
    """Each fwd_tid -> the thread whose forward ops match most of its roots (a flow counts as a match)."""
    votes: dict[int, dict[int, int]] = {}
    for r in roots:
        seq, ftid = keys[r]
        tally = votes.setdefault(ftid, {})
        if r in flow_of:
            t = by_id[flow_of[r]].tid
            tally[t] = tally.get(t, 0) + 1
            continue
        if seq < 0:
            continue
        for t in forward.threads:
            if forward.latest(t, seq, by_id[r].start_ns) is not None:
                tally[t] = tally.get(t, 0) + 1
    return {ftid: max(tally, key=lambda t: (tally[t], t == ftid, -t)) for ftid, tally in votes.items() if tally}


def _reason(op: Op, seq: int) -> str:
    if "AccumulateGrad" in op.name:
        return ACCUMULATE_GRAD
    if "Hook" in op.name or "hook" in op.name:
        return HOOK
    return NO_SEQUENCE if seq < 0 else NO_FORWARD


def link_backward(ops: Sequence[Op], flows: Mapping[int, int] | None = None,
                  parent: Mapping[int, int | None] | None = None, by_id: Mapping[int, Op] | None = None) -> Links:
    """Link each backward op (an `evaluate_function` op and every op nested in it on its thread) to
    the forward op it differentiates. `flows`: Kineto's `fwdbwd` flows, backward op id -> forward op
    id; where one is present it is the link. `parent`, `by_id`: `parents(ops)` and the ops by id, if already made."""
    by_id = {op.id: op for op in ops} if by_id is None else by_id
    parent = parents(ops) if parent is None else parent
    root_of = _roots(ops, by_id, parent)
    roots = sorted(set(root_of.values()), key=lambda r: (by_id[r].start_ns, r))
    members: dict[int, list[int]] = {}
    for op_id, r in root_of.items():
        members.setdefault(r, []).append(op_id)
    forward = _Forward(ops, root_of)
    flow_of: dict[int, int] = {}  # per root, the forward op one of its ops points to
    for b, f in dict(flows or {}).items():
        r = root_of.get(b)
        if r is not None and f in by_id and f not in root_of:
            flow_of.setdefault(r, f)
    keys = {r: _key_of(r, by_id, members) for r in roots}
    forward_thread = _forward_threads(roots, keys, flow_of, forward, by_id)
    forward_of: dict[int, int] = {}
    unlinked: dict[str, int] = {}
    reasons: dict[int, str] = {}
    for r in roots:
        seq, ftid = keys[r]
        fwd = flow_of.get(r)
        if fwd is None and seq >= 0 and ftid in forward_thread:
            fwd = forward.latest(forward_thread[ftid], seq, by_id[r].start_ns)
        if fwd is not None:
            for m in members[r]:
                forward_of[m] = fwd
            continue
        reason = reasons[r] = _reason(by_id[r], seq)
        unlinked[reason] = unlinked.get(reason, 0) + len(members[r])
    return Links(forward_of, unlinked, root_of, forward_thread, reasons)


def op_frame(name: str) -> Frame:
    """An operator as a tree frame (as core/kernels.py's Kernel.stack makes them)."""
    return (name, "", 0)


def backward_path(caller: Sequence[Frame], forward_stack: Sequence[Frame], forward_chain: Sequence[str],
                  backward_chain: Sequence[str]) -> tuple[Frame, ...]:
    """A backward op's tree path: the frames of the thread that called backward() at that moment,
    `[backward]`, the forward op's Python stack below the frames it shares with the caller (the loop
    that ran both: `train > step` is not repeated beneath `[backward]`) and its operator chain
    (outermost first, the forward op last; both empty when unlinked), then the backward ops holding
    the work (outermost first; the `evaluate_function:` wrapper named by its node, a repeat dropped)."""
    shared = 0
    for a, b in zip(caller, forward_stack):
        if a != b:
            break
        shared += 1
    names: list[str] = []
    for name in backward_chain:
        if name.startswith(EVALUATE_PREFIX):
            name = name[len(EVALUATE_PREFIX):]
        if not names or names[-1] != name:
            names.append(name)
    return (tuple(caller) + (BACKWARD_FRAME,) + tuple(forward_stack[shared:]) + tuple(op_frame(n) for n in forward_chain)
            + tuple(op_frame(n) for n in names))


if TYPE_CHECKING:
    FramesAt = Callable[[int, int], Sequence[Frame]]  # (thread, t_ns) -> the Python frames running there, outermost first


class Autograd:
    """One window's ops with their backward links: the tree path of the work under any op.

    `frames_at(thread, t_ns)`: the Python frames on a thread at an instant (the caller of
    backward() is blocked in it while autograd's thread works); without it, or where it finds
    none, a backward op on autograd's thread has no caller frames above `[backward]`.
    `caller_thread`: the thread taken to have called backward() where no link names one (a trace
    with one Python thread)."""

    def __init__(self, ops: Sequence[Op], flows: Mapping[int, int] | None = None,
                 frames_at: FramesAt | None = None, caller_thread: int | None = None) -> None:
        self.ops = {op.id: op for op in ops}
        self.parent = parents(ops)
        self.links = link_backward(ops, flows, self.parent, self.ops)
        self.frames_at = frames_at
        self.caller_thread = caller_thread
        self._paths: dict[int, tuple[Frame, ...]] = {}
        # a backward thread -> the forward thread its linked ops point to most: the caller of an op
        # that names no forward thread (AccumulateGrad, hooks) in that backward pass
        tally: dict[int, dict[int, int]] = {}
        for b, f in self.links.forward_of.items():
            per = tally.setdefault(self.ops[b].tid, {})
            per[self.ops[f].tid] = per.get(self.ops[f].tid, 0) + 1
        self._caller_thread = {t: max(per, key=lambda k: (per[k], -k)) for t, per in tally.items()}

    def chain(self, op_id: int, stop: int | None = None) -> tuple[str, ...]:
        """The names of the ops holding this one on its thread, outermost first, itself last
        (from `stop`, when given, inward)."""
        out = []
        cur: int | None = op_id
        while cur is not None:
            out.append(self.ops[cur].name)
            if cur == stop:
                break
            cur = self.parent.get(cur)
        return tuple(reversed(out))

    def caller(self, op_id: int) -> tuple[Frame, ...]:
        """The frames that called backward() while this backward op ran: its own stack when it ran
        on that thread (a CPU backward does), else the forward thread's frames at its start."""
        links = self.links
        root = self.ops[links.root_of.get(op_id, op_id)]
        if root.stack:
            return root.stack
        if self.frames_at is None:
            return ()
        thread = links.forward_thread.get(root.fwd_tid)
        fwd = links.forward_of.get(root.id)
        if thread is None and fwd is not None:
            thread = self.ops[fwd].tid
        if thread is None:
            thread = self._caller_thread.get(root.tid, self.caller_thread)
        if thread is None:
            return ()
        return tuple(self.frames_at(thread, root.start_ns))

    def path(self, op_id: int) -> tuple[Frame, ...]:
        """The tree path of work done under this op: a forward op's Python stack then its operator
        chain; a backward op's `backward_path`."""
        got = self._paths.get(op_id)
        if got is not None:
            return got
        op = self.ops[op_id]
        links = self.links
        if not links.is_backward(op_id):
            path = op.stack + tuple(op_frame(n) for n in self.chain(op_id))
        else:
            root = links.root_of[op_id]
            fwd = links.forward_of.get(op_id)
            fwd_stack: tuple[Frame, ...] = self.ops[fwd].stack if fwd is not None else ()
            fwd_chain = self.chain(fwd) if fwd is not None else ()
            path = backward_path(self.caller(op_id), fwd_stack, fwd_chain, self.chain(op_id, stop=root))
        self._paths[op_id] = path
        return path
