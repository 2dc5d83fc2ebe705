"""Training per layer: backward's CPU work on the modules that caused it, module frames named by their
path in the model. Real torch (the CPU build) for the capture and the link; known answers for the graft."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from energyprof.agent.kernels.autograd import BACKWARD_FRAME
from energyprof.agent.kernels.reduce import FASTEST_RUN
from energyprof.core.backward import BackwardFold, graft_backward
from energyprof.facts.profile import Node, Note, load

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:  # pragma: no cover - CI installs the torch extra
    HAVE_TORCH = False

needs_torch = [pytest.mark.torch, pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")]

ENGINE = ("_engine_run_backward", "/t/torch/autograd/graph.py", 966)
CALLER = (("<module>", "/p/train.py", 1), ("loop", "/p/train.py", 10), ("Tensor.backward", "/t/torch/_tensor.py", 566),
          ("backward", "/t/torch/autograd/__init__.py", 255), ENGINE)


def _tree(engine_j: float, forward_j: float) -> tuple[Node, Node]:
    root = Node(function="train.py")
    node = root
    for fn, file, line in CALLER:
        child = Node(function=fn, file=file, line=line, other_policy_self_energy_j={})
        node.children.append(child)
        node = child
    node.self_energy_j = {"cpu": engine_j}
    node.other_policy_self_energy_j = {"cpu": 2 * engine_j}
    node.self_time_s, node.self_samples = 0.5, 7
    loop = root.children[0].children[0]
    fwd = Node(function="one (One)", file="/p/train.py", line=30, self_energy_j={"cpu": forward_j})
    loop.children.append(fwd)
    return root, node


def _rows(root: Node, name: str) -> list[Node]:
    out, todo = [], [root]
    while todo:
        n = todo.pop()
        if n.function == name:
            out.append(n)
        todo.extend(n.children)
    return out


def test_the_engines_energy_goes_beneath_backward_in_the_measured_proportions_to_1e_9():
    """Known answer: 3 ms of backward ops on `one`, 9 ms on `two`, 1 ms of AccumulateGrad, under the same
    caller: the engine's 13 J (both policies, time, samples) go 3:9:1 beneath `[backward]`, to 1e-9, the
    module frame named as the sampler named it, and nothing is made or lost."""
    root, engine = _tree(13.0, 5.0)
    fold = BackwardFold()
    prof_caller = (("<module>", "train.py", 1), ("loop", "train.py", 10), ("backward", "torch/_tensor.py", 566),
                   ("backward", "torch/autograd/__init__.py", 255), ("_engine_run_backward", "torch/autograd/graph.py", 966))
    one = (("one (One)", "/p/train.py", 30), ("aten::linear", "", 0), ("AddmmBackward0", "", 0))
    two = (("two (Two)", "/p/train.py", 40), ("aten::linear", "", 0), ("AddmmBackward0", "", 0))
    acc = (("torch::autograd::AccumulateGrad", "", 0),)
    fold.add(prof_caller + (BACKWARD_FRAME,) + one, 2e6)
    fold.add(prof_caller + (BACKWARD_FRAME,) + one, 1e6)
    fold.add(prof_caller + (BACKWARD_FRAME,) + two, 9e6)
    fold.add(prof_caller + (BACKWARD_FRAME,) + acc, 1e6)
    (note,) = graft_backward(root, fold)
    root.fill_inclusive()
    (back,) = _rows(root, "[backward]")
    assert engine.self_energy_j["cpu"] == 0.0 and engine.other_policy_self_energy_j["cpu"] == 0.0
    got = {c.function: c for c in back.children}
    assert got["one (One)"].energy_j["cpu"] == pytest.approx(3.0, rel=1e-9)
    assert got["two (Two)"].energy_j["cpu"] == pytest.approx(9.0, rel=1e-9)
    assert got["torch::autograd::AccumulateGrad"].energy_j["cpu"] == pytest.approx(1.0, rel=1e-9)
    assert back.energy_j["cpu"] == pytest.approx(13.0, rel=1e-12)
    assert root.energy_j["cpu"] == pytest.approx(18.0, rel=1e-12)  # conserved
    other = sum(n.other_policy_self_energy_j.get("cpu", 0.0) for n in _rows(root, "AddmmBackward0"))
    assert other == pytest.approx(2 * 12.0, rel=1e-9)
    assert sum(n.self_samples for n in _rows(root, "AddmmBackward0")) + \
        got["torch::autograd::AccumulateGrad"].self_samples == 7
    # the module's forward row and its backward row are one frame (the function table sums them)
    (fwd, bwd) = sorted(_rows(root, "one (One)"), key=lambda n: n.energy_j["cpu"])
    assert (fwd.function, fwd.file, fwd.line) == (bwd.function, bwd.file, bwd.line)
    assert note.kind == "backward-split" and note.extra["method"] == "extrapolated"
    assert note.extra["captured_s"] == pytest.approx(0.013, rel=1e-9)
    assert note.extra["captured_share"] == pytest.approx(0.013 / 0.5, rel=1e-9)


def _ticked(shares: list[tuple[str, float]]) -> tuple[Node, Node, Node, Note]:
    """The engine's 10 J of samples outside the captured steps beside a captured sample (its own node
    `[backward] > [sample] 7`: 2 J, 3 J under the other policy) whose tick the capture found covered by
    backward ops of `one` and `two` in `shares` (one (module, share) per op); the ops measured 1 ms on `one`, 3 ms
    on `two`. Grafted: (root, engine, `[backward]`, the note)."""
    root, engine = _tree(10.0, 0.0)
    back = Node(function="[backward]", other_policy_self_energy_j={})
    back.children.append(Node(function="[sample]", line=7, self_energy_j={"cpu": 2.0},
                              other_policy_self_energy_j={"cpu": 3.0}, self_samples=1))
    engine.children.append(back)
    caller = (("<module>", "train.py", 1), ("loop", "train.py", 10), BACKWARD_FRAME)
    paths = {"one": caller + (("one (One)", "/p/train.py", 30),), "two": caller + (("two (Two)", "/p/train.py", 40),)}
    fold = BackwardFold()
    fold.add(paths["one"], 1e6)
    fold.add(paths["two"], 3e6)
    for name, share in shares:
        fold.sample(7, paths[name], share)
    (note,) = graft_backward(root, fold)
    root.fill_inclusive()
    return root, engine, back, note


def test_a_captured_sample_goes_to_the_ops_over_its_tick_by_their_time_and_the_rest_is_extrapolated():
    """Known answer: the sample's tick is half covered by `two`'s backward ops and a quarter by `one`'s. The
    sample gives 1 J to `two` and 0.5 J to `one`; its uncovered quarter (0.5 J) joins the engine's 10 J, split
    1:3 by measured op time; nothing is made or lost."""
    root, engine, back, note = _ticked([("two", 0.3), ("two", 0.2), ("one", 0.25)])  # two ops on `two`: they add
    assert [c.function for c in back.children] == ["one (One)", "two (Two)"]  # the sample's node is gone
    got = {c.function: c for c in back.children}
    assert got["two (Two)"].energy_j["cpu"] == pytest.approx(1.0 + 0.75 * 10.5, rel=1e-9)
    assert got["one (One)"].energy_j["cpu"] == pytest.approx(0.5 + 0.25 * 10.5, rel=1e-9)
    assert got["two (Two)"].other_policy_self_energy_j["cpu"] == pytest.approx(1.5 + 0.75 * 20.75, rel=1e-9)
    assert root.energy_j["cpu"] == pytest.approx(12.0, rel=1e-12)
    assert engine.self_energy_j["cpu"] == 0.0
    assert note.extra["placed_share"] == pytest.approx(1.5 / 12.0, rel=1e-9)


def test_a_tick_covered_by_two_threads_ops_gives_its_sample_whole_and_no_more():
    """Ops of two threads over one tick may cover more than the tick (0.9 + 0.6): the sample's 2 J go 0.9:0.6 to
    them, all of it and no more, none back to the engine; the engine's 10 J split 1:3 as before."""
    root, _, back, note = _ticked([("two", 0.9), ("one", 0.6)])
    got = {c.function: c for c in back.children}
    assert got["two (Two)"].energy_j["cpu"] == pytest.approx(2.0 * 0.6 + 7.5, rel=1e-9)
    assert got["one (One)"].energy_j["cpu"] == pytest.approx(2.0 * 0.4 + 2.5, rel=1e-9)
    assert root.energy_j["cpu"] == pytest.approx(12.0, rel=1e-12)
    assert note.extra["placed_share"] == pytest.approx(2.0 / 12.0, rel=1e-9)


