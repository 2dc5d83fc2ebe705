"""The per-user cache of start-up work: used when it is safe, keyed so a stale entry is never read,
and never a reason for a run to fail."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from energyprof.store import cache
from energyprof.collect.sensors import estimate


@pytest.fixture()
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("ENERGYPROF_CACHE_DIR", str(d))
    return d


def test_the_folder_is_made_private_and_an_unsafe_one_is_not_used(cache_dir: Path, monkeypatch) -> None:
    assert cache.folder() == str(cache_dir)
    assert (cache_dir.stat().st_mode & 0o777) == 0o700
    cache_dir.chmod(0o777)  # anyone could plant a compiled template here
    assert cache.folder() is None
    monkeypatch.setenv("ENERGYPROF_CACHE_DIR", "")
    assert cache.folder() is None  # turned off
    monkeypatch.setenv("ENERGYPROF_CACHE_DIR", "relative/cache")
    assert cache.folder() is None


def test_the_tdp_is_remembered_per_model_and_table(cache_dir: Path, monkeypatch) -> None:
    calls = []
    real = estimate.lookup_tdp
    monkeypatch.setattr(estimate, "lookup_tdp", lambda model: calls.append(model) or real(model))
    first = estimate._cached_lookup("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz")
    again = estimate._cached_lookup("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz")
    assert first == again == real("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz") and first is not None
    assert len(calls) == 1  # the second answer came from the cache
    assert estimate._cached_lookup("an unknown CPU") is None and estimate._cached_lookup("an unknown CPU") is None
    assert len(calls) == 2  # "not in the table" is remembered too
    table = json.loads((cache_dir / "tdp.json").read_text())
    assert all(key.split("\x1f")[0] == estimate.carbon_data.cpu_table_key() for key in table)


def test_the_tdp_key_names_the_table_file_that_is_read(tmp_path: Path, monkeypatch) -> None:
    """The key changes with the table's file (codecarbon's when installed, else the snapshot), so an
    upgraded codecarbon or energyprof never reads an answer from the old table."""
    from energyprof.carbon import data as carbon_data

    folder = carbon_data.codecarbon_folder()
    expected = folder / carbon_data.CPUS if folder is not None else carbon_data.SNAPSHOT
    assert carbon_data.cpu_table_key().startswith(f"{expected}:")
    table = tmp_path / "hardware" / "cpu_power.csv"
    table.parent.mkdir()
    table.write_text("Name,TDP\nXeon Gold 6248,150\n")
    monkeypatch.setattr(carbon_data, "codecarbon_folder", lambda: tmp_path)
    before = carbon_data.cpu_table_key()
    assert before.startswith(f"{table}:")
    table.write_text("Name,TDP\nXeon Gold 6248,151\n")
    os.utime(table, ns=(1, 1))
    assert carbon_data.cpu_table_key() != before


def test_a_damaged_cache_is_ignored_and_replaced(cache_dir: Path) -> None:
    cache_dir.mkdir(mode=0o700)
    (cache_dir / "tdp.json").write_text("{not json")
    hit = estimate._cached_lookup("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz")
    assert hit == estimate.lookup_tdp("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz")
    assert json.loads((cache_dir / "tdp.json").read_text())  # written anew


def test_the_report_is_the_same_with_the_cache_on_and_off(cache_dir: Path, monkeypatch) -> None:
    from energyprof.analysis.report import RenderOptions, build
    from energyprof.render.html import render_html
    from conftest_report import small_profile

    model = build(small_profile(), RenderOptions())
    monkeypatch.setenv("ENERGYPROF_CACHE_DIR", "")
    plain = render_html(model)
    monkeypatch.setenv("ENERGYPROF_CACHE_DIR", str(cache_dir))
    first = render_html(model)
    assert render_html(model) == first == plain


def test_an_unwritable_cache_costs_nothing_but_time(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ENERGYPROF_CACHE_DIR", str(blocker / "cache"))  # a folder under a file
    assert cache.folder() is None
    assert estimate._cached_lookup("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz") is not None
    assert not os.path.exists(blocker / "cache")
