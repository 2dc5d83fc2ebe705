"""Grid carbon intensity: where a figure comes from (country, region, cloud region, a given value,
a time series) and the lookup of each in codecarbon's data.

The tables come from carbon_data: codecarbon's own files when the `[carbon]` extra is installed,
else energyprof's snapshot of them, and each figure's source names which. codecarbon is never
imported (it pulls in its trackers, `requests`, pandas and pynvml), so no codecarbon code runs
inside a profiled process, nothing touches the network, and nothing guesses the location: the
user names it or gets the world average, labelled as such.

The arithmetic codecarbon applies to its regional files (lbs/MWh for US states, a fossil
mix for Canadian provinces) is reproduced here; tests/test_carbon.py checks every kind of
lookup against codecarbon's own `Emissions` API so a codecarbon upgrade that changes either
the data layout or the arithmetic fails loudly.
"""

from __future__ import annotations

import bisect
import math
import re
from typing import TYPE_CHECKING, Any, Protocol

from ..record import record
from . import data as carbon_data

if TYPE_CHECKING:
    from pathlib import Path


class Where(Protocol):
    """What a lookup reads of the run's options (setup/options.py's Options has these fields)."""

    country: str | None
    region: str | None
    cloud: str | None
    carbon_intensity: float | None
    carbon_intensity_trace: str | None

J_PER_KWH = 3.6e6
#: codecarbon's world average (data/private_infra/carbon_intensity_per_source.json, which
#: cites the IEA Global Energy & CO2 Status Report 2019); kept here so the default needs no data.
WORLD_AVERAGE_G_PER_KWH = 475.0
WORLD_AVERAGE_SOURCE = "world average (no location given)"
WORLD_AVERAGE_SCOPE = ("global average grid intensity, 475 gCO2eq/kWh, from the IEA Global Energy & CO2 "
                       "Status Report 2019 as used by codecarbon; name a location for a better figure")
PER_NODE_TRACE = "energy-weighted mean intensity of the run"

# codecarbon 3.3: the countries with regional files, and the Nordic bidding zones per country.
_NORDIC = {"SWE": {"SE1", "SE2", "SE3", "SE4"}, "NOR": {"NO1", "NO2", "NO3", "NO4", "NO5"}, "FIN": {"FI"}}
_CHINA_SUFFIX = r"\s+(autonomous region|municipality|province|sheng|shi|zizhiqu)$"  # compiled by a region's lookup
# codecarbon.core.units.EmissionsPerKWh.LBS_MWH_TO_KG_KWH, times 1000 for grams.
_LBS_PER_MWH_TO_G_PER_KWH = 0.45359237
# codecarbon.core.emissions.Emissions._region_energy_mix_to_emissions_rate (kg/kWh per fuel),
# itself from github.com/responsibleproblemsolving/energy-usage#conversion-to-co2.
_CANADA_FUEL_KG_PER_KWH = {"coal": 0.995725971, "petroleum": 0.8166885263, "naturalGas": 0.7438415916}


@record(frozen=True)
class Intensity:
    """One grid intensity figure and where it came from, as shown in the report."""

    g_per_kwh: float
    source: str
    scope: str
    country: str | None = None
    region: str | None = None
    cloud: str | None = None


# --- the tables: codecarbon's files when installed, else energyprof's snapshot of them ---------

def _json(relative: str) -> Any:
    return carbon_data.active().json(relative)


def _gcp_regions() -> dict[str, dict[str, str]]:
    rows = carbon_data.active().csv_rows(carbon_data.CLOUD)
    return {r["region"].strip().lower(): r for r in rows if r.get("provider", "").strip().lower() == "gcp"}


def _countries() -> dict[str, dict[str, Any]]:
    return _json(carbon_data.COUNTRIES)


def _data_label() -> str:
    """Which tables gave the figure, for the report's methodology."""
    return carbon_data.active().label


# --- lookups --------------------------------------------------------------------------------

