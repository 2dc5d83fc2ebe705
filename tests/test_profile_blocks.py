"""The profile's blocks, typed and versioned: a file written before blocks were versioned (by the energyprof
of the commit before them: tests/fixtures/profile-before-blocks.json) still loads, its I/O and known meta
typed; a block newer than this energyprof reads, or a damaged one, is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from energyprof.analysis.io import io_in_span
from energyprof.facts.blocks import BLOCK_VERSIONS, IoFact, Meta, check_blocks, read_io
from energyprof.facts.profile import Profile, ProfileFormatError, load

OLD = Path(__file__).parent / "fixtures" / "profile-before-blocks.json"


def test_a_profile_written_before_the_blocks_loads_with_its_io_typed() -> None:
    raw = json.loads(OLD.read_text())
    assert "blocks" not in raw  # written before blocks were versioned
    p = load(OLD)
    assert isinstance(p.io, IoFact) and p.io.t_s == raw["io"]["t_s"] and p.io.sector_bytes == 512
    assert p.io.process.keys() == raw["io"]["process"].keys() and p.io.counted == raw["io"]["counted"]
    whole = io_in_span(p.io, float("-inf"), float("inf"))
    assert whole is not None and whole["process_read_mb"] >= 0
    assert isinstance(p.known_meta, Meta) and p.known_meta.settings == {} and p.known_meta.live_export is None
    assert [w.name for w in p.windows] == ["epoch", "epoch"]
    assert sum(p.totals.energy_j.values()) == pytest.approx(sum(raw["totals"]["energy_j"].values()))


def test_a_saved_profile_carries_its_blocks_versions_and_reads_back_the_same() -> None:
    p = load(OLD)
    doc = json.loads(p.to_json())
    assert doc["blocks"] == BLOCK_VERSIONS
    again = Profile.from_dict(doc)
    assert again.to_table() == p.to_table() and again.io.to_dict() == p.io.to_dict()
    assert read_io(p.io.to_dict()).to_dict() == p.io.to_dict()


@pytest.mark.parametrize("block", sorted(BLOCK_VERSIONS))
def test_a_block_newer_than_this_energyprof_is_refused_naming_it(block: str) -> None:
    doc = json.loads(OLD.read_text())
    doc["blocks"] = {block: BLOCK_VERSIONS[block] + 1}
    with pytest.raises(ProfileFormatError) as err:
        Profile.from_dict(doc)
    assert f"{block} block is version {BLOCK_VERSIONS[block] + 1}" in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_block_and_older_versions_are_read() -> None:
    assert check_blocks({"io": 1, "a_later_block": 7})["a_later_block"] == 7
    assert check_blocks(None) == {name: 1 for name in BLOCK_VERSIONS}
    for bad in ({"io": 0}, {"io": "1"}, ["io"]):
        with pytest.raises(ProfileFormatError):
            check_blocks(bad)


@pytest.mark.parametrize("damage, where", [
    (lambda io: io.update(t_s="soon"), "io.t_s"),
    (lambda io: io["process"].update(read_bytes=[1.5]), "io.process.read_bytes"),
    (lambda io: io.update(disks={"sda": {"reads": "many"}}), "io.disks.sda.reads"),
    (lambda io: io.update(sector_bytes=0), "io.sector_bytes"),
])
def test_a_damaged_io_block_is_one_line_naming_its_field(damage, where: str) -> None:
    doc = json.loads(OLD.read_text())
    damage(doc["io"])
    with pytest.raises(ProfileFormatError) as err:
        Profile.from_dict(doc)
    assert where in str(err.value) and "\n" not in str(err.value)


def test_the_known_meta_is_checked_on_load() -> None:
    doc = json.loads(OLD.read_text())
    doc["meta"]["live_export"] = {"run": "r", "sinks": "influx"}
    with pytest.raises(ProfileFormatError, match="meta.live_export.sinks"):
        Profile.from_dict(doc)
    doc["meta"]["live_export"] = {"run": "r", "sinks": [{"sink": "influx", "sent": 3, "dropped": 0}]}
    assert Profile.from_dict(doc).known_meta.live_export["sinks"][0]["sent"] == 3
    doc["meta"]["page_cache"] = {"start": 1}
    with pytest.raises(ProfileFormatError, match="meta.page_cache"):
        Profile.from_dict(doc)


def test_io_absent_is_said() -> None:
    io = read_io({"absent": "I/O is not recorded in this run (--io off)"})
    assert io is not None and not io.has_readings and "--io off" in io.absent
    assert io.to_dict() == {"absent": "I/O is not recorded in this run (--io off)"}
