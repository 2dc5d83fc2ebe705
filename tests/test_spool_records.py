"""The spool's record types: every line the agent's writer makes parses to its record with the values written,
and a line cut short or damaged parses to nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from energyprof.agent import wire
from energyprof.supervise.records import (AllocRecord, EndRecord, ExceptionRecord, FrameRecord, GpuRecord, LostRecord,
                                          NoteRecord, SampleRecord, StackRecord, TickRecord, WindowBegins, WindowEnds,
                                          parse, parse_all, spool_started)


def _one(line: str):
    fields = wire.decode(wire.encode(line))
    assert len(fields) == 1
    return parse(fields[0])


def test_every_kind_the_writer_makes_parses_to_its_record() -> None:
    assert _one(wire.tick(10, 20, 300, 40, 5_000)) == TickRecord(10, 20, 300, 40, 5_000)
    assert _one(wire.sample(3, 250, True)) == SampleRecord(3, 250, True)
    assert _one(wire.sample(4, 0, False)) == SampleRecord(4, 0, False)
    assert _one(wire.frame(7, "f\tg", "a b.py", 12)) == FrameRecord(7, "f\tg", "a b.py", 12)
    assert _one(wire.stack(2, (0, 5, 9))) == StackRecord(2, (0, 5, 9))
    assert _one(wire.stack(3, ())) == StackRecord(3, ())
    assert _one(wire.window_begin(100, "step", 4)) == WindowBegins(100, "step", 4)
    assert _one(wire.window_begin(100, "epoch", None)) == WindowBegins(100, "epoch", None)
    assert _one(wire.window_end(200, "step", True)) == WindowEnds(200, "step", True, None)
    assert _one(wire.window_end(200, None, False)) == WindowEnds(200, None, False, None)
    assert _one(wire.window_end(200, "fetch", False, {"pipeline_s": 0.25, "workers": 2})) == \
        WindowEnds(200, "fetch", False, {"pipeline_s": 0.25, "workers": 2.0})
    assert _one(wire.alloc("make", "m.py", 3, 4096)) == AllocRecord("make", "m.py", 3, 4096)
    assert _one(wire.exception(5, "Traceback\n  boom")) == ExceptionRecord("Traceback\n  boom")
    assert _one(wire.note("a\\b")) == NoteRecord("a\\b")
    assert _one(wire.lost(1_000, 3_000, 64)) == LostRecord(1_000, 3_000, 64)
    assert _one(wire.gpu(9)) == GpuRecord()
    assert _one(wire.end(9)) == EndRecord()
    h = _one(wire.header(41, 1, 7, True, "2", "0", "[worker]", "python t.py"))
    assert isinstance(h, wire.Header) and (h.pid, h.ppid, h.t_ns, h.forked, h.rank, h.label) == (41, 1, 7, True, "2",
                                                                                                  "[worker]")


def test_a_line_cut_short_or_damaged_parses_to_nothing() -> None:
    tick = wire.decode(wire.encode(wire.tick(10, 20, 300, 40, 5_000)))[0]
    assert parse(tick[:-1]) is None  # the empty last field that says the line is whole is missing
    assert parse(tick[:4]) is None
    assert parse([wire.SAMPLE, "3", "2x5", "1", ""]) is None  # a number cut by a failed write
    assert parse([wire.STACK, "1", "0,,2"]) is None
    assert parse([wire.FRAME, "1", "f"]) is None
    assert parse([wire.WINDOW, "b", "100", "step"]) is None  # a begin without its index field
    assert parse(["?", "1"]) is None  # a kind this reader does not know
    assert parse([wire.HEADER, str(wire.VERSION + 1), "1", "0", "5", "0", "", "", "", "python"]) is None
    lines = [wire.frame(0, "f", "a.py", 1), "T\t1\t2\n", wire.sample(0, 5, True)]
    assert parse_all(wire.decode(wire.encode("".join(lines)))) == [FrameRecord(0, "f", "a.py", 1),
                                                                    SampleRecord(0, 5, True)]


@settings(max_examples=200, deadline=None)
@given(function=st.text(), file=st.text(), line=st.integers(0, 1 << 31), fid=st.integers(0, 1 << 20))
def test_text_fields_come_back_as_written(function: str, file: str, line: int, fid: int) -> None:
    assert _one(wire.frame(fid, function, file, line)) == FrameRecord(fid, function, file, line)
    assert _one(wire.note(function)) == NoteRecord(function)


def test_a_spool_files_name_says_when_its_process_began() -> None:
    assert spool_started(f"123-987654321{wire.SPOOL_SUFFIX}") == 987654321
    assert spool_started(f"123{wire.SPOOL_SUFFIX}") is None
    assert spool_started(f"123-x{wire.SPOOL_SUFFIX}") is None
    assert spool_started(f"123-5{wire.REPLY_SUFFIX}") is None


def test_kernel_records_round_trip_and_a_cut_one_is_refused() -> None:
    """The kernel records (cycle, path, busy, names, counts) end with a tab like ticks and samples: each
    parses whole, and every prefix a failed write can leave (any cut, the writer ending the line at its
    next write) parses to nothing, never to a record with a number cut short (busy 999 for 999999.5)."""
    from energyprof.supervise.records import KernelBusy, KernelCounts, KernelCycle, KernelNames, KernelPath

    lines = {
        wire.kernel_cycle(10, 20, 7, 300): KernelCycle(10, 20, 7, 300),
        wire.kernel_path(3, (("f", "a.py", 12), ("g", "b.py", 345))): KernelPath(3, (("f", "a.py", 12), ("g", "b.py", 345))),
        wire.kernel_busy(3, 0, 1_000_000, {1: 250000.0, 2: 999999.5}): KernelBusy(3, 0, 1_000_000, {1: 250000.0, 2: 999999.5}),
        wire.kernel_names(3, 0, {"gemm": [12, 4096.5], "relu": [3, 77.25]}): KernelNames(3, 0, {"gemm": (12, 4096.5),
                                                                                              "relu": (3, 77.25)}),
        wire.kernel_counts({"unlinked": 4, "no path": 15}): KernelCounts({"unlinked": 4, "no path": 15}),
    }
    for line, record in lines.items():
        assert _one(line) == record
        body = line[:-1]  # without its newline
        for cut in range(1, len(body)):
            (fields,) = wire.decode(wire.encode(body[:cut] + "\n"))
            assert parse(fields) is None, body[:cut]
