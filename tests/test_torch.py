"""The PyTorch integration and the examples, on CPU (CI has no GPU).

The loop-timing tests need no torch: `track` wraps any iterable. Tests that train a model
are marked `torch` and skipped where torch is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import energyprof
import energyprof.torch as ept
from energyprof.profiler import Profiler

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = [pytest.mark.torch, pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")]


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class SlowLoader:
    """A loader whose next() takes `fetch_s` (a dataset read), `n` batches per pass."""

    def __init__(self, n: int, fetch_s: float) -> None:
        self.n, self.fetch_s = n, fetch_s
        self.batch_size = 4

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        for i in range(self.n):
            time.sleep(self.fetch_s)
            yield i


# -- the fetch / compute split (no torch needed) -------------------------------------------
def test_fetch_and_compute_add_up_to_the_loop_time() -> None:
    tracked = ept.track(SlowLoader(5, fetch_s=0.04))
    t0 = time.perf_counter()
    for _ in tracked:
        with tracked.preprocess():
            time.sleep(0.01)
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    steps = tracked.steps
    assert [s.step for s in steps] == [0, 1, 2, 3, 4]
    for s in steps:
        assert 0.04 <= s.fetch_s < 0.04 + 0.03
        assert 0.01 <= s.preprocess_s < 0.01 + 0.03
        assert 0.02 <= s.compute_s < 0.02 + 0.03
        assert s.time_s == pytest.approx(s.fetch_s + s.preprocess_s + s.compute_s)
        assert s.stall_s == pytest.approx(max(s.fetch_s + s.preprocess_s - s.compute_s, 0.0))
        assert s.stall_s > 0.015  # loading (50 ms) outlasts compute (20 ms)
    # contiguous phases: every step plus the final empty fetch is the whole loop
    assert sum(s.time_s for s in steps) + sum(tracked.end_waits_s) == pytest.approx(wall, abs=0.002)
    (epoch,) = tracked.summary()["epochs"]
    assert epoch["steps"] == 5 and epoch["stall_s"] == pytest.approx(sum(s.stall_s for s in steps))


def test_a_broken_loop_ends_its_step_and_counts_passes() -> None:
    tracked = ept.track(SlowLoader(10, fetch_s=0.0))
    assert len(tracked) == 10 and tracked.batch_size == 4  # the loader's attributes pass through
    for i in tracked:
        if i == 2:
            break
    assert [s.step for s in tracked.steps] == [0, 1, 2]
    assert tracked.end_waits_s == []
    for _ in tracked:
        pass
    assert [s.epoch for s in tracked.steps] == [0] * 3 + [1] * 10
    assert [s.step for s in tracked.steps][3:] == list(range(3, 13))  # counted across passes


def test_split_in_a_profile_matches_the_timings_and_conserves_energy() -> None:
    prof = Profiler(quiet=True, summary=False, gpus=False)
    prof.start()
    tracked = ept.track(SlowLoader(4, fetch_s=0.03))
    for epoch in range(2):
        with ept.window("epoch", epoch):
            for _ in tracked:
                end = time.perf_counter() + 0.03
                while time.perf_counter() < end:
                    pass
    profile = prof.stop()
    b = ept.breakdown(profile)
    assert [s["step"] for s in b["steps"]] == list(range(8))
    assert [s["epoch"] for s in b["steps"]] == [0] * 4 + [1] * 4
    assert len(b["end_of_data_waits"]) == 2
    for row, rec in zip(b["steps"], tracked.steps):
        assert row["fetch_s"] == pytest.approx(rec.fetch_s, abs=0.002)
        assert row["compute_s"] == pytest.approx(rec.compute_s, abs=0.002)
        assert row["energy_j"] == pytest.approx(row["fetch_j"] + row["compute_j"])
        assert row["fetch_j"] > 0 and row["compute_j"] > 0
    epoch_j = {w["index"]: sum(w["energy_j"].values()) for w in profile.windows if w["name"] == "epoch"}
    for e in b["epochs"]:
        assert e["steps"] == 4
        assert e["energy_j"] <= epoch_j[e["epoch"]] + 1e-9  # the steps are inside their epoch
    assert b["step_energy_j"]["n"] == 8 and b["step_energy_j"]["mean"] > 0


def test_without_cuda_sync_and_memory_are_no_ops() -> None:
    ept.cuda_sync()  # no torch imported yet, or a CPU build: nothing to wait for
    assert ept.gpu_memory() is None
    with ept.window("epoch", 0):  # no profile running: a no-op, not an error
        pass


@pytest.mark.torch
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_cuda_sync_and_memory_per_step_with_cuda_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA runtime is the hardware boundary: fake torch.cuda's answers, nothing else."""
    import torch

    calls: list[str] = []
    state = {"allocated": 1000, "peak": 5000}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: state["peak"])

    def reset(device: Any = None) -> None:
        calls.append("reset")
        state["peak"] = state["allocated"]

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    ept.cuda_sync()
    assert calls == ["sync"]
    tracked = ept.track(range(2))
    for i in tracked:
        state["allocated"] += 100
        state["peak"] = max(state["peak"], state["allocated"] + 7000 * (i + 1))
    assert [(s.gpu_allocated_bytes, s.gpu_peak_bytes) for s in tracked.steps] == [(1100, 8100), (1200, 15200)]
    assert calls.count("reset") == 2


