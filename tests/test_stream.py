"""The spool's wire format: what a sampler writes, the supervisor reads back, in order,
across file segments, with any text in names; read files are deleted."""

from __future__ import annotations

import os

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from energyprof.agent import spool as spool_module
from energyprof.supervise.stream import StreamReader, unescape


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1), st.text(), st.integers(0, 10**6)), min_size=1, max_size=60),
       st.integers(64, 4096), st.integers(1, 9))
def test_frames_round_trip_across_segments(tmp_path_factory, frames, segment, every):
    d = tmp_path_factory.mktemp("spool")
    old = spool_module.SEGMENT_BYTES
    spool_module.SEGMENT_BYTES = segment
    try:
        path = str(d / "7-1.spool")
        spool = spool_module.Spool(path)
        reader = StreamReader(path)
        got = []
        for i, fr in enumerate(frames):
            spool.frame(i, fr)
            if i % every == 0:
                spool.flush()
                got += reader.read()
        spool.flush()
        got += reader.read()
    finally:
        spool_module.SEGMENT_BYTES = old
    assert [(unescape(r[2]), unescape(r[3]), int(r[4])) for r in got] == frames
    assert len(os.listdir(d)) == 1  # every file read to its end is gone


def test_a_line_cut_by_a_kill_is_left_for_later(tmp_path):
    path = tmp_path / "1-1.spool"
    path.write_bytes(b"T\t1\t2\t3\t4\t5\t\ns\t0\t1")
    reader = StreamReader(str(path))
    assert reader.read() == [["T", "1", "2", "3", "4", "5", ""]]
    with open(path, "ab") as fh:
        fh.write(b"0\t1\t\n")
    assert reader.read() == [["s", "0", "10", "1", ""]]


@pytest.mark.parametrize("side", ["writer", "reader"])
def test_a_segment_that_cannot_be_opened_once_is_tried_again_and_said(tmp_path, monkeypatch, side):
    """Defect: when the supervisor's open of a spool's next file failed once (too many open
    files), the stream stopped there for the rest of the run, without a word: 19 of 100 records
    came. Both ends now try the move again at their next turn, and say that they had to."""
    import errno

    from energyprof.agent import wire

    monkeypatch.setattr(spool_module, "SEGMENT_BYTES", 100)
    path = str(tmp_path / "7-1.spool")
    spool = spool_module.Spool(path)
    reader = StreamReader(path)
    real_open, failed = os.open, []

    def open_failing_once(name, flags, *more):
        writing = flags & (os.O_WRONLY | os.O_RDWR) != 0
        if name.endswith(".1") and writing == (side == "writer") and not failed:
            failed.append(name)
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(name, flags, *more)

    monkeypatch.setattr(os, "open", open_failing_once)
    records = []
    for i in range(100):
        spool.event(wire.note(f"n{i}"))
        spool.flush()
        records += reader.read()
    assert failed  # the fault happened
    notes = [unescape(r[1]) for r in records if r[0] == wire.NOTE]
    assert [n for n in notes if n.startswith("n")] == [f"n{i}" for i in range(100)]
    said = [n for n in notes if not n.startswith("n")] + [r[0] for r in records if r[0] == wire.LOST]
    assert len(said) == 1, said  # the writer's LOST record, or the reader's one note
    if side == "reader":
        assert os.strerror(errno.EMFILE) in said[0]
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path) + ".5"]  # each file read was deleted