def test_each_caller_gets_its_own_proportions():
    """Two backward() lines: each engine node is split by the ops its own caller's passes ran."""
    root, engine = _tree(4.0, 0.0)
    loop = root.children[0].children[0]
    other_caller = [("other", "/p/train.py", 50), ("Tensor.backward", "/t/torch/_tensor.py", 566),
                    ("backward", "/t/torch/autograd/__init__.py", 255), ENGINE]
    node = loop
    for fn, file, line in other_caller:
        child = Node(function=fn, file=file, line=line, other_policy_self_energy_j={})
        node.children.append(child)
        node = child
    node.self_energy_j = {"cpu": 6.0}
    fold = BackwardFold()
    a = (("<module>", "train.py", 1), ("loop", "train.py", 10), ("backward", "torch/_tensor.py", 566), BACKWARD_FRAME)
    b = (("<module>", "train.py", 1), ("loop", "train.py", 10), ("other", "train.py", 50),
         ("backward", "torch/_tensor.py", 566), BACKWARD_FRAME)
    fold.add(a + (("enc (Enc)", "/p/train.py", 60),), 1.0)
    fold.add(b + (("dec (Dec)", "/p/train.py", 70),), 1.0)
    graft_backward(root, fold)
    root.fill_inclusive()
    assert [n.energy_j["cpu"] for n in _rows(root, "enc (Enc)")] == [pytest.approx(4.0, rel=1e-12)]
    assert [n.energy_j["cpu"] for n in _rows(root, "dec (Dec)")] == [pytest.approx(6.0, rel=1e-12)]


