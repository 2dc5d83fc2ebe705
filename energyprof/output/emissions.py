"""codecarbon's emissions log: one row per run (and per window, if asked) appended to an emissions.csv.

The columns are codecarbon's own (its EmissionsData, in its order) and so are the units: duration in
seconds, emissions in kg CO2eq, emissions_rate in kg/s, powers in W (mean over the span), energies in
kWh, PUE applied to powers and energies as codecarbon applies it. The energy is the program's (the
report's headline, under the profile's idle policy); the carbon is the report's figure for it.
Columns energyprof has no figure for are left empty (NaN to pandas), never guessed.
"""

from __future__ import annotations

import csv
import datetime as _dt
import os
import uuid
from typing import TYPE_CHECKING, Any

from ..carbon.intensity import J_PER_KWH

if TYPE_CHECKING:
    from ..analysis.report import ReportModel

# codecarbon 3.x's EmissionsData fields, in its order: the file's header.
COLUMNS = ("timestamp", "project_name", "run_id", "experiment_id", "duration", "emissions", "emissions_rate",
           "cpu_power", "gpu_power", "ram_power", "cpu_energy", "gpu_energy", "ram_energy", "energy_consumed",
           "water_consumed", "country_name", "country_iso_code", "region", "cloud_provider", "cloud_region", "os",
           "python_version", "codecarbon_version", "cpu_count", "cpu_model", "gpu_count", "gpu_model", "longitude",
           "latitude", "ram_total_size", "tracking_mode", "cpu_utilization_percent", "gpu_utilization_percent",
           "ram_utilization_percent", "ram_used_gb", "on_cloud", "pue", "wue")


def _kind(component: str) -> str | None:
    """codecarbon's three hardware columns; other sources (a SoC rail, psys) count in energy_consumed only."""
    c = (component or "").lower()
    if c == "cpu":
        return "cpu"
    if c.startswith("gpu"):
        return "gpu"
    if c in ("ram", "dram"):
        return "ram"
    return None


def _country_name(iso: str | None) -> str:
    if not iso:
        return ""
    try:
        from ..carbon.intensity import _countries

        return str(_countries().get(iso.upper(), {}).get("country_name", ""))
    except Exception:  # noqa: BLE001 - the name is decoration; the code is the key
        return ""


def _run_id(meta: dict[str, Any]) -> str:
    """Stable for one run, so that re-rendering a profile appends the same run_id (a dashboard sees a repeat)."""
    key = f"energyprof:{meta.get('started_at')}:{meta.get('pid')}:{meta.get('command')}"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, key))


def _end_stamp(meta: dict[str, Any], end_s: float) -> str:
    """codecarbon writes the time the span ended, to the second, in local-free ISO form."""
    started = meta.get("started_at")
    try:
        t0 = _dt.datetime.fromisoformat(str(started))
    except (TypeError, ValueError):
        return ""
    return (t0 + _dt.timedelta(seconds=end_s)).strftime("%Y-%m-%dT%H:%M:%S")


def _span(energy_j: dict[str, float], kinds: dict[str, str | None], duration_s: float, pue: float,
          grams: float) -> dict[str, Any]:
    parts = {"cpu": 0.0, "gpu": 0.0, "ram": 0.0}
    for sid, j in energy_j.items():
        kind = kinds.get(sid)
        if kind is not None:
            parts[kind] += j
    row: dict[str, Any] = {"duration": duration_s, "emissions": grams / 1000.0,
                           "emissions_rate": grams / 1000.0 / duration_s if duration_s > 0 else 0.0,
                           "energy_consumed": sum(energy_j.values()) * pue / J_PER_KWH}
    for kind, j in parts.items():
        row[f"{kind}_energy"] = j * pue / J_PER_KWH
        row[f"{kind}_power"] = j * pue / duration_s if duration_s > 0 else 0.0
    return row


