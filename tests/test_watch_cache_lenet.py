"""--watch-cache PATH on examples/lenet_cifar.py reading its images from disk: the tracked loop measures
the folder's page-cache residency at each epoch's start and end, beside the epoch's MB read and stall.
After a cache drop the first epoch starts cold and reads the images from the disk; the second finds
them cached. The page-cache readings stay facts of the training table, not rows of the windows table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from energyprof.collect import pagecache  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BATCHES, BATCH = 100, 16
IMAGES_MB = BATCHES * BATCH * 1024 / 1e6


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.skipif(not pagecache.supported(), reason="mincore/posix_fadvise: Linux only")
def test_lenet_watch_cache_cold_then_warm(tmp_path: Path) -> None:
    example = str(REPO / "examples" / "lenet_cifar.py")
    args = ["--data", "data", "--batches", str(BATCHES), "--batch-size", str(BATCH), "--workers", "0"]
    subprocess.run([sys.executable, example, *args, "--save-data"], cwd=tmp_path, env=_env(), check=True, timeout=300)
    pagecache.drop(str(tmp_path / "data"))
    if (pagecache.residency(str(tmp_path / "data"))["fraction"] or 0) > 0.5:
        pytest.skip("this file system ignores POSIX_FADV_DONTNEED")
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    proc = subprocess.run([sys.executable, "-m", "energyprof", "--power-trace", "trace.csv", "--sensor-interval", "0.01",
                           "-q", "--json", "p.json", "-o", "r.html", "--watch-cache", "data", example, *args],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "p.json").read_text())
    epochs = saved["derived"]["training"]["step"]["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1]
    cold, warm = epochs
    assert cold["cache_start"] < 0.1 and cold["cache_end"] > 0.95  # only the labels file was read before
    assert warm["cache_start"] > 0.95 and warm["cache_end"] > 0.95
    # the cold epoch read every image (1,024 bytes each) from the disk. The program's counter also counts any
    # other file it faulted in meanwhile (its libraries' pages, under memory pressure), so only a floor holds:
    # the counters are read every 10 ms and an epoch of 1,600 reads lasts ~0.3 s or more, and the two tick
    # intervals astride its ends are split by time, so up to ~2 x 10 ms of its reads may fall outside (25%
    # allows for late ticks)
    assert cold["process_read_mb"] >= 0.75 * IMAGES_MB, cold
    assert cold["read_mb"] >= 0.75 * IMAGES_MB  # the disks' counters: others' reads can only add
    assert warm["process_read_mb"] < cold["process_read_mb"]  # the warm epoch found the images cached
    assert cold["stall_s"] is not None and warm["stall_s"] is not None
    # the run's start and end readings stay in meta; the loop's are not windows of the table
    assert [c["when"] for c in saved["meta"]["page_cache"]] == ["start", "end"]
    html = (tmp_path / "r.html").read_text()
    assert "cached at start</th>" in html and "step.cache.start" not in html