def test_a_models_forward_is_shared_among_its_modules_by_the_measured_op_time_to_1e_9():
    """Known answer: the self figures of a model's module frames (2 J on the root, 6 J on `a`, 2 J on `b`)
    are pooled and shared 1:3 as the captured forward ops' time on `a` and `b` says (10 J -> 2.5 J and
    7.5 J); a Python frame that is not a module's keeps its 5 J; energy is moved, never made; the note
    says extrapolated."""
    from energyprof.agent.kernels.reduce import FORWARD_OPS
    from energyprof.core.backward import graft_forward

    root = Node(function="train.py")
    loop = Node(function="loop", file="/p/train.py", line=10)
    net = Node(function="Net (root)", file="/p/train.py", line=40, self_energy_j={"cpu": 2.0}, self_samples=2)
    a = Node(function="a (A)", file="/p/train.py", line=20, self_energy_j={"cpu": 6.0}, self_samples=6)
    b = Node(function="b (B)", file="/p/train.py", line=30, self_energy_j={"cpu": 2.0}, self_samples=2)
    helper = Node(function="helper", file="/p/train.py", line=50, self_energy_j={"cpu": 5.0}, self_samples=5)
    root.children.append(loop)
    loop.children.append(net)
    net.children.extend([a, b, helper])
    frames = {n.function: (n.function, n.file, n.line) for n in (loop, net, a, b)}
    fold = BackwardFold()
    base = (("<module>", "/p/train.py", 1), frames["loop"], frames["Net (root)"])
    fold.add(base + (frames["a (A)"], FORWARD_OPS), 1e6)
    fold.add(base + (frames["b (B)"], FORWARD_OPS), 3e6)
    fold.runs(base + (frames["b (B)"], FORWARD_OPS), {FASTEST_RUN: [3, 0.5e6]})  # fastest over cycles: 3 x 0.5 ms
    (note,) = graft_forward(root, fold)
    root.fill_inclusive()
    assert note.kind == "forward-split" and note.extra["method"] == "extrapolated"
    assert a.self_energy_j["cpu"] == pytest.approx(10.0 * 1 / 2.5, rel=1e-9)  # 1 ms against 1.5 ms
    assert b.self_energy_j["cpu"] == pytest.approx(10.0 * 1.5 / 2.5, rel=1e-9)
    assert net.self_energy_j["cpu"] == 0.0 and helper.self_energy_j["cpu"] == 5.0
    assert root.energy_j["cpu"] == pytest.approx(15.0, rel=1e-12)
    assert a.self_samples + b.self_samples == 10


