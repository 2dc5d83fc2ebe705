"""The spool's wire format: the one definition of what an agent writes and the supervisor reads.

One append-only file per process, tab-separated text lines; every text field goes through
`esc`, which cannot fail on any `str` (backslash, tab, newline, CR and NUL are escaped; lone
surrogates, which UTF-8 cannot encode, travel as `surrogatepass` bytes and come back as
they were). Records, first field the kind:

    H version pid ppid t_ns forked rank local_rank label command   header, first line
    F fid function file line                               a new frame (local id)
    K sid fid,fid,...                                      a new stack (local id)
    T t0 t1 process_cpu_ns own_cpu_ns rss_bytes .          one sampler tick ...
    s sid cpu_ns main .                                    ... and one line per thread
    u sid cpu_ns main unit .                               ... or, for a thread running a unit of work (a web
                                                           request: agent/units.py's unit_of), with its unit
    W b|e t_ns name index|r                                a window begins / ends (r: reply wanted)
    A function file line bytes                             memory=exact: bytes still allocated at the end
    E t_ns text                                            the program's uncaught exception
    N text                                                 a note for the profile
    L t0 t1 bytes                                          the spool could not be written: this span is lost
    G t_ns                                                 this process uses CUDA (its GPU energy share)
    Z t_ns                                                 the end record: the process ended its stream
    R name                                                 the stream goes on in this file (same folder)
    C sid count                                            how many threads have run under a thread group so far:
                                                           `sid` is the stack that ends at its `[threads: ...]` node
    P label                                                the process's node, once multiprocessing handed it its
                                                           target (a spawn or forkserver child): its header said
                                                           LABEL_PENDING, and `P` with no label means none
    I t_ns rchar,wchar,syscr,syscw,read_bytes,write_bytes name:reads,rsect,writes,wsect,busy_ms;... .
                                                           I/O counters read at a window's edge (t_ns, the
                                                           window's time): the process's /proc/self/io (empty
                                                           where unreadable) and the disks' /proc/diskstats
    Y t0 t1 records cost_ns                                GPU kernels: a profiler cycle reduced (its span, device records,
                                                           the capture's own CPU so far)
    M kid function file line [function file line ...]      GPU kernels: a launch path (local id), outermost frame first
    U kid device bucket_ns b:ns,b:ns,...                   GPU kernels: the path's shared busy ns per bucket in the cycle
    J kid device name count time_ns [name count time_ns ...]  GPU kernels: the path's top kernel names in the cycle
    V reason count [reason count ...]                      GPU kernels: what the cycle could not place or link

The window back-channel (`<spool>/<pid>.windows`, written by the supervisor, read by the
agent) is one line per charged window: `start end estimated ids energy program`, the program's
part under the run's one idle policy, which the supervisor applied: the agent holds no choice.

Ticks and samples end with an empty field (`.` above): a line a failed write cut short (a
full disk) lacks it and is dropped, never charged with a truncated number (`complete`). Other
records that a cut could damage are written again whole, under their own ids.

Times are `time.perf_counter_ns()` (CLOCK_MONOTONIC, one clock for every process).
Standard library only: this module is loaded inside the profiled program.
"""

from __future__ import annotations

VERSION = 2
HEADER, FRAME, STACK, TICK, SAMPLE, WINDOW = "H", "F", "K", "T", "s", "W"
UNIT_SAMPLE = "u"
ALLOC, EXCEPTION, NOTE, LOST, GPU, END, NEXT = "A", "E", "N", "L", "G", "Z", "R"
THREADS, ROLE, IO = "C", "P", "I"
KCYCLE, KPATH, KBUSY, KNAMES, KCOUNTS = "Y", "M", "U", "J", "V"
# A header's label while the process does not yet know what it runs: a multiprocessing child started
# by spawn or forkserver learns its target (a pool's worker loop, say) only after its interpreter
# started, and says so in a ROLE record. Never a node's name (escaped, it travels as `\0`).
LABEL_PENDING = "\0"
SPAWN_MAIN = "from multiprocessing.spawn import spawn_main"  # in the command line of a spawn child, and of none other
SPOOL_SUFFIX = ".spool"
REPLY_SUFFIX = ".windows"
METRICS_FILE = "live-metrics.jsonl"  # the program's log_metrics lines, for the supervisor's live export
MLFLOW_RUN_SUFFIX = ".mlflow-run"  # <pid>.mlflow-run: the program's active MLflow run
ENCODING, ERRORS = "utf-8", "surrogatepass"
# Frames the sampler names itself: a thread group's node, and where a followed child's process node
# goes (a frame with line = its pid; the supervisor puts the node, and for a spawned child the stack
# that started it, there).
THREAD_FRAME_PREFIX = "[threads: "
PROCESS_MARKER = "[process]"
# The variable that hands a process the agent's configuration (supervise/bootstrap.py writes it).
# These live here, not in the sampler, so the supervisor reads them without loading the agent.
ENV = "ENERGYPROF_AGENT"

