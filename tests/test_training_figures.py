"""Training figures as facts: a tracked loop keeps each batch's samples and the model's parameter count
in the profile, the breakdown gives energy per step, sample and epoch, and with dataset= the page-cache
residency of the data at each pass's start and end, cold after a drop, warm after the pass read it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import run_cli

pytest.importorskip("torch")

from energyprof.collect import pagecache  # noqa: E402

SCRIPT = """\
import sys, time, numpy as np, torch
import energyprof.torch as ept
from energyprof.collect import pagecache

folder = sys.argv[1]
files = sorted(f"{folder}/{n}" for n in __import__("os").listdir(folder))

class Files(torch.utils.data.Dataset):
    def __len__(self):
        return len(files)
    def __getitem__(self, i):
        with open(files[i], "rb") as f:
            raw = np.frombuffer(f.read(), dtype=np.uint8)
        time.sleep(0.02)
        return torch.from_numpy(raw[:64].astype(np.float32)), 1

model = torch.nn.Sequential(torch.nn.Linear(64, 10), torch.nn.ReLU(), torch.nn.Linear(10, 2))
loader = torch.utils.data.DataLoader(Files(), batch_size=4, num_workers=0)
pagecache.drop(folder)
tracked = ept.track(loader, model=model, dataset=folder)
for epoch in range(2):
    time.sleep(0.1)
    with ept.window("epoch", epoch):
        for x, y in tracked:
            model(x).sum().backward()
    time.sleep(0.1)
"""


def test_energy_per_step_sample_epoch_and_cache_residency(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(10):  # 10 samples in batches of 4: 4 + 4 + 2 per epoch
        with open(data / f"{i:02d}.bin", "wb") as f:
            f.write(os.urandom(256 << 10))
            f.flush()
            os.fsync(f.fileno())
    pagecache.drop(str(data))
    if (pagecache.residency(str(data))["fraction"] or 0) > 0.5:
        pytest.skip("this file system ignores POSIX_FADV_DONTNEED")
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    proc = run_cli(["--power-trace", "trace.csv", "--sensor-interval", "0.01", "-q", "--json", "p.json", "-o", "r.html",
                    "train.py", str(data)], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "p.json").read_text())
    fetch = [w for w in saved["windows"] if w["name"] == "step.fetch" and "samples" in w.get("loop", {})]
    assert [int(w["loop"]["samples"]) for w in fetch] == [4, 4, 2] * 2
    assert [int(w["loop"]["parameters"]) for w in fetch if "parameters" in w["loop"]] == [64 * 10 + 10 + 10 * 2 + 2] * 2
    b = saved["derived"]["training"]["step"]
    assert (b["step_count"], b["sample_count"], b["epoch_count"], b["parameters"]) == (6, 20, 2, 672)
    assert b["training_energy_j"] > 0
    assert b["energy_per_step_j"] == pytest.approx(b["training_energy_j"] / 6)
    assert b["energy_per_sample_j"] == pytest.approx(b["training_energy_j"] / 20)
    assert b["energy_per_epoch_j"] == pytest.approx(sum(e["energy_j"] for e in b["epochs"]) / 2)
    assert [e["samples"] for e in b["epochs"]] == [10, 10]
    cache = {(w["name"], w["index"]): w["loop"]["residency"] for w in saved["windows"] if ".cache." in w["name"]}
    assert cache[("step.cache.start", 0)] < 0.05  # dropped before the first pass
    assert cache[("step.cache.end", 0)] > 0.95 and cache[("step.cache.start", 1)] > 0.95
    first = b["epochs"][0]
    # The cold pass read the files: each item takes 20 ms and the counters are read every 10 ms, so the
    # tick intervals astride the epoch's ends hold at most one item each (2 of 10 files: 20%). Only a floor
    # holds: the program's counter also counts any other file it faulted in meanwhile (its libraries' pages,
    # under memory pressure: 3.72 MB for these 2.62 once, beside two CPU hogs).
    assert first["process_read_mb"] >= 0.75 * 10 * 0.262144
    assert b["epochs"][1]["process_read_mb"] < 0.5  # the warm pass found them cached
    html = (tmp_path / "r.html").read_text()
    assert "the model has 672 parameters" in html and "(20 samples)" in html and "<th>disk read (MB)</th>" in html