BRANCHES = """
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
W = 192


class One(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Sequential(*[nn.Linear(W, W) for _ in range(1)])

    def forward(self, x):
        return self.l(x)


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Sequential(*[nn.Linear(W, W) for _ in range(2)])

    def forward(self, x):
        return self.l(x)


class Four(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Sequential(*[nn.Linear(W, W) for _ in range(4)])

    def forward(self, x):
        return self.l(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.one, self.two, self.four = One(), Two(), Four()

    def forward(self, x):
        # four first: with one first, one's ops ran about 15% slower than its share (measured op times,
        # in process: 1:1.7:3.3 forward and backward), whichever branch follows the optimizer's step paying more
        return self.four(x).sum() + self.two(x).sum() + self.one(x).sum()


def loop(model, opt, x, steps):
    for _ in range(steps):
        opt.zero_grad()
        loss = model(x)
        loss.backward()
        opt.step()
    return loss


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=1e-9)
# a batch of 1024: the optimizer's and zero_grad's work (per parameter) small beside the modules' (per row)
loss = loop(model, opt, torch.randn(1024, W, requires_grad=True), STEPS)
print("trained", loss.detach().isfinite().item())
"""


def _energy(node: Node) -> float:
    return sum(node.energy_j.values())


def _run(tmp_path: Path, source: str, *args: str, dev: bool = False
         ) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess, Node]:
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    (tmp_path / "prog.py").write_text(textwrap.dedent(source))
    env = {"OMP_NUM_THREADS": "1"}
    if dev:  # a fake NVIDIA device node: --gpu-kernels is allowed on this CPU machine
        (tmp_path / "dev").mkdir()
        (tmp_path / "dev" / "nvidiactl").write_text("")
        env["ENERGYPROF_DEV_ROOT"] = str(tmp_path)
    import os

    full = {**os.environ, **env}
    plain = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True, text=True, env=full, timeout=300)
    prof = subprocess.run([sys.executable, "-m", "energyprof", "-q", "--power-trace", "trace.csv", "--json", "p.json",
                           "-o", "r.html", *args, "prog.py"], cwd=tmp_path, capture_output=True, text=True, env=full,
                          timeout=300)
    assert prof.returncode == 0, prof.stderr
    return plain, prof, load(tmp_path / "p.json").root


@pytest.mark.parametrize("_", [0], ids=["three-branches"])
@pytest.mark.torch
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_three_branches_hold_their_work_forward_and_backward(tmp_path, _):
    """Three branch modules of 1:2:4 work, SGD, one thread, flat replayed power, default options: each
    module has a forward row and a row beneath `[backward]` (one frame); forward and backward together
    they are 1:2:4 within 25%; the modules hold at least 80% of the loop's energy; <= 10% stays as self
    energy on autograd's engine frames; the output is plain python's."""
    plain, prof, root = _run(tmp_path, BRANCHES.replace("STEPS", "100"))
    assert prof.stdout == plain.stdout == "trained True\n" and prof.stderr == plain.stderr
    (loop,) = _rows(root, "loop")
    rows = {name: sum(_energy(n) for n in _rows(loop, f"{name} ({name.title()})")) for name in ("one", "two", "four")}
    assert all(len(_rows(loop, f"{n} ({n.title()})")) == 2 for n in rows), "a forward row and a backward row each"
    # Why 25% holds on a loaded machine: the modules' shares are not sampled. Forward and backward are each
    # shared among the modules in the proportions of their ops' measured time (the fastest of >= 6 runs
    # per path); sampling only sets the two pools' sizes, alike for every module. The few captured ticks
    # inside backward (~4% of backward) go to the ops over each tick by their time in it, not whole to one
    # op. Measured on a 2-core machine: 1:2.07-2.18:3.75-4.02 at load 8-9, modules 90-95%.
    assert 1.5 <= rows["two"] / rows["one"] <= 2.5 and 3.0 <= rows["four"] / rows["one"] <= 5.0, rows
    nets = _rows(loop, "Net (root)")
    assert sum(_energy(n) for n in nets) >= 0.8 * _energy(loop)
    engine_self = sum(sum(n.self_energy_j.values()) for name in ("Tensor.backward", "backward", "_engine_run_backward")
                      for n in _rows(loop, name))
    assert engine_self <= 0.10 * _energy(loop)
    (back,) = _rows(loop, "[backward]")
    assert _energy(back) > 0.2 * _energy(loop)
    kinds = {n.kind: n for n in load(tmp_path / "p.json").notes}
    assert kinds["backward-split"].extra["method"] == kinds["forward-split"].extra["method"] == "extrapolated"