def country_intensity(code: str) -> Intensity:
    """A country's grid intensity by ISO 3166 alpha-3 code (e.g. FRA), from codecarbon's table."""
    iso = code.strip().upper()
    mix = _countries().get(iso)
    if mix is None:
        hint = " (use the 3-letter ISO 3166 code, e.g. FRA, USA, DEU)" if len(iso) != 3 else ""
        raise ValueError(f"--country {code}: unknown country code; codecarbon has no grid data for it{hint}")
    value = mix.get("carbon_intensity")
    if value is None:  # codecarbon 3.3 has a figure for all 213 countries; older data did not
        raise ValueError(f"--country {code}: codecarbon has no carbon intensity for {mix.get('country_name', iso)}; "
                         "give --carbon-intensity G_PER_KWH")
    year = mix.get("year")
    return Intensity(
        float(value), f"{mix.get('country_name', iso)} ({iso}) grid average, {_data_label()}",
        "lifecycle gCO2eq per kWh generated"
        + (f" in {year}" if year else "") + " (codecarbon's global_energy_mix.json: Our World in Data / Ember)",
        country=iso,
    )


def _regions_of(country: str) -> dict[str, str]:
    """{lower-case name a user may type: canonical region} for one country with regional data."""
    out: dict[str, str] = {}
    if country == "USA":
        for name, row in _json(carbon_data.USA).items():
            if name.startswith("_"):
                continue
            out[name.lower()] = name
            if isinstance(row, dict) and row.get("regionCode"):
                out[str(row["regionCode"]).lower()] = name
    elif country == "CAN":
        out = {name.lower(): name for name in _json(carbon_data.CANADA)}
    elif country in _NORDIC:
        zones = _json(carbon_data.NORDIC)["data"]
        out = {z.lower(): z for z in zones if z in _NORDIC[country]}
    elif country == "CHN":
        for key, row in _json(carbon_data.CHINA)["data"].items():
            out[key.lower()] = key
            for name in row.get("names", []):
                out[name.lower()] = key
    return out


REGIONAL_COUNTRIES = ("USA", "CAN", "CHN", "SWE", "NOR", "FIN")


def _normalise_region(region: str) -> str:
    name = " ".join(region.strip().lower().replace("_", " ").split())
    return re.sub(_CHINA_SUFFIX, "", name)


def region_intensity(region: str, country: str | None = None) -> Intensity:
    """A region's intensity where codecarbon has regional data (US states, Canadian provinces,
    Chinese provinces, Nordic bidding zones). Without a country, the region name picks it."""
    wanted = _normalise_region(region)
    if country is not None:
        iso = country.strip().upper()
        if iso not in _countries():
            country_intensity(iso)  # raises the unknown-country error
        if iso not in REGIONAL_COUNTRIES:
            raise ValueError(f"--region {region}: codecarbon has no regional data for {iso} "
                             f"(it has some for {', '.join(REGIONAL_COUNTRIES)}); use --country alone")
        candidates = [iso]
    else:
        candidates = list(REGIONAL_COUNTRIES)
    found = [(iso, _regions_of(iso)[wanted]) for iso in candidates if wanted in _regions_of(iso)]
    if not found:
        where = candidates[0] if len(candidates) == 1 else "any country codecarbon has regional data for"
        raise ValueError(f"--region {region}: unknown region for {where} "
                         "(e.g. california, quebec, SE3, beijing)")
    if len(found) > 1:
        raise ValueError(f"--region {region}: ambiguous ({', '.join(i for i, _ in found)}); add --country")
    iso, key = found[0]
    return _regional(iso, key)


def _regional(iso: str, key: str) -> Intensity:
    if iso == "USA":
        data = _json(carbon_data.USA)
        src = data.get("_source", {})
        g = float(data[key]["emissions"]) * _LBS_PER_MWH_TO_G_PER_KWH
        return Intensity(g, f"{key} (USA), {_data_label()}: {src.get('name', 'EPA eGRID')}",
                         "combustion only: CO2-equivalent emitted at the power plants per kWh generated "
                         f"(EPA eGRID {src.get('year', '')}, field {src.get('field', '?')}); excludes "
                         "upstream and lifecycle emissions", country=iso, region=key)
    if iso == "CAN":
        mix = _json(carbon_data.CANADA)[key]
        kg = sum(mix[f] / mix["total"] * k for f, k in _CANADA_FUEL_KG_PER_KWH.items())
        return Intensity(kg * 1000.0, f"{key} (CAN), {_data_label()}: provincial generation mix",
                         "combustion only: fossil share of the provincial generation mix times combustion "
                         "factors for coal, oil and gas (codecarbon's method); low-carbon sources count as 0",
                         country=iso, region=key)
    if iso in _NORDIC:
        data = _json(carbon_data.NORDIC)
        row = data["data"][key]
        return Intensity(float(row["emission_factor"]), f"{key} ({iso}), {_data_label()}: "
                         f"{row.get('description', 'Nordic bidding zone')}",
                         "production-based generation mix times codecarbon's per-source factors (mostly "
                         f"lifecycle), year {row.get('year', '?')}", country=iso, region=key)
    row = _json(carbon_data.CHINA)["data"][key]
    return Intensity(float(row["emission_factor"]), f"{row.get('description', key)} (CHN), {_data_label()}: "
                     "MEE/NBS provincial factor", "CO2 only (not CO2eq), operational, location-based, "
                     f"year {row.get('year', '?')}", country="CHN", region=key)


