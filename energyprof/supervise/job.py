"""The job feed: every process's stream merged into one ledger, on the supervisor's ticks.

Each followed Python process spools its samples (stream.py); other descendants are read
from /proc. Streams arrive late (up to a flush period) and out of step, so a sensor
reading is held until every live stream has reported past it, and only then becomes a
`Tick`: no interval is charged before all of its samples are in. The Tick's clocks are the
job's: CPU is the sum over its processes (each counted once, live or ended, from its own
sampler's clock, interpolated to the reading's time), energyprof's own CPU is the samplers'
plus the supervisor's.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ..record import field, record
from ..collect import probes
from ..core.feed import Clock, HeldTicks
from ..core.ledger import Ledger
from ..core.tallies import WindowTally
from ..facts.policy import DEFAULT_POLICY, IdlePolicy, WindowAccount, check_policy
from ..core.recording import Sample, Tick
from ..engines.roles import process_role as engines_process_role
from ..engines.unit_windows import UnitWindows
from ..agent import wire
from ..agent.wire import PROCESS_MARKER
from ..facts.profile import PROCESS_GROUP_PREFIX
from . import follow
from .records import (EndRecord, ExceptionRecord, FrameRecord, NoteRecord, RoleRecord, SampleRecord, StackRecord,
                      TickRecord, parse_all, spool_started)
from .stream import StreamReader

if TYPE_CHECKING:
    from .extra_records import WindowBegins, WindowEnds
    from .records import Record

SCAN_NS = 100_000_000  # how often /proc is searched for new processes and liveness
LIST_NS = 40_000_000  # how often the spool folder is listed for new processes' streams
DESCENDANTS_NS = 250_000_000  # how often /proc is walked for processes without a stream (a walk opens a file per thread)
NON_PYTHON_GRACE_NS = 300_000_000  # a new process this long without a stream is not Python (or not followed)
# The program energyprof started with its own interpreter is Python: on a loaded machine its start can take
# longer than the grace above, and placed as "not Python" it would be a node of its own under the root.
PYTHON_MAIN_GRACE_NS = 5_000_000_000
# A forked child's stream silent this long has its command line compared with its hello's (an exec?):
# a few of its sampler's ticks, so the check costs a /proc read only where a stream went quiet.
EXEC_SILENCE_NS = 50_000_000
MAX_LAG_NS = 2_000_000_000  # a stream silent this long (a long C call holding the GIL) no longer holds ticks back
# A spawned multiprocessing child learns its role after `prepare` imported the program's main module
# (torch's import alone can take seconds on a loaded machine): its placement, and the ticks, wait this long at most.
ROLE_WAIT_NS = 10_000_000_000


@record
class StreamIds:
    """A stream's own frame and stack ids, mapped to the job's (a stream opened again after an exec starts afresh)."""
    frames: dict[int, tuple[int, ...]] = field(default_factory=dict)  # local frame id -> global frame ids
    stacks: dict[int, int] = field(default_factory=dict)  # local stack id -> global stack id


@record
class Placement:
    """Where a process's node sits in the job's tree, and the stacks its main thread ran (where its children go)."""
    frame: int | None = None  # its node's global frame id (None: the main Python process)
    anchor: tuple[int, ...] = ()  # the stack its node hangs under
    last_main_sid: int = -1
    main_hist: deque = field(default_factory=lambda: deque(maxlen=2048))  # (t1, global sid) of main samples


@record
class ReadFromProc:
    """A process followed through /proc (no stream of its own): the samples made up for its node."""
    sid: int = -1  # its node's stack (-1: not made yet)
    until: int = 0  # its samples so far reach this time ...
    sampled_ns: int = 0  # ... and carry this much of its CPU


# Identity, not field-by-field equality (no two records stand for one process), and no generated repr
# (nothing reads one).
@record(eq=False, repr=False)
class Proc:
    """One process of the job as the feed knows it: its stream or /proc readings, its clock and its place."""

    # who it is
    pid: int
    ppid: int
    command: str = ""
    label: str = ""
    rank: str | None = None
    local_rank: str | None = None
    python: bool = True
    forked: bool = False
    main: bool = False
    role: str = "child"
    cuda_visible: str | None = None  # a rank's CUDA_VISIBLE_DEVICES, which GPU it uses
    # its stream, as read so far
    reader: StreamReader | None = None
    ids: StreamIds = field(default_factory=StreamIds)
    cur: TickRecord = TickRecord(0, 0, 0, 0, 0)  # the latest tick: the span its samples cover
    stash: list = field(default_factory=list)  # records held until the process is placed
    placed: bool = False
    t_start: int = 0
    watermark: int = 0
    last_data: int = 0
    allocations: list = field(default_factory=list)  # memory=exact: (global frame id or None, bytes)
    # its clocks
    hist: Clock = field(default_factory=lambda: Clock(counters=2, levels=1, before=(0, 0, 0)))  # (t, cpu, own, rss)
    cpu_ns: int = 0  # latest absolute CPU (user + system) since the process began
    own_ns: int = 0  # the part of it that was energyprof's sampler
    kernel_cpu_ns: int = 0  # its CPU as /proc last showed it (start-up and shut-down included)
    rss: int = 0
    # its end
    ended: bool = False  # no more samples will come
    dying: bool = False
    gone: bool = False  # the process no longer exists
    exit: dict[str, Any] | None = None
    exception: str | None = None
    node: Placement = field(default_factory=Placement)
    from_proc: ReadFromProc = field(default_factory=ReadFromProc)


class JobFeed:
    def __init__(self, ledger: Ledger, spool: str, follow_children: bool = True, children: bool = True,
                 rss: bool = True, policy: IdlePolicy = DEFAULT_POLICY) -> None:
        self.ledger = ledger
        self.policy = check_policy(policy)  # the run's one idle policy: a window's figures go back under it
        self.table = ledger.stacks
        self.units = UnitWindows(ledger, self.table)  # a window per run of a Ray or Dask task
        self.spool = spool
        self.follow = follow_children
        self.children = children
        self.rss = rss
        self.main_pid: int | None = None
        self.main_python = False  # the program runs on energyprof's own interpreter (a script or -m)
        self.procs: dict[int, Proc] = {}
        self.readers: dict[str, Proc] = {}
        self.notes: list[dict[str, Any]] = []
        self._raw: HeldTicks[tuple[int, tuple[float | None, ...], dict[str, float] | None, int, int, dict[int, int],
                                   int, int]] = HeldTicks(lambda raw: raw[0], max_hold_ns=None)  # MAX_LAG_NS is in the bound
        self._seen: dict[int, int] = {}  # pid -> when /proc first showed it without a stream
        self._last_scan = 0
        self._last_walk = 0
        self._t_scan = 0
        self._final_cpu: int | None = None
        # (pid, t_ns, its /proc/self/io, the disks') for each I/O reading at a window's edge (collect/io.py)
        self.on_io_edge: Any = None
        # What this process had reaped before the run: a shell that ran a command and then exec'd
        # energyprof (`bash -c 'A && python -m energyprof ...'`) hands it A's CPU in RUSAGE_CHILDREN.
        self._children_before_ns = probes.reaped_children_cpu_ns()
        self._finishing = False  # the program has ended: what is left is read once, and a forked child waits for no parent
        # Set by the supervisor once it has reaped the program: the readings after that wait for
        # finish(), which adds to the last of them the CPU no sampler saw (start-up, shutdown).
        # Released as they came, the last could be gone before finish(), and that CPU with it.
        self.program_ended = False
        self._replies: list[tuple[int, WindowTally]] = []  # ended windows whose figures go back (reply_windows)
        self.blocks: list[tuple[int, WindowTally]] | None = None  # --mlflow: window() blocks, for the live export
        # One rank of several on the node: the other ranks are the other descendants of this pid
        # (the launcher's agent); their CPU is what the ledger splits the node by under `all`.
        self.peers_root: int | None = None
        self._peer_cpu: dict[int, int] = {}
        self._last_peers = 0
        # GPU kernels the program reduced (agent/kernel_capture.py): folded as they come, bounded by lines;
        # made at the first kernel record, so a run without them loads none of their maths
        self.kernels: Any = None
        self._kernel_paths: dict[tuple[int, int], tuple[tuple[str, str, int], ...]] = {}  # (pid, kid) -> path

    def _kernel_fold(self) -> Any:
        if self.kernels is None:
            from ..core.gpu_tree import KernelFold

            self.kernels = KernelFold()
        return self.kernels

    # -- the collector's tick ------------------------------------------------------------
    def on_tick(self, t: int, energy: tuple[float | None, ...], gpu_share: dict[str, float] | None) -> None:
        sup_cpu = time.process_time_ns()
        busy = probes.machine_busy_ns()
        now = time.perf_counter_ns()
        if self.main_pid is not None and now - self._last_scan >= SCAN_NS:
            self._last_scan = now
            self._scan(now)
        self._read_streams(listing=now - self._t_scan >= LIST_NS)
        nonpy, nonpy_rss = self._read_non_python(t)
        if self.peers_root is not None and now - self._last_peers >= DESCENDANTS_NS:
            self._last_peers = now
            self._read_peers(self.peers_root)
        self._raw.add((t, energy, gpu_share, busy, sup_cpu, nonpy, nonpy_rss, sum(self._peer_cpu.values())))
        if not self.program_ended:
            self._release(self._bound(now))
        if self._replies:
            self._replies = reply_windows(self.spool, self.ledger, self._replies, self.policy)

    def finish(self) -> None:
        """The program has ended: read what is left, charge everything, close the books."""
        self._finishing = True
        self._scan(time.perf_counter_ns(), final=True)
        self._read_streams()
        for p in self.procs.values():
            p.ended = True
            self.units.close(p.pid, p.watermark)
        if self._raw and self.children:
            # CPU that no sampler saw (interpreter start-up and shutdown, the last flush a
            # SIGKILL lost) is in the kernel's figure for the waited-for program.
            self._final_cpu = max(0, probes.reaped_children_cpu_ns() - self._children_before_ns)
        self._release(None)
        self.ledger.finish()
        for p in self.procs.values():
            if p.allocations:
                self.ledger.add_allocations(p.pid, p.allocations, set(p.ids.stacks.values()))
        self._note_processes()
        for p in self.procs.values():
            if p.reader is not None:
                p.reader.close()

    # -- streams -------------------------------------------------------------------------
    def _read_streams(self, listing: bool = True) -> None:
        names: list[str] = []
        if listing:
            # Readings up to the listing's time may be released: any process started before
            # it had its spool file by then (the sampler creates it first thing).
            self._t_scan = time.perf_counter_ns()
            try:
                names = os.listdir(self.spool)
            except OSError:
                names = []
        fresh = []
        for name in names:
            path = os.path.join(self.spool, name)
            started = spool_started(name)
            if path not in self.readers and started is not None:
                fresh.append((started, path))
        for _, path in sorted(fresh):  # in the order the processes began: parents first
            self._open(path)
        for path, p in list(self.readers.items()):
            if p.reader is not None and p.reader.path == path:
                records = parse_all(p.reader.read())
                if not p.placed:
                    p.stash.extend(records)
                    if not self._try_place(p):
                        continue
                    records, p.stash = p.stash, []
                self._consume(p, records)
            if p.dying:
                p.ended = True

    def _open(self, path: str) -> None:
        try:
            reader = StreamReader(path)
        except OSError:
            return
        records = parse_all(reader.read())
        h = records[0] if records else None
        if not isinstance(h, wire.Header):  # not a stream this reader understands
            reader.close()
            return
        pid, ppid = h.pid, h.ppid
        p = self.procs.get(pid)
        if p is not None and p.reader is not None:
            self._consume(p, parse_all(p.reader.read()))  # an exec: the old image's last words first
            p.reader.close()
        if p is None:
            p = self.procs[pid] = Proc(pid=pid, ppid=ppid)
        elif not p.python:
            p.node.frame = None  # a slow start taken for a non-Python process: its node is named again (a rank, a label)
        if p.command and p.command != h.command:
            p.node.frame = None  # a fork that exec'd another program: named for what it runs now, not its parent
        p.ppid, p.python, p.forked = ppid, True, h.forked
        p.rank, p.local_rank = h.rank, h.local_rank
        p.label, p.command = h.label, h.command
        p.reader, p.ids = reader, StreamIds()
        p.ended = p.dying = False
        p.t_start = h.t_ns
        p.watermark = max(p.watermark, p.t_start)
        p.last_data = time.perf_counter_ns()
        self._seen.pop(pid, None)
        self.readers[path] = p
        p.placed, p.stash = False, list(records[1:])
        if self._try_place(p):
            records, p.stash = p.stash, []
            self._consume(p, records)

    def _try_place(self, p: Proc) -> bool:
        """Place a spawned child under the stack its parent ran when it started: wait until
        the parent's samples have reached that moment (or the parent is gone). A multiprocessing
        child that does not know its role yet (LABEL_PENDING) waits for it too, so all its stacks
        go under the one node of its role."""
        parent = self.procs.get(p.ppid)
        waited = time.perf_counter_ns() - p.t_start
        if p.label == wire.LABEL_PENDING:
            # the last: a line a failed write cut short is written again whole after it
            role = next((r for r in reversed(p.stash) if isinstance(r, RoleRecord) and r.label is not None), None)
            if role is not None:
                p.label = role.label
            elif not p.dying and not any(isinstance(r, EndRecord) for r in p.stash) and waited < ROLE_WAIT_NS:
                return False
            else:
                p.label = ""  # it ended, or took too long, before it knew: a node of its own
        if (not p.forked and p.pid != self.main_pid and parent is not None and parent.python
                and not parent.ended and parent.watermark < p.t_start and waited < MAX_LAG_NS):
            return False
        if (p.forked and parent is not None and not parent.placed and not (parent.ended or parent.dying)
                and not self._finishing and waited < ROLE_WAIT_NS):
            # A forked child's stacks begin with its parent's node (the process marker), which exists once
            # the parent is placed: read before, they would hang at the root, and a forkserver's workers
            # placed before and after it would be two nodes of one pool. The parent waits at most as long.
            return False
        self._place(p)
        p.placed = True
        return True

    def _place(self, p: Proc) -> None:
        """Decide the process's role and node, and the stack it sits under."""
        parent = self.procs.get(p.ppid)
        if parent is None and p.ppid == self.main_pid and p.pid != self.main_pid:
            # The program is not Python (a shell, a launcher): it is the parent's node.
            parent = self.procs[p.ppid] = Proc(pid=p.ppid, ppid=os.getpid(), python=False,
                                               command=follow.command(p.ppid), last_data=time.perf_counter_ns())
            self._place(parent)
            parent.placed = True
            parent.from_proc.until = parent.t_start = parent.last_data
            self._seen.pop(p.ppid, None)
        elif parent is not None and not parent.python and not parent.placed and parent is not p:
            # Found by the walk of /proc and not placed yet (that waits for its next reading): its child's
            # hello, read in between, would go under a node not there yet, so to the root.
            self._place(parent)
            parent.placed = True
        p.main = p.pid == self.main_pid
        if p.main:
            p.role = "main"
        elif p.rank is not None and (parent is None or parent.rank != p.rank):
            p.role = "rank"
        else:
            p.role = "worker" if p.label.startswith("[DataLoader worker") else (engines_process_role(p.command, p.label)
                                                                                or "child")
        # Known to the ledger from now on: a window a rank marks gets that rank's part, not the job's.
        self.ledger.note_process(p.pid, parent_pid=p.ppid, role=p.role)
        if p.role == "rank" or (p.main and p.rank is not None):
            p.cuda_visible = follow.environ_value(p.pid, "CUDA_VISIBLE_DEVICES")
        if p.main and p.python:
            p.node.frame, p.node.anchor = None, ()
            return
        name = follow.node_name(p.pid, p.command, p.label, p.rank if p.role == "rank" else None)
        group = name.startswith(PROCESS_GROUP_PREFIX)
        if group:  # one node for a pool's workers: the tree counts them
            self.ledger.note_process(p.pid, group=name)
        frame = (name, "", 0) if p.label or p.role == "rank" else (name, "", p.pid)
        if p.node.frame is None:
            p.node.frame = self.table.frame_id(frame)
        if p.forked and p.python:
            p.node.anchor = ()  # the forking stack is in its own stacks, as its parent named it
        else:
            p.node.anchor = self._stack_of(parent, p.t_start)
            if group:
                # A spawned worker says hello tens of milliseconds after its pool started it, when its
                # parent may have moved on (from Pool() to map()): a member of its pool puts it where that
                # pool's first worker went, so the pool is one node. Its pool's are the peers alive when it
                # began, ended since or not (a slow one's role can be read after they finished the tasks).
                peer = next((q for q in self.procs.values() if q is not p and q.placed and not q.forked
                             and (not q.ended or q.watermark >= p.t_start)
                             and q.ppid == p.ppid and q.node.frame == p.node.frame), None)
                if peer is not None:
                    p.node.anchor = peer.node.anchor

    def _stack_of(self, parent: Proc | None, t: int | None = None) -> tuple[int, ...]:
        """Where a new child of `parent` goes: under the stack it ran at `t` (default: now)."""
        if parent is None:
            return ()
        node = parent.node
        if parent.python and t is not None:
            for t1, sid in node.main_hist:
                if t1 >= t:
                    return self.table.stacks[sid]
        if parent.python and node.last_main_sid >= 0:
            return self.table.stacks[node.last_main_sid]
        if node.frame is not None:
            return (*node.anchor, node.frame)
        return ()

    def _expansion(self, pid: int) -> tuple[int, ...]:
        p = self.procs.get(pid)
        if p is None:
            return (self.table.frame_id((f"[process {pid}]", "", pid)),)
        if p.node.frame is None:
            return ()
        return (*p.node.anchor, p.node.frame)

    def _consume(self, p: Proc, records: list[Record]) -> None:
        if not records:
            return
        for r in records:
            try:
                if type(r) is SampleRecord:  # most records are: one call less
                    self._sample(p, r)
                else:
                    self._take(p, r)
            except (IndexError, KeyError, ValueError):
                continue  # an id its stream never defined (a line lost to a cut write): it costs that record only
        p.last_data = time.perf_counter_ns()

    def _take(self, p: Proc, r: Record) -> None:
        """One record of a process's stream into the ledger, or into what the process is known by."""
        if isinstance(r, SampleRecord):
            self._sample(p, r)
        elif isinstance(r, TickRecord):
            p.cur = r
            if not p.hist and r.rss:  # its first reading: the RSS before its program's first line
                self.ledger.note_start_rss(p.pid, r.rss, main=p.pid == self.main_pid)
            p.hist.add(r.t1, r.cpu_ns, r.own_ns, r.rss)
            p.cpu_ns, p.own_ns, p.rss = r.cpu_ns, r.own_ns, r.rss
            if r.t1 > p.watermark:
                p.watermark = r.t1
        elif isinstance(r, FrameRecord):
            p.ids.frames[r.fid] = self._frame(r)
        elif isinstance(r, StackRecord):  # ids are explicit: a stack written again after a cut write replaces it
            frames = p.ids.frames
            p.ids.stacks[r.sid] = self.table.stack_id(tuple(g for f in r.fids for g in frames[f]))
        elif isinstance(r, EndRecord):
            p.ended = True
            self.units.close(p.pid, p.watermark)
        elif isinstance(r, ExceptionRecord):
            p.exception = r.text
        elif isinstance(r, NoteRecord):
            self._note(r.text)
        elif not isinstance(r, (RoleRecord, wire.Header)):  # (a role is read where the process is placed)
            self._take_extra(p, r)

    def _take_extra(self, p: Proc, r: Record) -> None:
        """A record only some runs write: its class was made (extra_records.py) when its line was parsed."""
        from .extra_records import (AllocRecord, GpuRecord, IoEdgeRecord, KernelBusy, KernelCounts, KernelCycle,
                                    KernelNames, KernelPath, LostRecord, ThreadsRecord, WindowBegins, WindowEnds)

        if isinstance(r, (WindowBegins, WindowEnds)):
            self._window(p, r)
        elif isinstance(r, IoEdgeRecord):
            if self.on_io_edge is not None:
                self.on_io_edge(p.pid, r.t_ns, r.proc, r.disks)
        elif isinstance(r, AllocRecord):
            p.allocations.append((self.table.frame_id((r.function, r.file, r.line)) if r.function else None, r.size))
        elif isinstance(r, LostRecord):
            self._note(f"process {p.pid} could not write its samples for {(r.t1 - r.t0) / 1e9:.3f} s (measured; {r.size}"
                       " bytes dropped, a full disk or a write error): its stacks over that span are missing,"
                       " its energy went to the process as a whole")
        elif isinstance(r, GpuRecord):
            self.ledger.gpu_procs.add(p.pid)
        elif isinstance(r, ThreadsRecord):
            self.ledger.note_threads(p.pid, p.ids.stacks[r.sid], r.count)
        elif isinstance(r, KernelPath):
            self._kernel_paths[(p.pid, r.kid)] = r.frames
        elif isinstance(r, KernelBusy):
            self._kernel_fold().add_busy(self._kernel_paths[(p.pid, r.kid)], r.device, r.bucket_ns, r.busy)
        elif isinstance(r, KernelNames):
            self._kernel_fold().add_names(self._kernel_paths[(p.pid, r.kid)], r.device, r.names)
        elif isinstance(r, KernelCycle):
            self._kernel_fold().add_cycle(r.t0, r.t1, r.records, r.cost_ns)
        elif isinstance(r, KernelCounts):
            self._kernel_fold().add_counts(r.counts)

    def _sample(self, p: Proc, r: SampleRecord) -> None:
        sid = p.ids.stacks[r.sid]
        cur = p.cur
        self.ledger.add_sample(Sample(cur.t0, cur.t1, sid, r.cpu_ns, r.main, cur.rss, p.pid, r.unit))
        self.units.sample(p.pid, sid, cur.t0)
        if r.main:
            p.node.last_main_sid = sid
            p.node.main_hist.append((cur.t1, sid))

    def _frame(self, r: FrameRecord) -> tuple[int, ...]:
        """A stream's frame as the job's frame ids: a process marker stands for that process's node and what it
        hangs under."""
        if r.function == PROCESS_MARKER and not r.file:
            return self._expansion(r.line)
        return (self.table.frame_id((r.function, r.file, r.line)),)

    def _window(self, p: Proc, r: WindowBegins | WindowEnds) -> None:
        from .extra_records import WindowBegins as Begins

        if isinstance(r, Begins):
            self.ledger.begin_window(r.t_ns, r.name, r.index, pid=p.pid)
            return
        w = self.ledger.end_window(r.t_ns, r.name, pid=p.pid, facts=r.facts)
        if w is not None and r.reply:  # a Measurement waits for it
            self._replies.append((p.pid, w))
            if self.blocks is not None:  # --mlflow: the supervisor logs the block once charged (output/live/)
                self.blocks.append((p.pid, w))

    def _note(self, msg: str) -> None:
        if not any(n["message"] == msg for n in self.notes):
            self.notes.append({"kind": "process", "message": msg})

    # -- processes that are not (or not yet) streams -------------------------------------
    def _scan(self, now: int, final: bool = False) -> None:
        """New descendants, and which followed processes have ended."""
        main = self.main_pid
        if main is None:
            return
        for p in self.procs.values():
            if p.gone or p.ended and not p.python:
                continue
            st = follow.stat(p.pid) if not (p.main and final) else None
            if st is not None:
                p.kernel_cpu_ns = max(p.kernel_cpu_ns, st.cpu_ns)
            if st is not None and p.python and p.forked and not p.dying and now - p.last_data >= EXEC_SILENCE_NS:
                self._check_exec(p, st, now)
            if st is None or st.state in ("Z", "X"):
                if st is not None and st.exit is not None and p.exit is None:
                    p.exit = st.exit
                if p.python:
                    p.dying = True
                else:
                    p.ended = True
                p.gone = st is None or p.gone
        if final or not self.children or now - self._last_walk < DESCENDANTS_NS:
            return
        self._last_walk = now
        kids = probes.descendant_pids(main) or []
        pids = [main, *kids] if main not in self.procs else kids
        for pid in pids:
            if pid in self.procs:
                continue
            first = self._seen.setdefault(pid, now)
            grace = PYTHON_MAIN_GRACE_NS if pid == main and self.main_python else NON_PYTHON_GRACE_NS
            if (not self.follow and pid != main) or now - first >= grace:
                st = follow.stat(pid)
                if st is None:
                    continue
                cmd = follow.command(pid)
                if self.follow and wire.SPAWN_MAIN in cmd and now - first < ROLE_WAIT_NS:
                    continue  # a multiprocessing spawn child is Python: its stream comes once its interpreter has started
                p = self.procs[pid] = Proc(pid=pid, ppid=st.ppid, python=False, command=cmd)
                p.last_data = p.t_start = p.from_proc.until = now
                p.cpu_ns = p.from_proc.sampled_ns = st.cpu_ns
                self._seen.pop(pid, None)

    def _check_exec(self, p: Proc, st: Any, now: int) -> None:
        """A forked Python child that went silent because it exec'd a program that is not Python.

        subprocess with a `preexec_fn` (Ray starts its raylet and GCS server so) forks through
        Python's at-fork hooks, so the child's agent said hello under its parent's command line
        before the exec replaced it. A Python program exec'd would have said hello again; a silent
        stream under a new command line is a native program: from now on it is read from /proc,
        under its own name, or its CPU (the raylet's, all run long) would be no one's."""
        cmd = follow.command(p.pid)
        if not cmd or cmd == p.command:
            return  # still the forked image: a long call that holds the GIL
        if p.reader is not None:  # its path stays in `readers`, so the stream is not opened again
            p.reader.close()
            p.reader = None
        p.python, p.command, p.label = False, cmd, ""
        p.node.frame, p.placed = None, False
        # From where its agent's last tick left it: the CPU the new program spent while it was
        # silent is its own, not lost.
        last = p.hist.last
        p.from_proc = ReadFromProc(-1, last[0], last[1]) if last is not None else ReadFromProc(-1, p.t_start, 0)
        p.cpu_ns = st.cpu_ns

    def _read_non_python(self, t: int) -> tuple[dict[int, int], int]:
        """CPU of each process followed through /proc, and a sample for its node."""
        cpu: dict[int, int] = {}
        rss_total = 0
        for p in self.procs.values():
            if p.python:
                continue
            if not p.ended:
                st = follow.stat(p.pid)
                if st is None or st.state in ("Z", "X"):
                    p.ended = True
                    p.gone = st is None
                    if st is not None and st.exit is not None:
                        p.exit = st.exit
                if st is not None:
                    p.cpu_ns = max(p.cpu_ns, st.cpu_ns)
                    p.rss = follow.rss_bytes(p.pid) if self.rss and not p.ended else 0
                    rss_total += p.rss
                if (p.placed or self._try_place(p)) and p.node.frame is not None:
                    self._sample_from_proc(p, t)
            cpu[p.pid] = p.cpu_ns
        return cpu, rss_total

    def _sample_from_proc(self, p: Proc, t: int) -> None:
        """The CPU a process read from /proc spent since its last sample, as one sample of its node up to `t`."""
        fp = p.from_proc
        if fp.sid < 0:
            fp.sid = self.table.stack_id((*p.node.anchor, p.node.frame))
        if t > fp.until:
            d, fp.sampled_ns = p.cpu_ns - fp.sampled_ns, p.cpu_ns
            self.ledger.add_sample(Sample(fp.until, t, fp.sid, d, True, p.rss, p.pid))
            fp.until = t

    def _read_peers(self, root: int) -> None:
        """The CPU of every descendant of `root` outside this supervisor's own family, each process
        counted at the most it was seen with (one that ends keeps what it spent)."""
        me = os.getpid()
        mine = set(probes.descendant_pids(me) or ()) | {me}
        for pid in probes.descendant_pids(root) or ():
            if pid in mine:
                continue
            st = follow.stat(pid)
            if st is not None:
                self._peer_cpu[pid] = max(self._peer_cpu.get(pid, 0), st.cpu_ns)

    # -- merging -------------------------------------------------------------------------
    def _bound(self, now: int) -> int:
        """Readings up to this time have all their samples in."""
        bound = self._t_scan
        for p in self.procs.values():
            if not p.placed and not p.ended:
                bound = min(bound, p.t_start)
            elif p.python and not p.ended and now - p.last_data < MAX_LAG_NS:
                bound = min(bound, p.watermark)
        return bound

    def _release(self, bound: int | None) -> None:
        """Hand the readings up to `bound` (None: all, at the end) to the ledger as the job's Ticks."""
        procs = self.procs.values()
        final = bound is None
        for t, energy, gpu_share, busy, sup_cpu, nonpy, nonpy_rss, peers in self._raw.release(bound, final):
            cpu = own = 0
            rss = nonpy_rss
            for p in procs:
                if not p.python:
                    cpu += nonpy.get(p.pid, 0)
                    continue
                c, o, r = p.hist.at(t) if p.hist else (p.cpu_ns, p.own_ns, 0)
                cpu += c
                own += o
                if not p.ended or t <= p.watermark:
                    rss += r
            cpu += sup_cpu
            own += sup_cpu
            if final and not self._raw:
                # The last reading carries the CPU no sampler saw: every process's whole life as the
                # kernel counted it (the processes table's figures), and the waited-for program's
                # tree (children too short-lived to follow) where that is more.
                whole = sum(max(p.cpu_ns, p.kernel_cpu_ns) if p.python else nonpy.get(p.pid, 0) for p in procs)
                cpu = max(cpu, whole + sup_cpu, (self._final_cpu or 0) + sup_cpu)
            self.ledger.add_tick(Tick(t, energy, cpu, own, busy, rss if self.rss else 0, 0, gpu_share, peers))
            for p in procs:
                p.hist.forget_before(t)

    # -- the processes table ---------------------------------------------------------------
    def _note_processes(self) -> None:
        for p in self.procs.values():
            self.ledger.note_process(
                p.pid, parent_pid=p.ppid, command=p.command[:200], role=p.role,
                rank=int(p.rank) if p.rank and p.rank.isdigit() else None,
                local_rank=int(p.local_rank) if p.local_rank and p.local_rank.isdigit() else None,
                cpu_ns=max(0, max(p.cpu_ns, p.kernel_cpu_ns) - p.own_ns), exit=p.exit,
            )

    def main_exception(self) -> str | None:
        p = self.procs.get(self.main_pid or -1)
        return p.exception if p is not None else None


def window_reply(account: WindowAccount, policy: IdlePolicy) -> str:
    """One charged window's figures as a line of the back-channel: the program's part under the
    run's one policy, so the agent that reads it chooses nothing."""
    return wire.reply(account.start_ns, account.end_ns, account.estimated, account.sources, account.machine_j,
                      account.program_j.pick(policy))


def reply_windows(spool: str, ledger: Ledger, waiting: list[tuple[int, WindowTally]],
                  policy: IdlePolicy) -> list[tuple[int, WindowTally]]:
    """Hand each charged window's figures back to the process that opened it: one line in
    `<spool>/<pid>.windows` (read by the agent's Measurement); returns the windows still waiting."""
    left = []
    lines: dict[int, list[str]] = {}
    for pid, w in waiting:
        if not w.done:
            left.append((pid, w))
            continue
        lines.setdefault(pid, []).append(window_reply(ledger.account(w), policy))
    for pid, text in lines.items():
        try:
            with open(os.path.join(spool, f"{pid}{wire.REPLY_SUFFIX}"), "ab") as fh:
                fh.write(wire.encode("".join(text)))  # whole lines: the agent reads up to the last newline
        except OSError:
            pass  # the process's Measurement then says its figures are not in
    return left
