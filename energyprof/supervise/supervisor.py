"""Run the program as a child process and profile every process of its job from outside.

The supervisor reads the sensors (one collector thread, no GIL shared with the program),
folds the samplers' streams into the ledger, checkpoints, and after the program has ended,
however it ended, writes the outputs and ends the way the program did.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from typing import Any

from ..collect.collector import Collector, open_sources
from ..core.ledger import Ledger
from ..core.processes import process_table
from ..core.tree import build_profile
from ..setup.options import Options
from ..collect.probes import OwnClocks
from ..facts.profile import Profile
from ..drive.meta import checkpoint_header, run_meta, run_notes
from . import follow, signals
from .bootstrap import child_env
from .launch import Launch, NoRoom, no_room
from ..engines.distributed import gpu_ties
from ..engines.distributed import hostname
from .job import JobFeed


class Supervisor:
    def __init__(self, options: Options, command: list[str], target: str, argv: list[str],
                 executable: str | None = None, meta: dict[str, Any] | None = None) -> None:
        self.options = options
        self.extra_meta = dict(meta or {})  # e.g. the rank's `distributed` block, known before the run
        self.command = command  # what runs: [python, script, args...] or the user's command
        self.executable = executable  # None: look command[0] up on PATH
        self.target = target
        self.argv = argv
        self.notes: list[dict[str, Any]] = []
        self.discovery_notes: list[str] = []
        self.started_wall = 0.0
        self.pid: int | None = None
        self.status: int | None = None
        self.peak_rss: int | None = None  # the program's exact peak (the kernel's, from wait4)
        self.launch: Launch | None = None
        from ..collect.io import IoRecorder

        # the program's I/O and the disks', read with the sensors' tick and at its windows' edges (--io off: none)
        self.io = IoRecorder(lambda: self.pid, off=options.io == "off")
        self.page_cache: list[dict[str, Any]] = []  # --watch-cache: residency at the run's start and end

    def run(self) -> tuple[Profile, int]:
        """Run the program to its end; (the profile, its raw wait status). The checkpoint is left
        in place: the caller removes it once the profile's facts are on disk (outputs.py)."""
        ignored = signals.inherited_ignored()
        signals.reset_sigchld()
        o = self.options
        self._watch_cache("start")
        spool = tempfile.mkdtemp(prefix="energyprof-")  # first: where TMPDIR is unusable, its search opens files
        inbox: signals.Inbox | None = None
        try:
            inbox = signals.inbox()  # the portable inbox's wakeup pipe, child_env's imports: descriptors too
            io_disks = set(self.io.disks) if self.io.available else None
            launch = Launch(self.command, self.executable, child_env(o, spool, io_disks=io_disks),
                            signals.child_dispositions(ignored),
                            o.checkpoint)
        except OSError as exc:
            if inbox is not None:
                inbox.close()
            shutil.rmtree(spool, ignore_errors=True)
            _say_no_room(exc)
            raise
        try:
            launch.fork()  # while this process has one thread: sensor discovery may start some
            found, ledger = open_sources(o)
            self.discovery_notes = found.notes
            feed = JobFeed(ledger, spool, follow_children=o.follow, children=o.children,
                           rss=o.memory != "off", policy=o.idle)
            # I/O read at a window's edge: the program's own counters go with the main process's series
            feed.on_io_edge = lambda pid, t, proc, disks: self.io.edge(t, proc if pid == self.pid else None, disks)
            rank = self.extra_meta.get("distributed")
            if isinstance(rank, dict) and rank.get("local_world_size", 1) > 1:  # one rank of several on this node
                ledger.node_ranks, feed.peers_root = int(rank["local_world_size"]), os.getppid()
            own = OwnClocks()
            collector = Collector(found.sensors, feed, o.sensor_interval, own, sensor_timeout_s=o.sensor_timeout,
                                  checkpoint=lambda: self._checkpoint_header(ledger, feed),
                                  checkpoint_path=o.checkpoint, checkpoint_interval_s=o.checkpoint_interval,
                                  extras=[self.io])
            self.started_wall = time.time()
            watch = self._start_live(ledger, feed, collector, spool)
            collector.start()
        except BaseException as exc:
            launch.abort()
            inbox.close()
            shutil.rmtree(spool, ignore_errors=True)
            _say_no_room(exc)
            raise
        self.launch = launch
        try:
            try:
                self.pid = launch.start()
            except OSError as exc:
                collector.stop()
                launch.abort()
                raise SpawnError(f"cannot run {self.command[0]}: {exc.strerror or exc}") from None
            feed.main_pid = self.pid
            feed.main_python = bool(self.command) and self.command[0] == sys.executable
            self.status = self._wait(self.pid, inbox, launch, feed)
            feed.program_ended = True
            collector.stop()
            if watch is not None:  # the windows the last ticks charged, the spool's last lines
                watch.final()
        finally:
            inbox.close()
            shutil.rmtree(spool, ignore_errors=True)
        profile = self._build(ledger, feed, collector)
        if watch is not None:  # the last points from the profile; at most FINISH_WAIT_S for the servers
            from ..output.live.export import finish_run

            profile = finish_run(watch.export, profile, not self.options.quiet and not self.options.summary,
                                 watch.history(), watch.end_ns())
        return profile, self.status

    def _start_live(self, ledger: Ledger, feed: JobFeed, collector: Collector, spool: str) -> Any:
        """--influx, --pushgateway, --mlflow: the live export's threads, fed from the collector's tick
        (output/live/); None without them."""
        o = self.options
        if not (o.influx or o.pushgateway or o.mlflow):  # nothing of the export's is imported without them
            return None
        from ..facts.measurement import carbon_setting
        from ..output.live.export import LedgerWatch, LiveExport

        export = LiveExport(o, started_wall=self.started_wall)
        export.carbon = carbon_setting(o)
        watch = LedgerWatch(export, ledger, o.idle, collector._lock, spool)
        if o.mlflow:  # the program's window() blocks, logged here once charged
            feed.blocks = watch.blocks
        collector.extras.append(watch)
        return watch

    def finish(self) -> None:
        """The outputs are written: energyprof ends normally, and the job's processes are the
        program's business again (the watcher leaves them)."""
        if self.launch is not None:
            self.launch.finish()

    def _wait(self, pid: int, inbox: signals.Inbox, launch: Launch, feed: JobFeed) -> int:
        """The program's wait status once it has ended. energyprof stops when the program stops
        (Ctrl-Z, SIGTSTP at its default, SIGTTIN) and not before, so a shell sees the job as it
        would see the program: a program that handles SIGTSTP and goes on keeps energyprof going."""
        while True:
            for sig in inbox.wait(0.25):
                if sig.forward and not launch.sent_to_job(sig.signo):
                    try:
                        os.kill(pid, sig.signo)
                    except ProcessLookupError:
                        pass
                elif sig.from_terminal:
                    launch.forget(sig.signo)
            launch.tell(list(feed.procs))
            try:
                done, status, usage = os.wait4(pid, os.WNOHANG | os.WUNTRACED)
            except ChildProcessError:
                return 0
            if done == pid and os.WIFSTOPPED(status):
                # SIGCONT (the shell's `fg` or `bg` to the job, or sent to energyprof and passed
                # on) resumes both; in an orphaned process group the kernel stops neither.
                inbox.stop_self()
                continue
            if done == pid:
                self.peak_rss = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024) if usage.ru_maxrss else None
                return status

    # -- the profile -------------------------------------------------------------------
    def exit_record(self, exception: str | None) -> dict[str, Any]:
        status = self.status or 0
        if os.WIFSIGNALED(status):
            name = follow.signal_name(os.WTERMSIG(status))
            if name == "SIGINT":
                return {"status": "interrupted", "exception": exception or "KeyboardInterrupt", "signal": "SIGINT"}
            if name == "SIGTERM":
                return {"status": "terminated", "signal": "SIGTERM"}
            return {"status": "signal", "signal": name}
        code = os.WEXITSTATUS(status)
        if exception is not None and code == 1:  # Python's status after an uncaught exception
            return {"status": "exception", "exception": exception}
        if code == 0:
            return {"status": "completed"}
        return {"status": "exit", "code": code}

    def _meta(self, exit_status: dict[str, Any]) -> dict[str, Any]:
        meta = run_meta(self.options, self.target, self.argv, self.started_wall, self.pid, self.discovery_notes,
                        exit_status)
        meta["host"]["name"] = hostname()  # what `energyprof merge` groups nodes by
        return {**meta, **self.extra_meta}

    def _checkpoint_header(self, ledger: Ledger, feed: JobFeed) -> dict[str, Any]:
        return checkpoint_header(self._meta({"status": "checkpoint"}), self.options, feed.notes, ledger)

    def _build(self, ledger: Ledger, feed: JobFeed, collector: Collector) -> Profile:
        main = feed.procs.get(self.pid or -1)
        if main is not None:
            main.exit = follow.exit_status(self.status or 0)
        for p in feed.procs.values():
            ledger.note_process(p.pid, exit=p.exit)
        peak = self.peak_rss if self.peak_rss and self.options.memory != "off" else None
        self._tie_gpus(ledger, feed, collector)
        split, gpu_notes = None, []
        # a GPU read, or records the program's capture reduced (backward's CPU ops too): otherwise none of
        # the kernels' modules is loaded
        if feed.kernels is not None or any(sid.startswith("gpu:") for sid in ledger.source_ids):
            from ..collect.kernels.capture import kernel_split

            # the kernels the program reduced, split before the tree is built: samples and kernels build it together
            split, gpu_notes = kernel_split(feed.kernels, ledger, collector, mode=self.options.gpu_kernels)
        meta = self._meta(self.exit_record(feed.main_exception()))
        if self.options.watch_cache:  # the page cache at the end: in the meta the profile is built with
            self._watch_cache("end")
            from ..collect.settings import storage

            meta = {**meta, "page_cache": list(self.page_cache),
                    "settings": {**meta.get("settings", {}), "storage": storage(self.options.watch_cache)}}
        return build_profile(ledger, self.options.idle, meta,
                             notes=[*run_notes(self.options, [*collector.notes, *feed.notes]), *gpu_notes],
                             peak_rss_exact_bytes=peak, gpu=split,
                             io=self.io.fact(ledger.first_ns))  # collect/io.py: counters on the windows' clock

    def _watch_cache(self, when: str) -> None:
        """--watch-cache PATH: the page-cache residency of the files under PATH (collect/pagecache.py)."""
        if not self.options.watch_cache:
            return
        from ..collect import pagecache

        if pagecache.supported():
            self.page_cache.append({"when": when, **pagecache.residency(self.options.watch_cache)})

    def _tie_gpus(self, ledger: Ledger, feed: JobFeed, collector: Collector) -> None:
        """Each GPU source with the rank that uses it, written into the sources before the
        Profile is built (NVML's process lists, where the driver gave them, have the last word)."""
        nvml = {s.id: set(s.share.seen_pids) for s in collector.sensors
                if getattr(s, "share", None) is not None and s.share.seen_pids}
        ties = gpu_ties(ledger.sources, process_table(ledger, self.options.idle),
                        {p.pid: p.cuda_visible for p in feed.procs.values() if p.cuda_visible is not None},
                        os.environ.get("CUDA_VISIBLE_DEVICES"), nvml or None)
        for source in ledger.sources:
            source.update(ties.get(source["id"], {}))


class SpawnError(Exception):
    """The program could not be started (one line for the user)."""


def _say_no_room(exc: BaseException) -> None:
    """A limit that left no room before the program started is one line and exit 2, not a traceback."""
    room = exc if isinstance(exc, NoRoom) else no_room(exc)
    if room is not None:
        raise SpawnError(f"{room}; the program was not started") from None