def _learned_root(**parts: object) -> object:
    """An autoencoder-shaped root (class `AE`) whose modules `parts` are learnt by path, as the agent learns a
    model's root; kept alive by the caller (the agent holds it weakly)."""
    from energyprof.agent import modules

    class AE:
        def named_modules(self, remove_duplicate=False):
            return [("", self), *parts.items()]

    ae = AE()
    modules.learn_root(ae)
    return ae


def _ae_step(st, base: float):
    """A synthetic training step's outer frames from `base` ms: the loop's function, the autoencoder's mark
    (`nn.Module: AE_0`) and its forward; (the loop's event, the forward's) for the step's own events."""
    top = st.py("train.py(10): train", base, base + 40)
    root = st.py("nn.Module: AE_0", base + 1, base + 10, parent=top)
    return top, st.py("train.py(20): forward", base + 1, base + 10, parent=root)


def _walk(node: Node, under: bool = False):
    yield node, under
    for c in node.children:
        yield from _walk(c, under or node.function == BACKWARD_FRAME[0])


def _module_rows(root: Node, name: str) -> tuple[float, float]:
    """(forward joules, backward joules) of the frames named `name` (a module's), outermost rows only."""
    fwd = bwd = 0.0
    for node, under in _walk(root):
        if node.function == name:
            if under:
                bwd += _energy(node)
            else:
                fwd += _energy(node)
    return fwd, bwd


GPT2 = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
torch.set_num_threads(1)
config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
ids = torch.randint(0, 256, (8, 64))


def train(steps):
    for _ in range(steps):
        opt.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
    return loss


print("trained", train(30).detach().isfinite().item())
"""


@pytest.mark.torch
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_gpt2s_two_blocks_are_two_named_nodes_each_with_forward_and_backward(tmp_path):
    """GPT-2 from its config (2 layers, no weights) trained on the CPU: `transformer.h.0` and
    `transformer.h.1` are two frames (not one merged GPT2Block.forward), each with forward and backward
    joules; no torch module-call wrapper is left in the tree; the output is plain python's."""
    pytest.importorskip("transformers")
    plain, prof, root = _run(tmp_path, GPT2)
    assert prof.stdout == plain.stdout == "trained True\n" and prof.stderr == plain.stderr
    for block in ("transformer.h.0 (GPT2Block)", "transformer.h.1 (GPT2Block)"):
        fwd, bwd = _module_rows(root, block)
        assert fwd > 0 and bwd > 0, (block, fwd, bwd)
    names = {n.function for n, _ in _walk(root)}
    assert "GPT2LMHeadModel (root)" in names
    assert not names & {"Module._wrapped_call_impl", "Module._call_impl", "GPT2Block.forward"}


BALER = """
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
W = 160


def mlp(layers):
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(W, W), nn.Tanh())])


class AE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = mlp(6), mlp(2)

    def forward(self, x):
        return self.decoder(self.encoder(x))


def fit(model, x, steps):
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x) - x) ** 2).mean()
        loss.backward()
        opt.step()
    return loss


print("fitted", fit(AE(), torch.randn(256, W), 100).detach().isfinite().item())
"""


