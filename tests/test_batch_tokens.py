"""Tokens in a batch: each batched step's energy split among its requests by their tokens, prefill and
decode apart (`energyprof.batch`), and Hugging Face `generate` recognised without code."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import energyprof
from conftest import run_cli
from energyprof.analysis.tokens import split_step, steps, token_run
from energyprof.batches import step_facts
from energyprof.core.ledger import Ledger
from energyprof.core.recording import Tick
from energyprof.core.tree import build_profile
from energyprof.facts.profile import load
from energyprof.render.unit_tables import tokens_lines, tokens_section

CPU = {"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}
WATTS = 30.0
MS = 1_000_000
INTERVAL_S = 0.01  # the sensor's interval: a tick every 10 ms
SHARE = 1 / 3  # every 10 ms the program burns 5 ms of CPU and the machine 15 ms: its share of the busy CPU


class ScriptedProfiler:
    """A ledger behind the window calls `energyprof.batch` makes, on a clock the test moves."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger, self.t = ledger, 0

    def begin_window(self, name: str) -> None:
        self.ledger.begin_window(self.t, name)

    def end_window(self, name: str, facts: dict[str, float]) -> None:
        self.ledger.end_window(self.t, name, facts=facts)


# A continuous-batching loop: (phase, {request: tokens}, duration in ms). B leaves after its second decode,
# C arrives with its own prefill while A and B decode, D arrives late and A leaves before it.
LOOP = [
    ("prefill", {"A": 5, "B": 3}, 120),
    ("decode", {"A": 1, "B": 1}, 40),
    ("prefill", {"C": 8}, 90),
    ("decode", {"A": 1, "B": 1, "C": 1}, 50),
    ("decode", {"A": 1, "C": 1}, 30),
    ("prefill", {"D": 2}, 60),
    ("decode", {"C": 1, "D": 1}, 70),
    ("decode", {"D": 1}, 20),
]


