"""energyprof inside each rank of a distributed job: which rank this is, per-rank output names,
one reader of the node's sensors, and rank 0's gather of the ranks' profiles.

Every rank's supervisor reads the node's sensors and charges its program only its CPU share
of the machine (the other ranks' CPU is "other processes" to it), so the ranks' figures never
overlap. The node's machine energy is taken once, when the ranks' profiles are joined
(core/merge.py): from the rank elected reader of the node, whose readings span the longest.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from ..record import record, replace

PLACEHOLDERS = ("rank", "local_rank", "node", "pid")
GATHER_TIMEOUT_S = 10.0  # how long rank 0 waits for the other ranks' profiles after its program ended
GATHER_ENV = "ENERGYPROF_GATHER_TIMEOUT"


# (rank, world size, local rank) as other launchers name them: SLURM's srun, Open MPI's and MPICH's mpirun
LAUNCHER_VARS = (("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
                 ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                 ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"))


@record(frozen=True)
class RankInfo:
    """One rank of a job, from the launcher's environment (torchrun's or SLURM's)."""

    rank: int
    local_rank: int
    world_size: int
    node: str  # the node's index in the job (GROUP_RANK, SLURM_NODEID)
    host: str
    job: str  # what all ranks of one job share (torchrun's run id, SLURM's job id, the rendezvous address)
    local_world_size: int = 1  # the ranks on this node (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE)

    def to_meta(self, reader: bool) -> dict[str, Any]:
        return {"mode": "per-rank", "rank": self.rank, "local_rank": self.local_rank,
                "world_size": self.world_size, "local_world_size": self.local_world_size, "node": self.node,
                "host": self.host, "job": self.job, "reader": reader}


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None and value.strip() else None
    except ValueError:
        return None


def rank_info(env: Mapping[str, str], command_form: bool = False) -> RankInfo | None:
    """This process as one rank of a job of several, or None.

    torchrun's variables (RANK, WORLD_SIZE) always count; SLURM's (SLURM_PROCID, SLURM_NTASKS)
    only when energyprof runs a Python program itself: `srun ... energyprof -- torchrun` is one
    task per node that wraps a launcher, not a rank.
    """
    rank, world, local = _int(env.get("RANK")), _int(env.get("WORLD_SIZE")), _int(env.get("LOCAL_RANK"))
    for names in LAUNCHER_VARS:
        if (rank is not None and world is not None) or command_form:
            break
        rank, world, local = (_int(env.get(n)) for n in names)
    if rank is None or world is None or world <= 1 or not 0 <= rank < world:
        return None
    job = env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID") or \
        f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    local_world = _int(env.get("LOCAL_WORLD_SIZE")) or _int((env.get("SLURM_NTASKS_PER_NODE") or "").split("(")[0]) \
        or _int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE")) or 1
    return RankInfo(rank=rank, local_rank=local if local is not None else rank, world_size=world,
                    node=node_index(env), host=hostname(), job=job, local_world_size=local_world)


def hostname() -> str:
    """The host name, as socket.gethostname() gives it: on Linux and macOS both read the kernel's
    node name, which os.uname() returns without the `socket` module's import (2.5 ms of every run)."""
    return os.uname().nodename


def node_index(env: Mapping[str, str]) -> str:
    return env.get("GROUP_RANK") or env.get("SLURM_NODEID") or "0"


def placeholder_values(env: Mapping[str, str], info: RankInfo | None, pid: int) -> dict[str, str]:
    """What each placeholder stands for here, each made safe to put in a file name."""
    if info is not None:
        raw = {"rank": str(info.rank), "local_rank": str(info.local_rank), "node": info.node, "pid": str(pid)}
    else:
        raw = {"rank": env.get("RANK", "0"), "local_rank": env.get("LOCAL_RANK", "0"), "node": node_index(env),
               "pid": str(pid)}
    return {k: safe_part(v) for k, v in raw.items()}


def safe_part(value: str) -> str:
    """A value from the environment as one plain file-name part: it can never name a folder
    (`x/../..` is `x_.._..`), an absolute path, or `.`/`..`."""
    out = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_" for c in value)
    return "_" if out in ("", ".", "..") else out