@pytest.mark.torch
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_a_baler_shaped_autoencoder_shows_encode_against_decode_each_with_its_backward(tmp_path):
    """Encoder of 3x the decoder's work, Adam: each has forward and backward joules, and the encoder's
    whole (backward included) is 3x the decoder's within 25%; its backward alone is its share of the matrix
    products (11:4) within 25%."""
    plain, prof, root = _run(tmp_path, BALER)
    assert prof.stdout == plain.stdout == "fitted True\n" and prof.stderr == plain.stderr
    enc, dec = _module_rows(root, "encoder (Sequential)"), _module_rows(root, "decoder (Sequential)")
    assert min(enc + dec) > 0, (enc, dec)
    # forward and backward are each shared by measured op time (see the three branches' test for the
    # margin). Beside two CPU hogs, 6 runs: the whole 2.70-2.91x, backward alone 2.46-2.81x.
    assert 2.25 <= sum(enc) / sum(dec) <= 3.75, (enc, dec)
    # Backward alone is 2.75x, not 3x: the encoder's first layer computes no input gradient (x needs none),
    # so the encoder's backward does 11 matrix products to the decoder's 4 (each Linear two, that one one).
    assert 0.75 * 11 / 4 <= enc[1] / dec[1] <= 1.25 * 11 / 4, (enc, dec)


OWN_PROFILER = """
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(32, 64)


def step():
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()


for _ in range(8):
    step()
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=2, repeat=2)) as prof:
    for _ in range(6):
        step()
        prof.step()
names = {e.key for e in prof.key_averages()}
mm = "mm" if "aten::mm" in names or "aten::addmm" in names else "none"
print(mm, "backward" if any("Backward" in n for n in names) else "")
for _ in range(8):
    step()
print("done")
"""


@pytest.mark.parametrize("args", [(), ("--gpu-kernels", "--gpu-kernel-steps", "3:2")], ids=["default", "asked"])
@pytest.mark.torch
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_the_programs_own_profiler_in_a_training_loop_keeps_its_events_and_warnings(tmp_path, args):
    """A training loop whose program runs torch.profiler itself (a schedule without warm-up, two cycles:
    torch warns about both, once each) beside the capture, on by default or asked for: the program's
    profiler sees its ops and its backward, and stdout and stderr, warnings included, are byte for byte
    plain python's (the capture's own cycles once used up torch's once-only warning, and a filter hid it)."""
    import re

    plain, prof, _root = _run(tmp_path, OWN_PROFILER, *args, dev=bool(args))
    assert plain.stdout == "mm backward\ndone\n"
    assert "warmup" in plain.stderr and "clears events" in plain.stderr

    def stamped(text: str) -> str:  # Kineto's own lines carry the time and the process id: those differ
        return re.sub(r"(?m)^(\w+):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ ", r"\1:<when> <pid> ", text)

    assert prof.stdout == plain.stdout and stamped(prof.stderr) == stamped(plain.stderr)
    assert stamped(plain.stderr) != plain.stderr  # the program's own profiler's lines are there


COMPILED = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
fast = torch.compile(model, backend="aot_eager")
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(32, 64)
for _ in range(12):
    opt.zero_grad()
    fast(x).sum().backward()
    opt.step()
