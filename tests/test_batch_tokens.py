"""Tokens in a batch: each batched step's energy split among its requests by their tokens, prefill and
decode apart (`energyprof.batch`), and Hugging Face `generate` recognised without code."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import energyprof
from conftest import run_cli
from energyprof.analysis.tokens import split_step, token_run
from energyprof.batches import step_facts
from energyprof.core.ledger import Ledger
from energyprof.core.recording import Tick
from energyprof.core.tree import build_profile
from energyprof.facts.profile import load
from energyprof.render.unit_tables import tokens_lines, tokens_section

CPU = {"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}
WATTS = 30.0
MS = 1_000_000
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
    return build_profile(led, "share", {"target": "serve.py"})


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
    profile = scripted_run()
    lines = tokens_lines(profile)
    assert lines[0].startswith(f"  batched steps: {len(LOOP)}, 4 requests, ")
    assert any(line.endswith("  C") for line in lines[1:])
    page = tokens_section(profile)
    assert '<section id="tokens"' in page and "ML.ENERGY" in page


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
    out = json.loads((tmp_path / "out.json").read_text())
    eos = out["eos"]

    def produced(row: list[int]) -> int:  # new tokens up to and including the first end of sequence
        return row.index(eos) + 1 if eos in row else len(row)

    profile = load(tmp_path / "p.json")
    steps = [w for w in profile.windows if w.name in ("[batch prefill]", "[batch decode]")]
    first = [w for w in steps if any(k.startswith("req:g0.") for k in w.loop)]
    second = [w for w in steps if any(k.startswith("req:g1.") for k in w.loop)]
    # one prefill forward, then one decode forward per further new token, every row in the first call
    assert [w.name for w in first] == ["[batch prefill]"] + ["[batch decode]"] * 5
    assert first[0].loop == {"req:g0.0": 3.0, "req:g0.1": 4.0, "req:g0.2": 5.0}  # the masks' ones: no padding
    assert all(w.loop == {"req:g0.0": 1.0, "req:g0.1": 1.0, "req:g0.2": 1.0} for w in first[1:])
    # in the second, row 0 stops after its second token: the decodes after it serve the others only
    counts = [produced(row) for row in out["second"]]
    assert counts[0] <= 2 < max(counts)
    assert len(second) == max(counts)
    for k, step in enumerate(second[1:], start=1):  # decode k feeds each row its k-th new token
        assert step.loop == {f"req:g1.{r}": 1.0 for r, n in enumerate(counts) if n > k}
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
    import subprocess
    import sys

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
