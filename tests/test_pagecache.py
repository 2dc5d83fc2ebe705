"""Page-cache residency (mincore) and eviction (posix_fadvise DONTNEED) on a real file tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from energyprof.collect import pagecache

pytestmark = pytest.mark.skipif(not pagecache.supported(), reason="mincore and posix_fadvise eviction are Linux's here")


def tree(root: Path, files: int = 8, size: int = 1 << 20) -> Path:
    for i in range(files):
        sub = root / f"class{i % 3}"
        sub.mkdir(parents=True, exist_ok=True)
        with open(sub / f"{i}.bin", "wb") as f:
            f.write(os.urandom(size))
            f.flush()
            os.fsync(f.fileno())  # DONTNEED leaves dirty pages: written out first
    return root


def evictable(root: Path) -> None:
    pagecache.drop(str(root))
    left = pagecache.residency(str(root))["fraction"]
    if left is not None and left > 0.5:
        pytest.skip(f"this file system ignores POSIX_FADV_DONTNEED ({left:.0%} still cached after the drop)")


def read_all(root: Path) -> None:
    for p in pagecache.files_under(str(root)):
        Path(p).read_bytes()


def test_dropped_then_read_gives_near_zero_then_near_one(tmp_path: Path) -> None:
    root = tree(tmp_path / "data")
    evictable(root)
    cold = pagecache.residency(str(root))
    assert cold["files"] == 8 and cold["bytes"] == 8 << 20 and cold["sampled"] is None
    assert cold["fraction"] < 0.05
    read_all(root)
    warm = pagecache.residency(str(root))
    assert warm["fraction"] > 0.95
    pagecache.drop(str(root))
    assert pagecache.residency(str(root))["fraction"] < 0.05  # asking did not warm it


def test_a_half_read_file_is_half_resident(tmp_path: Path) -> None:
    root = tree(tmp_path / "one", files=1, size=4 << 20)
    evictable(root)
    fd = os.open(pagecache.files_under(str(root))[0], os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: the pages read are the pages cached
        for off in range(0, 2 << 20, 1 << 16):
            os.pread(fd, 1 << 16, off)
    finally:
        os.close(fd)
    frac = pagecache.residency(str(root))["fraction"]
    assert 0.45 < frac < 0.6


def test_a_large_tree_is_sampled_and_says_so(tmp_path: Path) -> None:
    root = tree(tmp_path / "many", files=30, size=8192)
    got = pagecache.residency(str(root), max_files=10)
    assert got["files"] == 30 and got["sampled"] == 10 and got["method"] == "estimated from 10 of 30 files"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_cache_drop_command(tmp_path: Path) -> None:
    root = tree(tmp_path / "data", files=3)
    evictable(root)
    read_all(root)
    proc = subprocess.run([sys.executable, "-m", "energyprof", "cache", "drop", str(root)], capture_output=True, text=True,
                          timeout=60, env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    assert "after the drop, 0.0% of 3.1 MB" in proc.stdout
    assert pagecache.residency(str(root))["fraction"] < 0.05
    bad = subprocess.run([sys.executable, "-m", "energyprof", "cache", "drop", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=60, env=_env(), check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no such file" in bad.stderr


def test_watch_cache_records_the_run_cold_then_warm(tmp_path: Path) -> None:
    import json

    root = tree(tmp_path / "data", files=4)
    evictable(root)
    (tmp_path / "s.py").write_text("import pathlib, sys\nfor p in sorted(pathlib.Path(sys.argv[1]).rglob('*.bin')):\n"
                                   "    p.read_bytes()\n")
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    proc = subprocess.run([sys.executable, "-m", "energyprof", "--power-trace", "trace.csv", "--watch-cache", "data", "-q",
                           "--json", "p.json", "-o", "r.html", "s.py", "data"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((tmp_path / "p.json").read_text())["meta"]
    start, end = meta["page_cache"]
    assert (start["when"], end["when"]) == ("start", "end")
    assert start["fraction"] < 0.05 and end["fraction"] > 0.95 and end["files"] == 4
    assert meta["settings"]["storage"]["path"] == "data" and meta["settings"]["storage"]["kind"]
    bad = subprocess.run([sys.executable, "-m", "energyprof", "--watch-cache", "nope", "s.py", "data"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, env=_env(), check=False)
    assert bad.returncode == 2 and "--watch-cache" in bad.stderr and bad.stderr.count("\n") == 1