print("done")
"""


@pytest.mark.torch
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_a_compiled_model_trains_under_the_capture_as_under_plain_python(tmp_path):
    """torch.compile (the aot_eager backend: no C++ compiler needed) under the capture on by default: the
    program's output is plain python's and the capture reduced its cycle without failing. (Its backward
    runs the compiled graph's Python, sampled as such below autograd's engine: little or none of it is
    the engine's own, so `[backward]` may hold nothing.)"""
    from energyprof.facts.profile import load

    plain, prof, _root = _run(tmp_path, COMPILED)
    if plain.returncode != 0:
        pytest.skip(f"torch.compile does not run here: {plain.stderr.strip().splitlines()[-1:]}")
    assert prof.stdout == plain.stdout == "done\n" and prof.stderr == plain.stderr
    notes = load(tmp_path / "p.json").notes
    assert not [n for n in notes if "capture stopped" in n.message or "could not be reduced" in n.message], notes
    assert [n for n in notes if n.kind == "backward-split"]  # a captured step's backward ops were reduced


def test_the_reduction_links_backward_op_time_to_the_module_that_made_it_to_1e_9():
    """Synthetic events (the fields torch 2.13's `_KinetoEvent` gives), known answers: a forward through the
    module marks `nn.Module: Enc_0` and `nn.Module: Dec_0` (the module ids the event tree gives), two
    steps; backward ops with the forward ops' sequence numbers on the same thread. Each path below
    `[backward]` gets its outermost backward ops' fastest run times their number, named by the module's
    path; AccumulateGrad keeps its own name. The ops a module's forward called itself are timed on that
    module's stack (+ `[forward ops]`), the same way."""
    from energyprof.agent.kernels.reduce import BACKWARD_DEVICE, FASTEST_RUN, FORWARD_OPS, SAMPLE_DEVICE, reduce_events
    from kineto_events import MS, Step

    class Enc:
        pass

    class Dec:
        pass

    enc, dec = Enc(), Dec()
    ae = _learned_root(encoder=enc, decoder=dec)
    off = 1_700_000_000_000_000_000
    st = Step(off)
    for k, base in enumerate((0.0, 50.0)):
        top, fwd = _ae_step(st, base)
        em = st.py("nn.Module: Enc_0", base + 2, base + 5, parent=fwd)
        call = st.py("torch/nn/modules/module.py(1782): _call_impl", base + 2, base + 5, parent=em)
        st.py("train.py(30): forward", base + 2, base + 5, parent=call)
        dm = st.py("nn.Module: Dec_0", base + 6, base + 9, parent=fwd)
        st.py("train.py(40): forward", base + 6, base + 9, parent=dm)
        s0 = 10 * k
        st.op("aten::mm", base + 3, base + 4, seq=s0 + 1)
        st.op("aten::mm", base + 7, base + 8, seq=s0 + 2)
        b = st.py("torch/_tensor.py(566): backward", base + 11, base + 30, parent=top)
        # backward: Dec's op first (3 ms, then 2 ms in the second step), Enc's (5 ms, then 6 ms)
        d_ms, e_ms = (3.0, 5.0) if k == 0 else (2.0, 6.0)
        st.op("autograd::engine::evaluate_function: MmBackward0", base + 12, base + 12 + d_ms, seq=s0 + 2, fwd=1)
        st.op("autograd::engine::evaluate_function: MmBackward0", base + 16, base + 16 + e_ms, seq=s0 + 1, fwd=1)
        st.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", base + 23, base + 24)
        del b
    marks = {"nn.Module: AE_0": (id(ae), "AE"), "nn.Module: Enc_0": (id(enc), "Enc"), "nn.Module: Dec_0": (id(dec), "Dec")}
    # samples inside backward(), each over its tick: 11-14 ms (Dec's op from 12 ms: 2/3 of it), 66-70 ms (all in
    # Enc's op of the second step), 14-17 ms (1 ms of Dec's op, 1 ms of Enc's from 16 ms) and 24.5-25 ms (no
    # backward op then: nothing placed)
    spans = [(0, 11 * MS, 14 * MS), (1, 66 * MS, 70 * MS), (2, 14 * MS, 17 * MS), (3, int(24.5 * MS), 25 * MS)]
    cyc = reduce_events(st.events, unix_minus_perf=off, t0=0, t1=100 * MS, modules=marks, backward=True,
                        samples=spans)
    placed: dict[int, dict[str, float]] = {}
    for (path, dev), fig in cyc.figures.items():
        if dev <= SAMPLE_DEVICE:
            module = next(f[0] for f in path if f[0].endswith(("(Enc)", "(Dec)")))
            placed.setdefault(SAMPLE_DEVICE - dev, {})[module] = fig.busy[0]
    assert placed == {0: {"decoder (Dec)": pytest.approx(2 / 3, rel=1e-9)},
                      1: {"encoder (Enc)": pytest.approx(1.0, rel=1e-9)},
                      2: {"decoder (Dec)": pytest.approx(1 / 3, rel=1e-9), "encoder (Enc)": pytest.approx(1 / 3, rel=1e-9)}}
    got: dict[str, float] = {}
    forward: dict[str, float] = {}
    for (path, dev), fig in cyc.figures.items():
        if dev <= SAMPLE_DEVICE:
            continue
        assert dev == BACKWARD_DEVICE
        names = [f[0] for f in path]
        if path[-1] == FORWARD_OPS:  # the ops a module's forward called itself: the forward's proportions
            forward[names[-2]] = forward.get(names[-2], 0.0) + sum(fig.busy.values())
            continue
        if "encoder (Enc)" in names:
            assert fig.names[FASTEST_RUN] == [2, pytest.approx(5.0 * MS, rel=1e-9)]  # runs, fastest: folded over cycles
        i = names.index("[backward]")
        below = names[i + 1:]
        key = next((n for n in below if n.endswith("(Enc)") or n.endswith("(Dec)")), below[0])
        got[key] = got.get(key, 0.0) + sum(fig.busy.values())
        if "encoder (Enc)" in below:
            assert below[:2] == ["AE (root)", "encoder (Enc)"]  # the wrapper between mark and forward is gone
    assert got["encoder (Enc)"] == pytest.approx(2 * 5.0 * MS, rel=1e-9)  # fastest of 5 and 6 ms, twice
    assert got["decoder (Dec)"] == pytest.approx(2 * 2.0 * MS, rel=1e-9)  # fastest of 3 and 2 ms, twice
    assert got["torch::autograd::AccumulateGrad"] == pytest.approx(2 * 1.0 * MS, rel=1e-9)
    assert set(got) == {"encoder (Enc)", "decoder (Dec)", "torch::autograd::AccumulateGrad"}
    # forward: each module's mm (1 ms, two steps) on the module that called it, the wrapper gone
    assert forward == {"encoder (Enc)": pytest.approx(2 * MS, rel=1e-9), "decoder (Dec)": pytest.approx(2 * MS, rel=1e-9)}


def test_a_backward_ops_fastest_run_is_taken_op_by_op_within_it_to_1e_9():
    """Synthetic events, known answers: the decoder's backward op (6 ms in both steps) holds two inner ops;
    in the first step the OS held the first one off the CPU (4 ms for 1), in the second the second one.
    Its fastest run is each inner op's fastest (1 ms, 1 ms) plus its own time (1 ms): 3 ms, not the 6 ms
    of the fastest whole run. A run of another shape (a third inner op) is its own candidate."""
    from energyprof.agent.kernels.reduce import BACKWARD_DEVICE, FASTEST_RUN, FORWARD_OPS, fastest_by_op, reduce_events
    from kineto_events import MS, Step

    class Dec:
        pass

    dec = Dec()
    ae = _learned_root(decoder=dec)
    off = 1_700_000_000_000_000_000
    st = Step(off)
    for k, base in enumerate((0.0, 50.0)):
        top, fwd = _ae_step(st, base)
        dm = st.py("nn.Module: Dec_0", base + 6, base + 9, parent=fwd)
        st.py("train.py(40): forward", base + 6, base + 9, parent=dm)
        st.op("aten::mm", base + 7, base + 8, seq=10 * k + 2)
        st.py("torch/_tensor.py(566): backward", base + 11, base + 30, parent=top)
        first, second = (4.0, 1.0) if k == 0 else (1.0, 4.0)
        st.op("autograd::engine::evaluate_function: MmBackward0", base + 12, base + 18, seq=10 * k + 2, fwd=1)
        st.op("aten::mm", base + 12.5, base + 12.5 + first)
        st.op("aten::mm", base + 13 + first, base + 13 + first + second)
    marks = {"nn.Module: AE_0": (id(ae), "AE"), "nn.Module: Dec_0": (id(dec), "Dec")}
    cyc = reduce_events(st.events, unix_minus_perf=off, t0=0, t1=100 * MS, modules=marks, backward=True)
    (fig,) = [f for (path, dev), f in cyc.figures.items()
              if dev == BACKWARD_DEVICE and path[-1] != FORWARD_OPS and "decoder (Dec)" in [p[0] for p in path]]
    assert fig.names[FASTEST_RUN] == [2, pytest.approx(3.0 * MS, rel=1e-9)]
    assert sum(fig.busy.values()) == pytest.approx(2 * 3.0 * MS, rel=1e-9)
    # shapes apart: the first shape's ops 1+1+1, the second's 5 alone; never above the fastest whole run
    a, b = ("0:x", "1:y", "1:z"), ("0:x", "1:y", "1:z", "1:w")
    assert fastest_by_op([a, a, b], [[1, 4, 1], [1, 1, 4], [2, 1, 1, 1]]) == 3
    assert fastest_by_op([b, a], [[1, 1, 1, 1], [3, 3, 3]]) == 4
