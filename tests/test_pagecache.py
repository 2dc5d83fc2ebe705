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


class _CountingLibc:
    """libc with mincore counted: the bytes asked about are the work done, whatever the clock says."""

    def __init__(self) -> None:
        self.lib = pagecache._libc()
        self.asked: list[int] = []

    def __getattr__(self, name: str):
        return getattr(self.lib, name)

    def mincore(self, addr, length, vec):
        self.asked.append(length.value)
        return self.lib.mincore(addr, length, vec)


def _sparse(path: Path, apparent: int, data_at: list[int], chunk: int = 1 << 20) -> Path:
    with open(path, "wb") as f:
        f.truncate(apparent)
        for off in data_at:
            f.seek(off)
            f.write(os.urandom(chunk))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        if not hasattr(os, "SEEK_HOLE") or os.lseek(fd, 0, os.SEEK_HOLE) >= apparent:
            pytest.skip("this file system does not tell holes from data (SEEK_DATA/SEEK_HOLE)")
    finally:
        os.close(fd)
    return path


def test_a_sparse_file_costs_its_data_not_its_apparent_size(tmp_path: Path, monkeypatch) -> None:
    """Defect: `cache status` on a 64 GiB sparse file mapped and asked all 16 M pages (3-8 s; a 1 TiB
    one took 147 s and 269 MB). Only its 2 MiB of data are asked about now, and its holes are said."""
    big = _sparse(tmp_path / "sparse.img", 64 << 30, [0, 32 << 30])
    lib = _CountingLibc()
    monkeypatch.setattr(pagecache, "_libc", lambda: lib)
    got = pagecache.residency(str(big))
    asked = sum(lib.asked)
    assert 2 << 20 <= asked <= 16 << 20, asked  # the data, whatever the file system rounds it to, never 64 GiB
    assert got["bytes"] == asked and got["hole_bytes"] == (64 << 30) - asked
    assert max(lib.asked) <= pagecache.CHUNK
    proc = subprocess.run([sys.executable, "-m", "energyprof", "cache", "status", str(big)], capture_output=True,
                          text=True, timeout=60, env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    assert f"of {asked / 1e6:.1f} MB in the page cache" in proc.stdout and "holes of 68.7 GB" in proc.stdout


def test_a_large_allocated_range_is_asked_in_bounded_windows(tmp_path: Path, monkeypatch) -> None:
    """A data extent larger than CHUNK is asked window by window (the vector stays small) and every page counts."""
    monkeypatch.setattr(pagecache, "CHUNK", 1 << 20)
    root = tree(tmp_path / "one", files=1, size=(5 << 20) + 100)
    lib = _CountingLibc()
    monkeypatch.setattr(pagecache, "_libc", lambda: lib)
    read_all(root)
    got = pagecache.residency(str(root))
    assert max(lib.asked) <= 1 << 20 and sum(lib.asked) == got["bytes"] == (5 << 20) + pagecache.PAGE
    assert got["fraction"] > 0.95


def test_cache_drop_says_when_dirty_pages_kept_files_cached(tmp_path: Path) -> None:
    """Defect: `cache drop` on files just written said "100% in the page cache" with no word that their
    pages were dirty (not yet on disk), which no advice can evict: it says so and to run sync first."""
    root = tmp_path / "fresh"
    root.mkdir()
    for i in range(3):
        (root / f"{i}.bin").write_bytes(os.urandom(1 << 20))  # not synced: dirty until the flusher writes it
    proc = subprocess.run([sys.executable, "-m", "energyprof", "cache", "drop", str(root)], capture_output=True, text=True,
                          timeout=60, env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    if "after the drop, 0.0%" in first:
        pytest.skip("the kernel wrote the files out before the drop (nothing dirty to report)")
    assert "run sync first" in proc.stdout and "dirty pages" in proc.stdout, proc.stdout
    os.sync()
    again = subprocess.run([sys.executable, "-m", "energyprof", "cache", "drop", str(root)], capture_output=True,
                           text=True, timeout=60, env=_env(), check=False)
    if "after the drop, 0.0%" in again.stdout:  # once on disk, the same drop evicts them, and no hint
        assert "sync" not in again.stdout


def test_without_cachestat_recently_written_files_are_named(tmp_path: Path) -> None:
    """Where the kernel cannot count a file's dirty pages (before Linux 6.5), files written within the
    dirty-expiry period, on a machine holding dirty pages, are the hint."""
    from energyprof.cli.cache import dirty_line

    root = tmp_path / "fresh"
    root.mkdir()
    (root / "a.bin").write_bytes(os.urandom(1 << 20))
    done = pagecache.drop(str(root), use_cachestat=False)
    assert done["how"] == "mtime" and done["dirty_files"] is None
    r = pagecache.residency(str(root))
    if not r["fraction"]:
        pytest.skip("the kernel wrote the file out before the drop")
    assert done["recent_files"] == 1
    assert "run sync first" in (dirty_line(str(root), done, r) or "")


def test_a_sample_says_what_its_size_stands_for(tmp_path: Path) -> None:
    """Defect: a sampled folder's size was its 2,000-file sample's. The tree's size comes from every
    file's stat; the line says how many files and how many bytes the sample was."""
    from energyprof.cli.cache import residency_line

    root = tree(tmp_path / "many", files=30, size=8192)
    got = pagecache.residency(str(root), max_files=10)
    assert got["sample_bytes"] == 10 * 8192 and got["bytes"] == 30 * 8192
    assert got["resident_bytes"] == pytest.approx(got["fraction"] * 30 * 8192)
    line = residency_line(str(root), got, after_drop=False)
    assert "10 of 30 files sampled, 0.1 MB of 0.2 MB" in line