# -- a real training loop ------------------------------------------------------------------
@pytest.mark.torch
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_training_loop_profile_has_forward_backward_step_and_epoch_windows() -> None:
    lenet = load_example("lenet_cifar")
    prof = Profiler(quiet=True, summary=False, gpus=False)
    prof.start()
    tracked = lenet.main(["--epochs", "2", "--batches", "40", "--workers", "0", "--threads", "1"])
    profile = prof.stop()

    names = {n.function for n, _ in profile.nodes()}
    assert any("forward" in f for f in names), sorted(names)
    assert any("backward" in f for f in names), sorted(names)
    assert any(f.endswith("SGD.step") or f.endswith("Optimizer.step") for f in names) or \
        any(f.endswith(".step") for f in names), sorted(names)
    step_nodes = [n for n, _ in profile.nodes() if n.function == "train_step"]
    assert step_nodes and sum(n.total_energy for n in step_nodes) > 0

    total = profile.totals["duration_s"]
    epochs = sorted((w for w in profile.windows if w["name"] == "epoch"), key=lambda w: w["start_s"])
    assert [w["index"] for w in epochs] == [0, 1] and all(w["depth"] == 0 for w in epochs)
    # disjoint, inside the run; the epochs and the time outside them make up the run
    assert 0.0 <= epochs[0]["start_s"] and epochs[0]["end_s"] <= epochs[1]["start_s"] and epochs[1]["end_s"] <= total
    outside = epochs[0]["start_s"] + (epochs[1]["start_s"] - epochs[0]["end_s"]) + (total - epochs[1]["end_s"])
    assert sum(w["time_s"] for w in epochs) + outside == pytest.approx(total, abs=1e-9)
    for sid, joules in profile.totals["energy_j"].items():
        assert sum(w["energy_j"][sid] for w in epochs) <= joules + 1e-9

    # every step is fetch then compute, back to back, inside its epoch, as the tracker timed it
    wins = {(w["name"], w["index"]): w for w in profile.windows}
    assert len(tracked.steps) == 80
    for rec in tracked.steps:
        f, c = wins[("step.fetch", rec.step)], wins[("step.compute", rec.step)]
        assert c["start_s"] == pytest.approx(f["end_s"], abs=0.001)
        assert f["time_s"] + c["time_s"] == pytest.approx(c["end_s"] - f["start_s"], abs=0.001)
        assert f["time_s"] + c["time_s"] == pytest.approx(rec.time_s, abs=0.002)
        e = epochs[rec.epoch]
        assert e["start_s"] <= f["start_s"] and c["end_s"] <= e["end_s"]
        assert f["depth"] == c["depth"] == 1


# -- the examples, through the real command line -----------------------------------------------
def run_cli(tmp_path: Path, script: str, *args: str) -> tuple[energyprof.Profile, Path]:
    html, js = tmp_path / f"{script}.html", tmp_path / f"{script}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "energyprof", "-q", "-o", str(html), "--json", str(js),
                           str(EXAMPLES / f"{script}.py"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.perf_counter() - t < 60
    assert html.stat().st_size > 10_000
    return energyprof.load(js), html


def test_quickstart_example_report(tmp_path: Path) -> None:
    profile, _ = run_cli(tmp_path, "quickstart", "--scale", "0.3")
    crunch = profile.function_totals("crunch")
    assert crunch > profile.function_totals("wait")
    assert crunch > 0


@pytest.mark.torch
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_lenet_example_report(tmp_path: Path) -> None:
    profile, html = run_cli(tmp_path, "lenet_cifar", "--epochs", "2", "--batches", "10", "--workers", "2",
                            "--threads", "1")
    assert [w["index"] for w in profile.windows if w["name"] == "epoch"] == [0, 1]
    b = ept.breakdown(profile)
    assert len(b["steps"]) == 20 and [e["epoch"] for e in b["epochs"]] == [0, 1]
    # the DataLoader's worker processes are children: their CPU is part of the program
    assert profile.totals["cpu_time_s"] > 0
    assert "epoch" in html.read_text(errors="replace")


@pytest.mark.torch
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_resnet_example_report(tmp_path: Path) -> None:
    profile, _ = run_cli(tmp_path, "resnet_training", "--device", "cpu", "--image-size", "32", "--width", "0.125",
                         "--batches", "3", "--batch-size", "4", "--epochs", "2", "--classes", "10", "--threads", "1")
    names = {n.function for n, _ in profile.nodes()}
    assert "BasicBlock.forward" in names and "train_step" in names
    assert len(ept.breakdown(profile)["steps"]) == 6
    json.dumps(profile.to_dict())  # the saved profile round-trips as JSON