def parse_cloud(spec: str) -> tuple[str, str]:
    """'gcp:europe-west1' -> ('gcp', 'europe-west1')."""
    provider, sep, region = spec.partition(":")
    provider, region = provider.strip().lower(), region.strip().lower()
    if not sep or not provider or not region or ":" in region:
        raise ValueError(f"--cloud {spec}: expected PROVIDER:REGION, e.g. gcp:europe-west1")
    if provider not in ("gcp", "aws", "azure"):
        raise ValueError(f"--cloud {spec}: unknown provider {provider!r} (gcp, aws or azure)")
    return provider, region


def cloud_intensity(spec: str, country: str | None = None) -> Intensity:
    """A cloud region's intensity: GCP regions from codecarbon's table; AWS and Azure publish
    none there, so they need --country (we never guess a country from a region name)."""
    provider, region = parse_cloud(spec)
    if provider == "gcp":
        row = _gcp_regions().get(region)
        if row is None:
            raise ValueError(f"--cloud {spec}: unknown GCP region (e.g. europe-west1, us-central1)")
        where = row.get("city") or row.get("state") or row.get("country_name", "")
        return Intensity(float(row["impact"]), f"GCP {region} ({where}), {_data_label()}: {row.get('source', '')}",
                         "Google Cloud's published average grid intensity for the region (location-based)",
                         country=(row.get("countryIsoCode") or None), cloud=f"gcp:{region}")
    if country is None:
        raise ValueError(f"--cloud {spec}: codecarbon has no intensity for {provider.upper()} regions; "
                         "add --country ISO3 for the region's country")
    base = country_intensity(country)
    return Intensity(base.g_per_kwh, f"{base.source} (no per-region figure for {provider.upper()} {region})",
                     base.scope, country=base.country, cloud=f"{provider}:{region}")


def lookup(options: Where) -> Intensity:
    """The intensity the options ask for (ignoring a trace), most specific first."""
    if options.carbon_intensity is not None:
        return Intensity(float(options.carbon_intensity), "given (--carbon-intensity)", "as given by the user",
                         country=options.country, region=options.region, cloud=options.cloud)
    if options.cloud is not None:
        return cloud_intensity(options.cloud, options.country)
    if options.region is not None:
        return region_intensity(options.region, options.country)
    if options.country is not None:
        return country_intensity(options.country)
    return Intensity(WORLD_AVERAGE_G_PER_KWH, WORLD_AVERAGE_SOURCE, WORLD_AVERAGE_SCOPE)


# --- intensity trace ------------------------------------------------------------------------

@record(frozen=True)
class IntensityTrace:
    """A step function of wall time: each row holds until the next; before the first row, the first."""

    t: list[float]  # unix seconds, strictly increasing
    g_per_kwh: list[float]

    def at(self, t: float) -> float:
        k = bisect.bisect_right(self.t, t) - 1
        return self.g_per_kwh[max(k, 0)]

    def mean(self, a: float, b: float) -> float:
        """Time-average over [a, b]: exact for power that is constant within the interval."""
        if b <= a:
            return self.at(a)
        total, t = 0.0, a
        k = max(bisect.bisect_right(self.t, a) - 1, 0)
        while t < b:
            end = min(b, self.t[k + 1]) if k + 1 < len(self.t) else b
            total += self.g_per_kwh[k] * (end - t)
            t = end
            k += 1
        return total / (b - a)