def scripted_run():
    led = Ledger([CPU], cpus=2)
    end_ms = sum(d for *_, d in LOOP) + 20
    ticks = [Tick(k * 10 * MS, (WATTS * k * 0.01,), k * 5 * MS, 0, k * 15 * MS) for k in range(end_ms // 10 + 2)]
    led.add_tick(ticks[0])
    prof = ScriptedProfiler(led)
    prof.t = 7 * MS  # steps start between two sensor readings
    for phase, tokens, ms in LOOP:
        with energyprof.batch(requests=list(tokens), tokens=list(tokens.values()), phase=phase, profiler=prof):
            prof.t += ms * MS
    for tick in ticks[1:]:
        led.add_tick(tick)
    led.finish()
    return build_profile(led, "share", {"target": "serve.py", "sensor_interval_s": INTERVAL_S})


def expected() -> dict[str, dict[str, float]]:
    """By hand: a step of d ms holds the program's WATTS x d x SHARE, shared by its own tokens."""
    out: dict[str, dict[str, float]] = {}
    for phase, tokens, ms in LOOP:
        energy = WATTS * ms / 1000 * SHARE
        for request, n in tokens.items():
            row = out.setdefault(request, {"prefill": 0.0, "decode": 0.0, "decode_tokens": 0.0})
            row[phase] += energy * n / sum(tokens.values())
            if phase == "decode":
                row["decode_tokens"] += n
    return out


def test_each_request_gets_its_tokens_share_of_each_step_prefill_and_decode_apart() -> None:
    run = token_run(scripted_run().windows)
    assert run is not None and run.steps == len(LOOP)
    want = expected()
    got = {r.request: r for r in run.requests}
    assert sorted(got) == ["A", "B", "C", "D"]
    for request, e in want.items():
        assert got[request].prefill_j == pytest.approx(e["prefill"], abs=1e-9, rel=0)
        assert got[request].decode_j == pytest.approx(e["decode"], abs=1e-9, rel=0)
        assert got[request].output_tokens == 1 + e["decode_tokens"]
        assert got[request].j_per_output_token == pytest.approx((e["prefill"] + e["decode"]) / (1 + e["decode_tokens"]),
                                                                abs=1e-9)
    # A: 5/8 of the first prefill, half of the first decode, a third of the next, half of the one after
    assert want["A"]["prefill"] == pytest.approx(WATTS * 0.120 * SHARE * 5 / 8)
    # the run: all the steps' energy, against the ML.ENERGY method's steady-state figure x output tokens
    decode_j = sum(WATTS * ms / 1000 * SHARE for phase, _, ms in LOOP if phase == "decode")
    decode_tokens = sum(sum(t.values()) for phase, t, _ in LOOP if phase == "decode")
    total_j = sum(WATTS * ms / 1000 * SHARE for *_, ms in LOOP)
    assert run.energy_j == pytest.approx(total_j, abs=1e-9)
    assert run.steady_j_per_token == pytest.approx(decode_j / decode_tokens, abs=1e-9)
    assert run.j_per_token == pytest.approx(total_j / (4 + decode_tokens), abs=1e-9)
    for r in run.requests:
        assert r.mlenergy_j == pytest.approx(decode_j / decode_tokens * r.output_tokens, abs=1e-9)
    assert run.mlenergy_j == pytest.approx(decode_j / decode_tokens * (4 + decode_tokens), abs=1e-9)


def test_the_tokens_table_in_the_summary_and_on_the_page() -> None:
    from energyprof.analysis.report import build

    profile = scripted_run()
    # each step is a row of the tokens table, not of the Windows table, which it would flood
    model = build(profile)
    assert len(profile.windows) == len(LOOP) and not model.windows and not model.window_groups
    lines = tokens_lines(profile)
    assert lines[0].startswith(f"  batched steps: {len(LOOP)}, 4 requests, ")
    assert any(line.endswith("  C") for line in lines[1:])
    page = tokens_section(profile)
    assert '<section id="tokens"' in page and "ML.ENERGY" in page


def test_each_step_has_the_edge_bar_of_a_test_and_says_measured_or_estimated() -> None:
    """A step's bar is the program's energy of the sensor interval each edge cuts (10 W x 10 ms at both);
    a request's, its token share of its steps' bars. The label follows the sources' method."""
    from energyprof.analysis.tokens import profile_tokens
    from energyprof.record import replace

    profile = scripted_run()
    run = profile_tokens(profile)
    step_bar = 2 * WATTS * SHARE * INTERVAL_S
    assert run.error_j == pytest.approx(len(LOOP) * step_bar, rel=1e-9)
    for r in run.requests:
        share = sum(t[r.request] / sum(t.values()) for _, t, _ in LOOP if r.request in t)
        assert r.error_j == pytest.approx(step_bar * share, rel=1e-9)
    assert not run.estimated and "\u00b1" in tokens_lines(profile)[0] and " measured;" in tokens_lines(profile)[0]
    profile.sources = [replace(s, method="estimated") for s in profile.sources]
    assert " estimated;" in tokens_lines(profile)[0] and "measured" not in tokens_lines(profile)[0]
    assert "<td>estimated</td>" in tokens_section(profile) and "measured" not in tokens_section(profile)


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1e6), st.dictionaries(st.text(min_size=1, max_size=5), st.integers(0, 10_000), min_size=1))
def test_a_step_is_shared_out_whole(energy: float, tokens: dict[str, int]) -> None:
    shares = split_step(energy, {k: float(v) for k, v in tokens.items()})
    assert set(shares) == set(tokens)
    assert sum(shares.values()) == pytest.approx(energy, rel=1e-9, abs=1e-9)
    assert all(v >= 0 for v in shares.values())


def test_bad_steps_are_one_clear_error_and_no_profile_leaves_the_block_alone() -> None:
    with pytest.raises(ValueError, match="phase must be one of prefill, decode"):
        step_facts(["a"], [1], "generate")
    with pytest.raises(ValueError, match="2 requests but 1 token counts"):
        step_facts(["a", "b"], [1], "decode")
    with pytest.raises(ValueError, match="adds -1 tokens"):
        step_facts(["a"], [-1], "decode")
    assert step_facts(["a;b=c", "a;b=c"], [2, 3], "decode") == {"req:a_b_c": 5.0}
    ran = []
    with energyprof.batch(requests=["a"], tokens=[3], phase="prefill"):
        ran.append(1)
    assert ran == [1]


GENERATE = """
import json
import sys

import torch
import transformers

torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                 bos_token_id=98, eos_token_id=99, pad_token_id=0)
model = transformers.GPT2LMHeadModel(config).eval()
# three prompts of 3, 4 and 5 tokens, left-padded to 5
ids = torch.tensor([[0, 0, 5, 6, 7], [0, 8, 9, 10, 11], [12, 13, 14, 15, 16]])
mask = (torch.arange(5)[None, :] >= torch.tensor([2, 1, 0])[:, None]).long()
with torch.no_grad():
    first = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    new = first[:, 5:].tolist()
    # the token row 0 emits second ends its sequence on the second call: that row leaves the batch early
    eos = new[0][1]
    second = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                            eos_token_id=eos)
json.dump({"new": new, "eos": eos, "second": second[:, 5:].tolist()}, open(sys.argv[1], "w"))
"""