def expand(path: str, values: Mapping[str, str]) -> str:
    """`{rank}`, `{local_rank}`, `{node}` and `{pid}` replaced; any other brace is the user's."""
    for name in PLACEHOLDERS:
        path = path.replace("{" + name + "}", safe_part(values.get(name, "0")))
    return path


def expand_outputs(options: Any, env: Mapping[str, str], pid: int, names: tuple[str, ...]) -> Any:
    """The options (a record) with the placeholders of every output path named in `names`
    expanded, for the in-process profiles (decorator, with-block, Profiler)."""
    values = placeholder_values(env, rank_info(env), pid)
    changes = {n: expand(getattr(options, n), values) for n in names
               if isinstance(getattr(options, n, None), str) and "{" in getattr(options, n)}
    return replace(options, **changes) if changes else options


def per_rank(path: str) -> str:
    """The rank's own name for an output: `p.json` -> `p.rank{rank}.json`, unless the path
    already names the rank."""
    if "{rank}" in path or (os.path.exists(path) and not os.path.isfile(path)):
        return path  # named per rank already, or a sink (/dev/null, a FIFO) the ranks may share
    head, name = os.path.split(path)
    stem, dot, suffix = name.rpartition(".")
    if not dot or not stem:
        return os.path.join(head, f"{name}.rank{{rank}}")
    return os.path.join(head, f"{stem}.rank{{rank}}.{suffix}")


def job_name(path: str) -> str:
    """The job's own name for an output whose name was given per rank: `p{rank}.json` -> `pjob.json`."""
    return path.replace("{rank}", "job")


class NodeReader:
    """The election of one rank per node as the reader of its node-level sensors: whoever holds
    an exclusive lock on a file in the output folder. The lock dies with its process, so a
    killed rank never leaves a stale one."""

    def __init__(self, folder: str, info: RankInfo) -> None:
        self.path = os.path.join(folder or ".", f".energyprof-node{info.node}.reader.lock")
        self.fd: int | None = None
        self.elected = False
        try:
            import fcntl

            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except (ImportError, OSError):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return
        self.fd, self.elected = fd, True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def find_rank_files(template: str, values: Mapping[str, str], rank: int) -> list[str]:
    """The files a rank may have written under the per-rank `template` (placeholders other than
    {rank} are the other rank's own: matched by any name)."""
    import glob  # a distributed job's join only

    pattern = glob.escape(template)
    pattern = pattern.replace("{rank}", str(rank))
    for name in ("local_rank", "node", "pid"):
        pattern = pattern.replace("{" + name + "}", "*")
    return sorted(glob.glob(pattern))


STORE_PREFIX = "energyprof/"


