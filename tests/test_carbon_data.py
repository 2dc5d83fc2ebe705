"""The carbon data snapshot gives exactly the figures codecarbon's own files give, lookup by lookup.

Every country, every regional key, every GCP region and every CPU model in codecarbon's tables is
looked up twice, once through each source, and the numbers must be equal (not approximately: the
snapshot keeps codecarbon's raw values and the arithmetic is shared). Without codecarbon installed
there is nothing to compare with, and these tests skip; tests/test_install.py covers that install.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from energyprof.carbon import data as carbon_data
from energyprof.carbon import intensity
from energyprof.setup.options import Options
from energyprof.collect.sensors import estimate as model

CODECARBON = carbon_data.codecarbon()
needs_codecarbon = pytest.mark.skipif(CODECARBON is None, reason="codecarbon (the [carbon] extra) is not installed")


@pytest.fixture
def use() -> Iterator:
    """use(tables) makes every lookup read those tables until the test ends."""
    def switch(tables: carbon_data.CarbonData) -> None:
        carbon_data.active = lambda: tables
        model._cpu_table.cache_clear()

    original = carbon_data.active
    yield switch
    carbon_data.active = original
    model._cpu_table.cache_clear()


def both(use, lookup):
    """(figure from codecarbon's files, figure from the snapshot) for one lookup."""
    use(CODECARBON)
    from_files = lookup()
    use(carbon_data.snapshot())
    return from_files, lookup()


@needs_codecarbon
def test_every_country_is_the_same(use) -> None:
    codes = sorted(CODECARBON.json(carbon_data.COUNTRIES))
    assert len(codes) > 200
    for code in codes:
        files, snap = both(use, lambda: intensity.country_intensity(code))  # noqa: B023
        assert snap.g_per_kwh == files.g_per_kwh and snap.scope == files.scope, code
        assert files.source.endswith(f"grid average, codecarbon {CODECARBON.version} data")
        assert snap.source.endswith(f"grid average, energyprof's snapshot of codecarbon {CODECARBON.version} data "
                                    f"({carbon_data.snapshot().snapshot_date})")


def _regions() -> list[tuple[str, str]]:
    use_files = carbon_data.active
    carbon_data.active = lambda: CODECARBON
    try:
        return sorted({(iso, key) for iso in intensity.REGIONAL_COUNTRIES for key in intensity._regions_of(iso).values()})
    finally:
        carbon_data.active = use_files


@needs_codecarbon
def test_every_region_is_the_same(use) -> None:
    regions = _regions()
    assert {iso for iso, _ in regions} == set(intensity.REGIONAL_COUNTRIES) and len(regions) > 100
    for iso, key in regions:
        files, snap = both(use, lambda: intensity.region_intensity(key, iso))  # noqa: B023
        assert (snap.g_per_kwh, snap.scope, snap.country, snap.region) == \
               (files.g_per_kwh, files.scope, files.country, files.region), (iso, key)
        assert "energyprof's snapshot" in snap.source and "energyprof's snapshot" not in files.source


@needs_codecarbon
def test_every_gcp_region_is_the_same(use) -> None:
    use(CODECARBON)
    regions = sorted(intensity._gcp_regions())
    assert len(regions) > 20 and "europe-west1" in regions
    for region in regions:
        files, snap = both(use, lambda: intensity.lookup(Options(cloud=f"gcp:{region}")))  # noqa: B023
        assert (snap.g_per_kwh, snap.country, snap.cloud) == (files.g_per_kwh, files.country, files.cloud), region


@needs_codecarbon
def test_every_cpu_model_gets_the_same_tdp(use) -> None:
    names = [row["Name"] for row in CODECARBON.csv_rows(carbon_data.CPUS)]
    assert len(names) > 4000
    models = names + ["Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz", "AMD EPYC 7763 64-Core Processor", "Intel Xeon Processor"]
    use(CODECARBON)
    from_files = [model.lookup_tdp(m) for m in models]
    use(carbon_data.snapshot())
    assert [model.lookup_tdp(m) for m in models] == from_files
    assert [hit and hit[0] for hit in from_files[-3:]] == [150.0, 280.0, None]
    assert sum(hit is not None for hit in from_files) >= len(names) - 10  # nearly every table row finds itself


def test_snapshot_records_its_codecarbon_version_and_date() -> None:
    snap = carbon_data.snapshot()
    assert snap.version.startswith("3.3.") and snap.snapshot_date
    assert snap.label == f"energyprof's snapshot of codecarbon {snap.version} data ({snap.snapshot_date})"
    assert intensity.WORLD_AVERAGE_G_PER_KWH == snap.json(carbon_data.PER_SOURCE)["world_average"]


def test_without_codecarbon_the_snapshot_is_used(monkeypatch) -> None:
    """find_spec sees no codecarbon (as in `pip install energyprof`): France still has its figure."""
    monkeypatch.setitem(sys.modules, "codecarbon", None)
    carbon_data.codecarbon.cache_clear()
    try:
        assert carbon_data.codecarbon() is None and carbon_data.active() is carbon_data.snapshot()
        fra = intensity.country_intensity("FRA")
        assert fra.g_per_kwh == 56.039 and "energyprof's snapshot of codecarbon 3.3." in fra.source
        assert intensity.region_intensity("california").country == "USA"
    finally:
        carbon_data.codecarbon.cache_clear()