def rows(model: ReportModel, windows: bool = False, project_name: str | None = None) -> list[dict[str, Any]]:
    """The run's row, then (with `windows`) one row per window under the same run_id. Pure."""
    from .._version import __version__

    profile, meta = model.profile, model.meta
    figures = model.carbon
    pue = figures.pue if figures is not None else 1.0
    kinds = {s.id: _kind(s.component) for s in model.sources}
    host = meta.get("host") if isinstance(meta.get("host"), dict) else {}
    gpus = [s for s in model.sources if kinds.get(s.id) == "gpu"]
    gpu_models = sorted({str((s.detail or {}).get("name", "")) for s in gpus if isinstance(s.detail, dict)} - {""})
    cloud = (figures.cloud or "") if figures is not None else ""
    provider, _, cloud_region = cloud.partition(":")
    iso = (figures.country if figures is not None else None) or ""
    memory = host.get("memory_bytes")
    peak = model.memory.peak_rss_exact_bytes or model.memory.peak_rss_bytes
    common: dict[str, Any] = {
        "project_name": project_name or os.path.basename(str(meta.get("target") or "")) or "energyprof",
        "run_id": _run_id(meta), "water_consumed": 0.0,
        "country_name": _country_name(iso), "country_iso_code": iso,
        "region": (figures.region or "") if figures is not None else "",
        "cloud_provider": provider, "cloud_region": cloud_region,
        "os": str(host.get("platform", "")), "python_version": str(meta.get("python", "")),
        "codecarbon_version": f"energyprof-{__version__}",
        "cpu_count": host.get("cores", ""), "cpu_model": str(host.get("cpu_model", "") or ""),
        "gpu_count": len(gpus), "gpu_model": ", ".join(gpu_models), "longitude": "", "latitude": "",
        "ram_total_size": memory / 2**30 if memory else "",
        "tracking_mode": "machine" if model.policy == "all" else "process",
        "cpu_utilization_percent": "", "gpu_utilization_percent": "", "ram_utilization_percent": "",
        "ram_used_gb": peak / 2**30 if peak else "",  # the program's measured peak RSS
        "on_cloud": "Y" if provider else "N", "pue": pue, "wue": 0.0,
    }
    program = profile.totals.attributed_j
    run = dict(common, timestamp=_end_stamp(meta, model.duration_s), experiment_id="",
               **_span(program, kinds, model.duration_s, pue, figures.program_g if figures is not None else 0.0))
    out = [run]
    if not windows:
        return out
    for row in model.windows:
        w = row.window
        energy = w.program_energy_j or w.energy_j
        grams = figures.grams(energy) if figures is not None else 0.0
        machine = w.total_j
        if figures is not None and figures.time_series and row.carbon_g is not None and machine > 0:
            grams = row.carbon_g * sum(energy.values()) / machine  # the report's figure, at the window's own intensity
        label = w.name if w.index is None else f"{w.name}[{w.index}]"
        if w.rank is not None:
            label += f"@rank{w.rank}"
        out.append(dict(common, timestamp=_end_stamp(meta, w.end_s), experiment_id=label,
                        **_span(energy, kinds, w.time_s, pue, grams)))
    return out


def _text(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return "" if value is None else str(value)


def check_header(path: str) -> list[str] | None:
    """The header of an existing, non-empty emissions.csv (None: new or empty). A file with other
    columns is refused (codecarbon would move it aside): ValueError with one line."""
    from ..store.files import check_link

    check_link(path)  # the header of a file behind another user's link is not read either
    if not (os.path.isfile(path) and os.path.getsize(path) > 0):
        return None
    with open(path, newline="", encoding="utf-8") as f:
        header = next(csv.reader(f), None)
    if header is not None and sorted(header) != sorted(COLUMNS):
        extra = sorted(set(header) - set(COLUMNS))
        missing = sorted(set(COLUMNS) - set(header))
        raise ValueError(f"{path} is not a codecarbon emissions.csv of this schema (its header lacks "
                         f"{', '.join(missing[:4]) or 'nothing'}; has {', '.join(extra[:4]) or 'nothing'} more): "
                         "left untouched")
    return header


def append(path: str, new_rows: list[dict[str, Any]]) -> None:
    """Append to an emissions.csv in the file's own column order, writing the header if the file is new.
    Written as every output is (store/files.py): another user's link in a shared sticky folder is not
    followed, and a FIFO never blocks the run's end."""
    import io

    from ..store.files import append_text

    header = check_header(path)
    needs_newline = False
    if header is not None:
        with open(path, "rb") as f:  # a last line without its newline would glue our row onto it
            f.seek(-1, os.SEEK_END)
            needs_newline = f.read(1) not in (b"\n", b"\r")
    order = header or list(COLUMNS)
    out = io.StringIO()
    if needs_newline:
        out.write("\n")
    w = csv.writer(out)
    if header is None:
        w.writerow(order)
    for row in new_rows:
        w.writerow([_text(row.get(c, "")) for c in order])
    append_text(path, out.getvalue())