# compiled by the first time read (re caches it): only an intensity trace is aligned by the run's start
_UTC_ISO = r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{6}))?\+00:00"
_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _utc_iso_seconds(text: str) -> float | None:
    """Seconds since the epoch of `YYYY-MM-DDTHH:MM:SS[.ffffff]+00:00`, the form a profile's
    `started_at` is written in, exactly as `datetime.fromisoformat(text).timestamp()` gives them
    (every report reads one: `datetime`'s import, 1 ms, is left to other forms). None for any other text."""
    m = re.fullmatch(_UTC_ISO, text, re.ASCII)
    if m is None:
        return None
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    leap = y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
    if not (1 <= y and 1 <= mo <= 12 and 1 <= d <= _MONTH_DAYS[mo - 1] + (mo == 2 and leap) and h < 24 and mi < 60
            and s < 60):
        return None
    yy = y - (mo <= 2)  # days from 1970-01-01 to the date (the proleptic Gregorian calendar, as datetime's)
    era = yy // 400
    yoe = yy - era * 400
    doy = (153 * (mo + (-3 if mo > 2 else 9)) + 2) // 5 + d - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    seconds = ((days * 24 + h) * 60 + mi) * 60 + s
    return (seconds * 1_000_000 + int(m.group(7) or 0)) / 1_000_000  # int / int: rounded once, as timedelta's


def _parse_time(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    fast = _utc_iso_seconds(text)
    if fast is not None:
        return fast
    import datetime as _dt  # any other ISO 8601 form: an intensity trace's
    import re

    text = text[:-1] + "+00:00" if text.endswith("Z") else text
    # Python 3.10 reads 3 or 6 digits of a second's fraction only
    text = re.sub(r"(:\d\d)[.,](\d+)", lambda m: m.group(1) + "." + (m.group(2) + "00000")[:6], text, count=1)
    value = _dt.datetime.fromisoformat(text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)  # documented: naive timestamps are UTC
    return value.timestamp()


def load_trace(path: str | Path) -> IntensityTrace:
    """Read `timestamp,g_per_kwh` (header optional; ISO 8601 or unix seconds; naive = UTC)."""
    import csv  # only for a trace: not on every run's path

    label = f"--carbon-intensity-trace {path}"
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            # (line number, cells) for non-blank lines, so errors point at the file's own lines
            rows = [(n, r) for n, r in enumerate(csv.reader(fh), start=1) if r and any(c.strip() for c in r)]
    except OSError as exc:
        raise ValueError(f"{label}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{label}: not a text CSV file") from None
    except csv.Error as exc:
        raise ValueError(f"{label}: not a CSV file ({exc})") from None
    if rows and [c.strip().lower() for c in rows[0][1]] == ["timestamp", "g_per_kwh"]:
        rows = rows[1:]
    if not rows:
        raise ValueError(f"{label}: no rows (expected timestamp,g_per_kwh)")
    times: list[float] = []
    values: list[float] = []
    for lineno, row in rows:
        if len(row) != 2:
            raise ValueError(f"{label} line {lineno}: expected 2 columns timestamp,g_per_kwh, got {len(row)}")
        try:
            t = _parse_time(row[0])
        except (ValueError, OverflowError):
            raise ValueError(f"{label} line {lineno}: {row[0].strip()!r} is not an ISO 8601 time or unix seconds") from None
        try:
            g = float(row[1])
        except ValueError:
            raise ValueError(f"{label} line {lineno}: {row[1].strip()!r} is not a number") from None
        if not math.isfinite(t) or not math.isfinite(g) or g < 0:
            raise ValueError(f"{label} line {lineno}: values must be finite and the intensity >= 0")
        if times and t <= times[-1]:
            raise ValueError(f"{label} line {lineno}: timestamps must increase")
        times.append(t)
        values.append(g)
    return IntensityTrace(times, values)


# --- validation and application -------------------------------------------------------------

def validate(options: Where) -> None:
    """Fail before the program runs on anything a lookup would fail on later."""
    if options.carbon_intensity_trace is not None:
        load_trace(options.carbon_intensity_trace)
    if options.country is not None:
        country_intensity(options.country)
    if options.cloud is not None:
        if options.carbon_intensity is None:
            cloud_intensity(options.cloud, options.country)
        else:
            parse_cloud(options.cloud)
    if options.region is not None:
        region_intensity(options.region, options.country)