def job_store(env: Mapping[str, str], timeout_s: float) -> Any:
    """A client of the job's own torch.distributed store, where it certainly outlives the ranks:
    torchrun's agent hosts it (TORCHELASTIC_USE_AGENT_STORE) until every rank has exited. A
    store hosted by the program's rank 0 may be gone, or going, when energyprof asks: then the
    shared output folder serves alone. None when there is none (or torch is not installed)."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() not in ("true", "1"):
        return None
    addr, port = env.get("MASTER_ADDR"), _int(env.get("MASTER_PORT"))
    if not addr or port is None:
        return None
    try:
        import datetime

        from torch.distributed import TCPStore

        return TCPStore(addr, port, is_master=False, wait_for_workers=False,
                        timeout=datetime.timedelta(seconds=max(1.0, timeout_s)))
    except Exception:  # noqa: BLE001 - no store: the folder is the way
        return None


def _key(info: RankInfo, rank: int) -> str:
    return f"{STORE_PREFIX}{info.job}/rank{rank}"


def publish(store: Any, info: RankInfo, profile_json: str) -> bool:
    """This rank's profile for rank 0, through the job's store."""
    try:
        store.set(_key(info, info.rank), profile_json)
        return True
    except Exception:  # noqa: BLE001 - the folder still has the file
        return False


def gather(template: str, values: Mapping[str, str], info: RankInfo, since_wall: float,
           timeout_s: float, store: Any = None) -> dict[int, tuple[Any, str]]:
    """The other ranks' profiles of this job: rank -> (Profile, how it came), through the job's
    store where there is one and from the files under the per-rank `template` in the shared
    folder, waiting at most `timeout_s` for those not yet written (this rank excluded)."""
    from ..facts.profile import Profile
    from ..facts.profile import ProfileFormatError
    from ..facts.profile import load

    def ours(p: Any, r: int) -> bool:
        d = p.known_meta.distributed
        return d is not None and d.get("job") == info.job and d.get("rank") == r

    found: dict[int, tuple[Any, str]] = {}
    deadline = time.monotonic() + max(0.0, timeout_s)
    while True:
        for r in range(info.world_size):
            if r == info.rank or r in found:
                continue
            if store is not None:
                try:
                    if store.check([_key(info, r)]):
                        import json

                        p = Profile.from_dict(json.loads(store.get(_key(info, r)).decode("utf-8")))
                        if ours(p, r):
                            found[r] = (p, "torch.distributed store")
                            continue
                except Exception:  # noqa: BLE001 - the store went away: the folder is left
                    store = None
            for path in find_rank_files(template, values, r):
                try:
                    if os.stat(path).st_mtime < since_wall - 1.0:
                        continue  # an earlier job's file
                    p = load(path)
                except (OSError, ProfileFormatError):
                    continue
                if ours(p, r):
                    found[r] = (p, "shared folder")
                    break
        if len(found) == info.world_size - 1 or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


def gather_timeout(env: Mapping[str, str]) -> float:
    value = env.get(GATHER_ENV)
    try:
        return max(0.0, float(value)) if value else GATHER_TIMEOUT_S
    except ValueError:
        return GATHER_TIMEOUT_S


def _visible(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def gpu_ties(sources: list[Any], processes: list[Any], visible: Mapping[int, str],
             own_visible: str | None, nvml_pids: Mapping[str, set[int]] | None = None) -> dict[str, dict[str, Any]]:
    """{source id: {rank, pid, tied_by}}: each GPU source `gpu:N` (N: the index CUDA gives it in
    energyprof's process) tied to the rank that uses it. The rank's CUDA device is its LOCAL_RANK,
    counted among the devices its own CUDA_VISIBLE_DEVICES leaves it. Where NVML listed the compute
    processes of a device, the tie must agree with it (a rank NVML never saw on it is not tied).
    Sources and processes are records or dicts (the ledger's, before the Profile is built)."""
    def get(x: Any, key: str) -> Any:
        return x.get(key) if isinstance(x, Mapping) else getattr(x, key, None)

    ties: dict[str, dict[str, Any]] = {}
    ranks = [p for p in processes if get(p, "rank") is not None and get(p, "role") in ("rank", "main")]
    if not ranks:
        return ties
    mine = _visible(own_visible)
    for s in sources:
        comp = str(get(s, "component") or get(s, "id"))
        if not comp.startswith("gpu:") or not comp[4:].isdigit():
            continue
        index = int(comp[4:])
        # The device as a CUDA_VISIBLE_DEVICES entry would name it.
        name = mine[index] if mine is not None and index < len(mine) else str(index)
        for p in ranks:
            pid, local = get(p, "pid"), get(p, "local_rank")
            theirs = _visible(visible.get(pid))
            local = local if local is not None else 0
            uses = (theirs[local] == name) if theirs is not None and local < len(theirs) else \
                (theirs is None and local == index)
            if not uses:
                continue
            seen = None if nvml_pids is None else nvml_pids.get(get(s, "id"))
            if seen and pid not in seen:
                continue
            ties[get(s, "id")] = {"rank": get(p, "rank"), "pid": pid,
                                  "tied_by": ("CUDA_VISIBLE_DEVICES" if theirs is not None else "LOCAL_RANK")
                                  + (" and NVML's process list" if seen else "")}
            break
    return ties