@pytest.mark.torch
def test_hugging_face_generate_is_split_per_row_without_code(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    (tmp_path / "gen.py").write_text(textwrap.dedent(GENERATE))
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,40\n")
    proc = run_cli(["-q", "--power-trace", "trace.csv", "--json", "p.json", "-o", "r.html", "gen.py", "out.json"],
                   cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plain = subprocess.run([sys.executable, "gen.py", "plain.json"], cwd=tmp_path, capture_output=True, timeout=600)
    assert plain.returncode == 0, plain.stderr[-3000:]
    # the program's own output, unchanged: the tokens it generated and what it printed, byte for byte
    assert (tmp_path / "out.json").read_bytes() == (tmp_path / "plain.json").read_bytes()
    assert proc.stdout == plain.stdout.decode()
    out = json.loads((tmp_path / "out.json").read_text())
    eos = out["eos"]

    def produced(row: list[int]) -> int:  # new tokens up to and including the first end of sequence
        return row.index(eos) + 1 if eos in row else len(row)

    profile = load(tmp_path / "p.json")
    # during generate only the steps' edges were marked (no tensor read); their rows come after it returned
    assert all(set(w.loop) == {"call"} for w in profile.windows if w.name in ("[batch prefill]", "[batch decode]"))
    split = steps(profile.windows)
    first = [(w, tokens) for w, _, tokens in split if w.loop["call"] == 0]
    second_steps = [(w, tokens) for w, _, tokens in split if w.loop["call"] == 1]
    second = [w for w, _ in second_steps]
    # one prefill, then one decode per further new token, every row in the first call
    assert [w.name for w, _ in first] == ["[batch prefill]"] + ["[batch decode]"] * 5
    assert first[0][1] == {"g0.0": 3.0, "g0.1": 4.0, "g0.2": 5.0}  # the masks' ones: no padding
    assert all(tokens == {"g0.0": 1.0, "g0.1": 1.0, "g0.2": 1.0} for _, tokens in first[1:])
    # in the second, row 0 stops after its second token: the decodes after it serve the others only
    counts = [produced(row) for row in out["second"]]
    assert counts[0] <= 2 < max(counts)
    assert len(second) == max(counts)
    for k, (_, tokens) in enumerate(second_steps[1:], start=1):  # decode k feeds each row its k-th new token
        assert tokens == {f"g1.{r}": 1.0 for r, n in enumerate(counts) if n > k}
    second = second + [w for w in profile.windows if w.name == "[batch rows]" and w.loop["call"] == 1]
    rows = {r.request: r for r in token_run(second).requests}
    for i, n in enumerate(counts):
        assert rows[f"g1.{i}"].output_tokens == n
        assert rows[f"g1.{i}"].prefill_tokens == [3, 4, 5][i]
    run = token_run(second)
    assert sum(r.energy_j for r in run.requests) == pytest.approx(sum(w.program_total_j for w in second), rel=1e-9)
    assert all(r.energy_j > 0 for r in run.requests)


IN_PROCESS = """
import torch
import transformers

import energyprof
from energyprof.batches import hook_generate

hook_generate()
torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64, pad_token_id=0)
model = transformers.GPT2LMHeadModel(config).eval()
ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
with energyprof.energy_profile(power_trace="trace.csv", json="q.json", output="q.html", quiet=True), torch.no_grad():
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                   pad_token_id=0)
    beams = transformers.GenerationConfig(num_beams=2, max_new_tokens=2, do_sample=False, pad_token_id=0)
    model.generate(input_ids=ids, attention_mask=mask, generation_config=beams)  # beam search: not split
model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=0)  # no profile
print("ok")
"""


@pytest.mark.torch
def test_in_process_generate_is_split_once_hooked(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    (tmp_path / "gen.py").write_text(textwrap.dedent(IN_PROCESS))
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,40\n")
    proc = subprocess.run([sys.executable, "gen.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr[-3000:]
    run = token_run(load(tmp_path / "q.json").windows)
    assert run is not None and run.steps == 3
    rows = {r.request: r for r in run.requests}
    assert sorted(rows) == ["g0.0", "g0.1"]
    assert (rows["g0.0"].prefill_tokens, rows["g0.1"].prefill_tokens) == (2.0, 3.0)
    assert rows["g0.0"].output_tokens == rows["g0.1"].output_tokens == 3


def test_two_processes_requests_of_the_same_name_stay_two_requests() -> None:
    from energyprof.record import replace

    windows = scripted_run().windows
    both = [replace(w, pid=1) for w in windows] + [replace(w, pid=2, start_s=w.start_s + 100) for w in windows]
    run = token_run(both)
    assert run is not None and run.steps == 2 * len(LOOP)
    assert sorted((r.pid, r.request) for r in run.requests) == [(p, q) for p in (1, 2) for q in "ABCD"]
    alone = {r.request: r for r in token_run(windows).requests}
    for r in run.requests:  # each process's A is the A of a run alone: nothing of the other's merged in
        assert r.energy_j == pytest.approx(alone[r.request].energy_j, abs=1e-12)
        assert r.output_tokens == alone[r.request].output_tokens


class _Ids:
    ndim, shape = 2, (2, 3)


class _Mixin:
    """The generation module's shape as hook_generate sees it: a generate that prepares each step's inputs."""

    def prepare_inputs_for_generation(self, input_ids: object, **kwargs: object) -> dict[str, object]:
        return {"input_ids": input_ids}

    def generate(self, *args: object, fail: bool = False, **kwargs: object) -> object:
        self.prepare_inputs_for_generation(_Ids(), attention_mask=None)
        if fail:
            raise KeyError("the program's own")
        return "sequences"


class _Broken:
    """A profile whose window calls fail."""

    def begin_window(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("energyprof's part failed")

    end_window = begin_window


def test_generate_runs_as_it_is_when_energyprofs_part_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from energyprof.agent import generate as gen

    class Mixin(_Mixin):
        pass

    assert gen.hook_generate(SimpleNamespace(GenerationMixin=Mixin))
    monkeypatch.setattr(gen, "running", lambda: _Broken())
    model = Mixin()
    assert model.generate() == "sequences"  # the step's window failed: the call's result is its own
    assert "prepare_inputs_for_generation" not in vars(model)  # and the model is as it was
    with pytest.raises(KeyError, match="the program's own"):
        model.generate(fail=True)
    assert "prepare_inputs_for_generation" not in vars(model)
    monkeypatch.setattr(gen, "running", lambda: (_ for _ in ()).throw(RuntimeError("no profile to ask")))
    assert model.generate() == "sequences"  # failing to find the profile: generate as it is


AUTOLOAD = """
import importlib.util
import sys

from energyprof.agent import autoload

autoload.install()
finder = sys.meta_path[0]
assert type(finder).__name__ == "_Finder"
assert importlib.util.find_spec("transformers.generation.utils") is not None  # asked about, not imported
assert "transformers.generation.utils" not in sys.modules and "transformers.generation.utils" in autoload._AFTER
import transformers.generation.utils as gu
assert getattr(gu.GenerationMixin.generate, "__energyprof_generate__", False)  # the import still got the hook
assert type(gu.__loader__).__name__ == "SourceFileLoader" and gu.__spec__.loader is gu.__loader__
assert finder in sys.meta_path  # the others are still watched for
import _pytest.config
assert _pytest.config.get_config.__wrapped__ is not None and type(_pytest.config.__loader__).__name__ == "SourceFileLoader"
assert finder in sys.meta_path and "_pytest.config" not in autoload._AFTER  # the web servers' still watched for
for name in list(autoload._AFTER):  # as if the program had imported every one of them
    autoload._done(name)
assert finder not in sys.meta_path  # all seen: the import system as it was
print("ok")
"""


@pytest.mark.torch
def test_the_import_watch_is_used_up_by_the_import_not_by_a_question(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    proc = subprocess.run([sys.executable, "-c", AUTOLOAD], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr[-3000:]


def test_a_generate_call_whose_rows_were_never_read_is_not_split() -> None:
    from energyprof.facts.profile import Window

    def step(name: str, t: float, call: float, pid: int) -> Window:
        return Window(name=name, start_s=t, end_s=t + 0.1, time_s=0.1, energy_j={"cpu": 2.0},
                      program_energy_j={"cpu": 1.0}, loop={"call": call}, pid=pid)

    rows = Window(name="[batch rows]", start_s=0.2, end_s=0.2, pid=7,
                  loop={"call": 0.0, "req:g0.0": 3.0, "decodes:g0.0": 1.0, "req:g0.1": 1.0, "decodes:g0.1": 0.0})
    read = [step("[batch prefill]", 0.0, 0.0, 7), step("[batch decode]", 0.1, 0.0, 7), rows]
    unread = [step("[batch prefill]", 1.0, 0.0, 8), step("[batch decode]", 1.1, 0.0, 8)]  # another process's call 0
    assert token_run(unread) is None
    run = token_run(read + unread)
    assert run.steps == 2 and {(r.pid, r.request) for r in run.requests} == {(7, "g0.0"), (7, "g0.1")}
    by = {r.request: r for r in run.requests}
    assert (by["g0.0"].prefill_j, by["g0.1"].prefill_j, by["g0.0"].decode_j) == pytest.approx((0.75, 0.25, 1.0))
    assert (by["g0.0"].output_tokens, by["g0.1"].output_tokens) == (2.0, 1.0)
