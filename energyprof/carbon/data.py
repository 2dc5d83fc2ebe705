"""The tables behind carbon intensity and CPU TDP lookups: codecarbon's data files when codecarbon
is installed (the `[carbon]` extra), else energyprof's compact snapshot of them.

The snapshot (`energyprof/data/carbon-snapshot.json`, written by scripts/snapshot-carbon-data.py)
holds exactly the files and fields the lookups read, with codecarbon's raw values unchanged (JSON
numbers and CSV strings as codecarbon stores them), so both sources go through the same
arithmetic and give the same numbers; tests/test_carbon.py checks that lookup by lookup.

codecarbon's folder is found with `importlib.util.find_spec`, which does not execute the package:
`import codecarbon` would pull in its trackers, requests, pandas and pynvml.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

SNAPSHOT = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "data", "carbon-snapshot.json")
SNAPSHOT_FORMAT = 1

# What the lookups read, and which fields of each (None: the whole entry).
COUNTRIES = "private_infra/global_energy_mix.json"
USA = "private_infra/2023/usa_emissions.json"
CANADA = "private_infra/2023/canada_energy_mix.json"
NORDIC = "private_infra/nordic_emissions.json"
CHINA = "private_infra/2023/china_provincial_emissions.json"
PER_SOURCE = "private_infra/carbon_intensity_per_source.json"
CLOUD = "cloud/impact.csv"
CPUS = "hardware/cpu_power.csv"
_COUNTRY_FIELDS = ("country_name", "carbon_intensity", "year")
_CANADA_FIELDS = ("coal", "petroleum", "naturalGas", "total")
_ZONE_FIELDS = ("emission_factor", "description", "year", "names")
_CLOUD_FIELDS = ("provider", "region", "country_name", "countryIsoCode", "state", "city", "impact", "source")


class CarbonData:
    """One set of tables: `json(relative)` and `csv_rows(relative)` by codecarbon's own file names."""

    def __init__(self, label: str, version: str, json_files: dict[str, Any], csv_files: dict[str, list[dict[str, str]]],
                 snapshot_date: str | None = None, folder: Path | None = None) -> None:
        self.label = label  # how the report names the data: "codecarbon 3.3.2 data" or the snapshot's
        self.version = version
        self.snapshot_date = snapshot_date
        self._json = json_files
        self._csv = csv_files
        self._folder = folder

    def json(self, relative: str) -> Any:
        if relative not in self._json:
            self._json[relative] = _read_json(self._folder, relative) if self._folder is not None else _missing(relative)
        return self._json[relative]

    def csv_rows(self, relative: str) -> list[dict[str, str]]:
        if relative not in self._csv:
            self._csv[relative] = _read_csv(self._folder, relative) if self._folder is not None else _missing(relative)
        return self._csv[relative]


def _missing(relative: str) -> Any:
    raise ValueError(f"energyprof's carbon data snapshot has no {relative}; reinstall energyprof")


def _read_json(folder: Path, relative: str) -> Any:
    try:
        with open(os.path.join(folder, relative), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read codecarbon's {relative}: {exc}") from None


def _read_csv(folder: Path, relative: str) -> list[dict[str, str]]:
    import csv  # codecarbon's own files ([carbon]) only: the snapshot is JSON

    try:
        with open(os.path.join(folder, relative), newline="", encoding="utf-8-sig") as fh:  # impact.csv starts with a BOM
            return list(csv.DictReader(fh))
    except OSError as exc:
        raise ValueError(f"cannot read codecarbon's {relative}: {exc}") from None


def codecarbon_folder() -> Path | None:
    """codecarbon's `data/` folder, or None when codecarbon is not installed."""
    try:
        spec = importlib.util.find_spec("codecarbon")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    from pathlib import Path  # only where codecarbon is installed (pandas then costs far more)

    for loc in spec.submodule_search_locations or []:
        data = Path(loc) / "data"
        if data.is_dir():
            return data
    return None


@functools.cache
def codecarbon() -> CarbonData | None:
    """The installed codecarbon's own files, read lazily, or None."""
    folder = codecarbon_folder()
    if folder is None:
        return None
    import importlib.metadata  # here, not above: its import and a version lookup were ~15 ms of every run's start

    try:
        version = importlib.metadata.version("codecarbon")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown version"
    return CarbonData(f"codecarbon {version} data", version, {}, {}, folder=folder)


@functools.cache
def snapshot() -> CarbonData:
    """energyprof's own copy, shipped in the package."""
    try:
        with open(SNAPSHOT, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read energyprof's carbon data snapshot ({exc}); reinstall energyprof") from None
    version, date = data["codecarbon_version"], data["snapshot_date"]
    return CarbonData(f"energyprof's snapshot of codecarbon {version} data ({date})", version,
                      dict(data["json"]), dict(data["csv"]), snapshot_date=date)


def active() -> CarbonData:
    """codecarbon's files when it is installed (they may be newer), else the snapshot."""
    return codecarbon() or snapshot()


def cpu_table_key() -> str:
    """What names the CPU table that `active()` reads, found without reading it: the file's path,
    size and modification time (codecarbon's hardware/cpu_power.csv, else the snapshot). A cache
    keyed by it is stale as soon as either file changes, and start-up need not ask for codecarbon's
    version or parse the snapshot."""
    folder = codecarbon_folder()
    path = os.path.join(folder, CPUS) if folder is not None else SNAPSHOT
    try:
        st = os.stat(path)
    except OSError:
        return str(path)
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def build_snapshot(source: CarbonData, date: str) -> dict[str, Any]:
    """The snapshot's content: the files and fields the lookups read, values unchanged."""
    per_source = source.json(PER_SOURCE)
    return {
        "format": SNAPSHOT_FORMAT,
        "about": "codecarbon's data files, reduced to what energyprof's lookups read; "
                 "written by scripts/snapshot-carbon-data.py",
        "codecarbon_version": source.version,
        "snapshot_date": date,
        "json": {
            COUNTRIES: {iso: {k: row[k] for k in _COUNTRY_FIELDS if k in row}
                        for iso, row in source.json(COUNTRIES).items()},
            USA: {name: ({k: row[k] for k in ("emissions", "regionCode") if k in row} if not name.startswith("_") else row)
                  for name, row in source.json(USA).items()},
            CANADA: {name: {k: row[k] for k in _CANADA_FIELDS} for name, row in source.json(CANADA).items()},
            NORDIC: _zones(source.json(NORDIC)),
            CHINA: _zones(source.json(CHINA)),
            PER_SOURCE: {"world_average": per_source["world_average"]},
        },
        "csv": {
            CLOUD: [{k: row.get(k, "") for k in _CLOUD_FIELDS} for row in source.csv_rows(CLOUD)
                    if row.get("provider", "").strip().lower() == "gcp"],
            CPUS: [{"Name": row["Name"], "TDP": row["TDP"]} for row in source.csv_rows(CPUS)],
        },
    }


def _zones(data: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": data.get("metadata", {}),
            "data": {key: {k: row[k] for k in _ZONE_FIELDS if k in row} for key, row in data["data"].items()}}