_ESC = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"}
_UNESC = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r", "0": "\0"}
_SPECIAL = frozenset(_ESC)


def esc(s: str) -> str:
    """One text field: no tab or newline left in it (the record's separators)."""
    if _SPECIAL.isdisjoint(s):
        return s
    return "".join(_ESC.get(c, c) for c in s)


def unesc(s: str) -> str:
    if "\\" not in s:
        return s
    out = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\" and i + 1 < n:
            out.append(_UNESC.get(s[i + 1], s[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def encode(text: str) -> bytes:
    return text.encode(ENCODING, ERRORS)


def decode(data: bytes) -> list[list[str]]:
    """Complete lines to records (no trailing partial line may be passed in)."""
    try:
        text = data.decode(ENCODING, ERRORS)
    except UnicodeDecodeError:  # a damaged line (a write cut short): it costs that line only
        text = data.decode(ENCODING, "replace")
    return [ln.split("\t") for ln in text.split("\n") if ln]


# -- the writer's records ------------------------------------------------------------------
def header(pid: int, ppid: int, t_ns: int, forked: bool, rank: str, local_rank: str, label: str, command: str) -> str:
    return (f"{HEADER}\t{VERSION}\t{pid}\t{ppid}\t{t_ns}\t{1 if forked else 0}\t{esc(rank)}\t{esc(local_rank)}\t"
            f"{esc(label)}\t{esc(command)}\n")


def frame(fid: int, function: str, file: str, line: int) -> str:
    return f"{FRAME}\t{fid}\t{esc(function)}\t{esc(file)}\t{line}\n"


def stack(sid: int, fids: tuple[int, ...]) -> str:
    return f"{STACK}\t{sid}\t{','.join(map(str, fids))}\n"


def tick(t0: int, t1: int, proc: int, own: int, rss: int) -> str:
    return f"{TICK}\t{t0}\t{t1}\t{proc}\t{own}\t{rss}\t\n"


def sample(sid: int, cpu: int, main: bool) -> str:
    return f"{SAMPLE}\t{sid}\t{cpu}\t{1 if main else 0}\t\n"


def unit_sample(sid: int, cpu: int, main: bool, unit: int) -> str:
    return f"{UNIT_SAMPLE}\t{sid}\t{cpu}\t{1 if main else 0}\t{unit}\t\n"


_FIELDS = {TICK: 7, SAMPLE: 5, UNIT_SAMPLE: 6, IO: 5, KCYCLE: 6, KBUSY: 6}
_ENDED = (KPATH, KNAMES, KCOUNTS)  # of any length: ended by a field no text can hold (`KEND`)


def complete(r: list[str]) -> bool:
    """A line of numbers as written whole, so a line a failed write cut (the writer ends it at its next
    write) is refused, not read with a number cut short: ticks, samples, I/O edges and the fixed kernel
    records end with a tab (and have their length), the kernel records of any length with `KEND`
    (other kinds: always)."""
    n = _FIELDS.get(r[0])
    if n is not None:
        return len(r) == n and r[-1] == ""
    return r[0] not in _ENDED or (len(r) > 1 and r[-1] == "\0")


def window_begin(t_ns: int, name: str, index: int | None) -> str:
    return f"{WINDOW}\tb\t{t_ns}\t{esc(name)}\t{'' if index is None else int(index)}\n"


def window_end(t_ns: int, name: str | None, reply: bool, facts: dict[str, float] | None = None) -> str:
    """`facts`: numbers the program measured about the span (a tracked loop's pipeline time),
    as `k=v;k=v` in a last field that older readers ignore."""
    more = "\t" + ";".join(f"{esc(str(k))}={float(v)!r}" for k, v in facts.items()) if facts else ""
    return f"{WINDOW}\te\t{t_ns}\t{esc('' if name is None else name)}\t{'r' if reply else ''}{more}\n"


def window_facts(text: str) -> dict[str, float]:
    """The facts of a window's end record (`window_end`); a damaged pair is left out."""
    out = {}
    for part in unesc(text).split(";"):
        k, _, v = part.partition("=")
        try:
            out[k] = float(v)
        except ValueError:
            continue
    return out


def io_edge(t_ns: int, proc: tuple[int, ...] | None, disks: dict[str, tuple[int, ...]]) -> str:
    """I/O counters at a window's edge (agent/iostat.py reads them)."""
    text = ";".join(f"{esc(name)}:{','.join(map(str, values))}" for name, values in disks.items())
    return f"{IO}\t{t_ns}\t{'' if proc is None else ','.join(map(str, proc))}\t{text}\t\n"


def parse_io_edge(r: list[str]) -> tuple[int, tuple[int, ...] | None, dict[str, tuple[int, ...]]]:
    """(t_ns, the process's counters or None, the disks' counters) of an `I` record."""
    proc = tuple(int(v) for v in r[2].split(",")) if r[2] else None
    disks = {}
    for part in r[3].split(";") if r[3] else ():
        name, _, values = part.rpartition(":")
        disks[unesc(name)] = tuple(int(v) for v in values.split(","))
    return int(r[1]), proc, disks


def alloc(function: str, file: str, line: int, size: int) -> str:
    return f"{ALLOC}\t{esc(function)}\t{esc(file)}\t{line}\t{size}\n"


def exception(t_ns: int, text: str) -> str:
    return f"{EXCEPTION}\t{t_ns}\t{esc(text)}\n"


def note(text: str) -> str:
    return f"{NOTE}\t{esc(text)}\n"


def lost(t0: int, t1: int, size: int) -> str:
    return f"{LOST}\t{t0}\t{t1}\t{size}\n"


def gpu(t_ns: int) -> str:
    return f"{GPU}\t{t_ns}\n"


def end(t_ns: int) -> str:
    return f"{END}\t{t_ns}\n"


def threads(sid: int, count: int) -> str:
    return f"{THREADS}\t{sid}\t{count}\n"


def role(label: str) -> str:
    return f"{ROLE}\t{esc(label)}\n"


# The end of a kernel record of any length: a field holding one NUL, which `esc` never leaves in a text
# field and no number holds, so no cut of the line (even one ending at a tab) can end in it.
KEND = "\t\0\n"


def kernel_cycle(t0: int, t1: int, records: int, cost_ns: int = 0) -> str:
    return f"{KCYCLE}\t{int(t0)}\t{int(t1)}\t{int(records)}\t{int(cost_ns)}\t\n"


def kernel_path(kid: int, frames: tuple[tuple[str, str, int], ...]) -> str:
    return f"{KPATH}\t{kid}" + "".join(f"\t{esc(fn)}\t{esc(file)}\t{int(line)}" for fn, file, line in frames) + KEND


def kernel_busy(kid: int, device: int, bucket_ns: int, busy: dict[int, float]) -> str:
    cells = ",".join(f"{int(b)}:{float(ns)!r}" for b, ns in sorted(busy.items()))
    return f"{KBUSY}\t{kid}\t{int(device)}\t{int(bucket_ns)}\t{cells}\t\n"


def kernel_names(kid: int, device: int, names: dict[str, list[float]]) -> str:
    return (f"{KNAMES}\t{kid}\t{int(device)}"
            + "".join(f"\t{esc(n)}\t{int(c)}\t{float(t)!r}" for n, (c, t) in names.items()) + KEND)


def kernel_counts(counts: dict[str, int]) -> str:
    return f"{KCOUNTS}" + "".join(f"\t{esc(k)}\t{int(n)}" for k, n in counts.items()) + KEND


def next_file(name: str) -> str:
    return f"{NEXT}\t{esc(name)}\n"


# -- the reader's side ---------------------------------------------------------------------
class Header:
    __slots__ = ("pid", "ppid", "t_ns", "forked", "rank", "local_rank", "label", "command")

    def __init__(self, r: list[str]) -> None:
        self.pid, self.ppid, self.t_ns = int(r[2]), int(r[3]), int(r[4])
        self.forked = r[5] == "1"
        self.rank, self.local_rank = unesc(r[6]) or None, unesc(r[7]) or None
        self.label, self.command = unesc(r[8]), unesc(r[9])


def parse_header(r: list[str]) -> Header | None:
    """The header of a stream this reader understands; None for anything else."""
    if len(r) < 10 or r[0] != HEADER or r[1] != str(VERSION):
        return None
    try:
        return Header(r)
    except ValueError:
        return None


# -- the window back-channel ---------------------------------------------------------------
def reply(start_ns: int, end_ns: int, estimated: bool, ids: list[str] | tuple[str, ...],
          energy: list[float] | tuple[float, ...], program: list[float] | tuple[float, ...]) -> str:
    def row(values: list[float] | tuple[float, ...]) -> str:
        return ",".join(repr(float(v)) for v in values)

    return (f"{start_ns}\t{end_ns}\t{1 if estimated else 0}\t{','.join(esc(i).replace(',', '') for i in ids)}\t"
            f"{row(energy)}\t{row(program)}\n")


def _joules(ids: list[str], text: str) -> dict[str, float]:
    return dict(zip(ids, (float(x) for x in text.split(",")))) if text else {}


def parse_replies(data: bytes) -> dict[tuple[int, int], tuple[bool, dict[str, float], dict[str, float]]]:
    """Complete reply lines: (start, end) -> (estimated, energy, program) by source id."""
    out = {}
    for f in decode(data):
        if len(f) != 6:
            continue
        try:
            ids = [unesc(i) for i in f[3].split(",")] if f[3] else []
            out[(int(f[0]), int(f[1]))] = (f[2] == "1", _joules(ids, f[4]), _joules(ids, f[5]))
        except ValueError:
            continue
    return out
