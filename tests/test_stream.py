"""The spool's wire format: what a sampler writes, the supervisor reads back, in order,
across file segments, with any text in names; read files are deleted."""

from __future__ import annotations

import os

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
