"""A profile's blocks beyond the tree, typed, and each block's version.

- `IoFact`: the run's I/O, the program's /proc/PID/io counters and each disk's /proc/diskstats counters on
  one clock (seconds from the profile's start), saved under the profile's `io` key. `read_io` checks a
  saved one field by field (files can be crafted); a profile written without it, or where I/O was not
  recorded, has none (`absent` says why).
- `Meta`: the meta's keys energyprof reads back (live_export, page_cache, distributed, settings).
- `BLOCK_VERSIONS`: each block's version, written in every profile (`blocks`) and checked on load, as
  coverage.py checks its data file's schema: a block newer than this energyprof reads is refused in one
  line, naming it; a file without `blocks` (written before they were versioned) is read as version 1."""

from __future__ import annotations

from typing import Any

from ..record import field, record
from .records import ProfileFormatError, integer, number, string

SECTOR = 512  # diskstats counts 512-byte sectors whatever the device's own sector size
BLOCKS_FIELD = "blocks"
# A block's version goes up when its meaning or shape changes in a way an older reader would misread.
BLOCK_VERSIONS = {"meta": 1, "sources": 1, "totals": 1, "nodes": 1, "windows": 1, "timeline": 1, "notes": 1,
                  "processes": 1, "io": 1, "gpu_kernels": 1, "machine_load": 1}


def check_blocks(raw: Any) -> dict[str, int]:
    """The saved profile's block versions (all 1 where it predates them); ProfileFormatError for one newer
    than this energyprof reads, or a damaged table."""
    if raw is None:
        return {name: 1 for name in BLOCK_VERSIONS}
    if not isinstance(raw, dict):
        raise ProfileFormatError(f"blocks must be an object of block: version, not {type(raw).__name__}")
    out = {name: 1 for name in BLOCK_VERSIONS}
    for name, version in raw.items():
        v = integer(version, f"blocks.{name}")
        if v is None or v < 1:
            raise ProfileFormatError(f"blocks.{name} must be a version from 1, not {version!r}")
        known = BLOCK_VERSIONS.get(name)
        if known is not None and v > known:
            raise ProfileFormatError(f"the profile's {name} block is version {v}, newer than this energyprof reads"
                                     f" ({known}): upgrade energyprof")
        out[name] = v
    return out


@record(eq=False)
class IoFact:
    t_s: list[float] = field(default_factory=list)  # each reading's time, seconds from the profile's start
    process: dict[str, list[int]] = field(default_factory=dict)  # the main process's counters (rchar, read_bytes...)
    disks: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # disk -> counter -> readings
    sector_bytes: int = SECTOR
    method: str = "measured"
    counted: str = ""  # which disks are counted, once
    window_edges: int = 0
    edges_thinned: bool = False
    absent: str | None = None  # why there are no readings (not Linux, --io off)

    @property
    def has_readings(self) -> bool:
        return bool(self.t_s)

    def to_dict(self) -> dict[str, Any]:
        if self.absent is not None:
            return {"absent": self.absent}
        out: dict[str, Any] = {"t_s": list(self.t_s), "process": {k: list(v) for k, v in self.process.items()},
                               "disks": {d: {k: list(v) for k, v in c.items()} for d, c in self.disks.items()},
                               "sector_bytes": self.sector_bytes, "method": self.method, "counted": self.counted,
                               "window_edges": self.window_edges}
        if self.edges_thinned:
            out["edges_thinned"] = True
        return out


def read_io(raw: Any) -> IoFact | None:
    """The saved `io` block as an IoFact (None where the profile has none); ProfileFormatError, one line,
    for a damaged one."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ProfileFormatError(f"io must be an object, not {type(raw).__name__}")
    if "t_s" not in raw:
        absent = raw.get("absent")
        return IoFact(absent=string(absent, "io.absent") if absent is not None else "I/O was not recorded")
    t = _series(raw["t_s"], "io.t_s", lambda v, w: number(v, w, nonneg=False))
    process = {string(k, "io.process"): _series(v, f"io.process.{k}", integer)
               for k, v in _object(raw.get("process", {}), "io.process").items()}
    disks = {string(d, "io.disks"): {string(k, f"io.disks.{d}"): _series(v, f"io.disks.{d}.{k}", integer)
                                     for k, v in _object(c, f"io.disks.{d}").items()}
             for d, c in _object(raw.get("disks", {}), "io.disks").items()}
    sector = integer(raw.get("sector_bytes", SECTOR), "io.sector_bytes")
    if not sector or sector <= 0:
        raise ProfileFormatError(f"io.sector_bytes must be positive, not {sector!r}")
    method = string(raw.get("method", "measured"), "io.method")
    return IoFact(t, process, disks, sector, method, string(raw.get("counted", ""), "io.counted"),
                  integer(raw.get("window_edges", 0), "io.window_edges") or 0, bool(raw.get("edges_thinned", False)))


def _object(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ProfileFormatError(f"{where} must be an object, not {type(raw).__name__}")
    return raw


def _series(raw: Any, where: str, each: Any) -> list[Any]:
    """A counter's readings. Shorter than the clock is allowed: a disk that went away, in a profile written
    before disks kept their own readings, is read over the first readings' times (analysis/io.py)."""
    if not isinstance(raw, list):
        raise ProfileFormatError(f"{where} must be a list, not {type(raw).__name__}")
    return [each(v, f"{where}[{i}]") for i, v in enumerate(raw)]


@record(eq=False)
class Meta:
    """The meta's keys that energyprof itself reads back, typed (the rest of the meta is free-form: the
    run's target, command, host...). Each is None where the run had none."""

    live_export: dict[str, Any] | None = None  # what each live sink sent and dropped (output/live/)
    page_cache: list[dict[str, Any]] | None = None  # --watch-cache: residency at the run's start and end
    distributed: dict[str, Any] | None = None  # one rank of several: its rank, world size, how it was gathered
    settings: dict[str, Any] | None = None  # the machine's settings (collect/settings.py)


def read_meta(meta: dict[str, Any]) -> Meta:
    """The known keys of a profile's meta, each checked for its shape; ProfileFormatError, one line, else."""
    live = meta.get("live_export")
    if live is not None:
        sinks = _object(live, "meta.live_export").get("sinks", [])
        if not isinstance(sinks, list) or not all(isinstance(s, dict) for s in sinks):
            raise ProfileFormatError("meta.live_export.sinks must be a list of objects")
    pages = meta.get("page_cache")
    if pages is not None and (not isinstance(pages, list) or not all(isinstance(p, dict) for p in pages)):
        raise ProfileFormatError("meta.page_cache must be a list of objects")
    rank = meta.get("distributed")
    settings = meta.get("settings")
    return Meta(live, pages, _object(rank, "meta.distributed") if rank is not None else None,
                _object(settings, "meta.settings") if settings is not None else None)
