"""`energyprof gpu-trace` on hostile and large input: one line and exit 2, never a traceback; a
large trace read in bounded memory (a subprocess's peak RSS, not wall-clock)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import run_cli
from energyprof.collect.kernels import kineto
from energyprof.collect.kernels.jsonstream import StreamError, TraceStream

GOOD_EVENTS = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0.0, "dur": 50.0},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10.0, "dur": 1.0,
     "args": {"correlation": 1}},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 20.0, "dur": 30.0,
     "args": {"device": 0, "stream": 7, "correlation": 1}},
]
GOOD = json.dumps({"schemaVersion": 1, "traceEvents": GOOD_EVENTS})


def _hostile() -> dict[str, bytes]:
    ev = json.dumps(GOOD_EVENTS[0])
    return {
        "nan_ts": GOOD.replace('"ts": 20.0', '"ts": NaN').encode(),
        "infinity_dur": GOOD.replace('"dur": 30.0', '"dur": Infinity').encode(),
        "minus_infinity": GOOD.replace('"ts": 0.0', '"ts": -Infinity').encode(),
        "deep_nesting": ('{"traceEvents": [' + ev + ', {"args": ' + "[" * 10_000 + "]" * 10_000 + "}]}").encode(),
        "deep_top_level": ("[" * 10_000 + "]" * 10_000).encode(),
        "truncated": GOOD.encode()[: len(GOOD) // 2],
        "truncated_after_array": GOOD.encode()[:-1],
        "truncated_gzip": gzip.compress(GOOD.encode())[:-12],
        "gzip_garbage": b"\x1f\x8b\x08\x00garbage",
        "events_not_a_list": b'{"traceEvents": 5}',
        "no_events_key": b'{"schema": "something else"}',
        "events_of_wrong_types": json.dumps({"traceEvents": [1, "x", None, [], {"ph": "X", "ts": "abc", "dur": []},
                                                             {"ph": ["X"], "pid": [1], "tid": {}}]}).encode(),
        "huge_numbers_only": json.dumps({"traceEvents": [dict(e, ts=1e300) for e in GOOD_EVENTS]}).encode(),
        "overflowing_float": GOOD.replace('"ts": 20.0', '"ts": 1e999').replace('"ts": 0.0', '"ts": 1e999').replace(
            '"ts": 10.0', '"ts": 1e999').encode(),
        "int_of_5000_digits": GOOD.replace('"ts": 20.0', '"ts": ' + "9" * 5000).encode(),
        "not_json": b"\x00\x01\x02 this is not json",
        "not_utf8": b'{"traceEvents": [{"name": "\xff\xfe"}]}',
        "empty": b"",
        "a_string": b'"traceEvents"',
        "text_after_the_document": (GOOD + " trailing").encode(),
        "unterminated_string": b'{"traceEvents": [{"name": "abc',
        "bad_separator": GOOD.replace('}, {', '} {', 1).encode(),
    }


@pytest.mark.parametrize("name", sorted(_hostile()))
def test_a_hostile_trace_is_one_line_and_exit_2(tmp_path, name):
    trace = tmp_path / "t.json"
    trace.write_bytes(_hostile()[name])
    power = tmp_path / "p.csv"
    power.write_text("t_s,gpu:0\n0,100\n")
    r = run_cli(["gpu-trace", str(trace), "--power-trace", str(power), "--json", str(tmp_path / "o.json")], tmp_path)
    assert r.returncode == 2, (name, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(trace) in lines[0] or "trace" in lines[0]


def test_wrong_types_inside_a_good_trace_are_left_out_and_counted(tmp_path):
    doc = {"traceEvents": GOOD_EVENTS + [{"ph": "X", "cat": "kernel", "ts": "soon", "dur": 1},
                                         {"ph": "X", "cat": "kernel", "ts": 1e300, "dur": 1},
                                         {"ph": "X", "cat": {"a": 1}, "name": ["x"], "pid": [1], "tid": {"t": 2},
                                          "ts": 5.0, "dur": 1.0, "args": "none"}]}
    t = kineto.parse(doc)
    assert len(t.kernels) == 1 and t.skipped == 2
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(doc))
    (tmp_path / "p.csv").write_text("t_s,gpu:0\n0,100\n")
    r = run_cli(["gpu-trace", str(trace), "--power-trace", str(tmp_path / "p.csv"), "--json", str(tmp_path / "o.json")],
                tmp_path)
    assert r.returncode == 0, r.stderr
    assert "2 complete event(s) of the trace have no usable time" in r.stderr


def _stream(text: str, chunk: int) -> tuple[list, dict]:
    import io

    s = TraceStream(io.BytesIO(text.encode()), keep=frozenset({"baseTimeNanoseconds", "traceName"}), chunk=chunk)
    return list(s.events()), s.meta


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_the_stream_reads_what_json_reads_at_any_chunk_size(chunk):
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": 1735632360000000000, "deviceProperties": [{"id": 0}],
           "traceEvents": GOOD_EVENTS + [{"ph": "i", "name": "\u00e9\\\"\u2603", "ts": 1.5e-3, "x": [True, False, None]}],
           "traceName": "t.json"}
    text = json.dumps(doc, indent=1)
    events, meta = _stream(text, chunk)
    assert events == doc["traceEvents"]
    assert meta == {"baseTimeNanoseconds": 1735632360000000000, "traceName": "t.json"}
    # Chrome's array format, whose closing bracket may be missing
    assert _stream(json.dumps(GOOD_EVENTS), chunk)[0] == GOOD_EVENTS
    assert _stream(json.dumps(GOOD_EVENTS)[:-1] + ",\n", chunk)[0] == GOOD_EVENTS
    # a number split by a chunk edge is not cut short
    assert _stream('{"baseTimeNanoseconds": 12345678901234567, "traceEvents": []}', chunk)[1] == \
        {"baseTimeNanoseconds": 12345678901234567}
    with pytest.raises(StreamError):
        _stream('{"traceEvents": [1.5.5]}', chunk)


def test_an_event_larger_than_the_limit_is_refused(monkeypatch):
    from energyprof.collect.kernels import jsonstream

    monkeypatch.setattr(jsonstream, "MAX_VALUE_CHARS", 1000)
    with pytest.raises(StreamError, match="over"):
        _stream('{"traceEvents": [{"name": "' + "x" * 5000 + '"}]}', 64)
    # a chunk that holds the whole value at once (a plain file read in 1 MiB chunks): refused all the same
    with pytest.raises(StreamError, match="over"):
        _stream('{"traceEvents": [{"name": "' + "x" * 1500 + '"}]}', 1 << 16)
    # a value that grows past the bound is never read far past it
    assert _stream('{"traceEvents": [{"name": "' + "x" * 900 + '"}]}', 1 << 16)[0][0]["name"] == "x" * 900


def test_a_huge_string_in_a_plain_json_trace_is_one_line_and_exit_2(tmp_path):
    """gpu-trace on a plain (not gzipped) trace holding a string past the bound: one line, exit 2."""
    import subprocess
    import sys

    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [{"name": "' + "x" * ((64 << 20) + 10) + '", "ph": "X"}]}')
    (tmp_path / "p.csv").write_text("t_s,gpu:0\n0,100\n")
    r = subprocess.run([sys.executable, "-m", "energyprof", "gpu-trace", str(trace), "--power-trace", str(tmp_path / "p.csv"),
                        "--json", str(tmp_path / "o.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "64 MiB" in r.stderr, r.stderr


# ---------------------------------------------------------------- bounded memory

PEAK = textwrap.dedent("""
    import resource, subprocess, sys
    r = subprocess.run([sys.executable, "-m", "energyprof", *sys.argv[1:]], capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)  # KiB on Linux
""")


def _peak_kib(tmp_path: Path, trace: Path) -> int:
    power = tmp_path / "p.csv"
    power.write_text("t_s,gpu:0\n0,100\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent.parent))
    r = subprocess.run([sys.executable, "-c", PEAK, "gpu-trace", str(trace), "--power-trace", str(power),
                        "--json", str(tmp_path / (trace.name + ".out.json")), "-q"],
                       capture_output=True, text=True, env=env, timeout=300)
    rc, kib = r.stdout.split()
    assert rc == "0", r.stderr
    return int(kib)


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB is Linux's")
def test_a_large_trace_is_read_in_bounded_memory(tmp_path):
    head = '{"schemaVersion": 1, "traceEvents": [' + ", ".join(json.dumps(e) for e in GOOD_EVENTS)
    pad = 96 << 20  # 96 MiB of whitespace between events: json.load holds it all (as bytes, then as text)
    small, big, big_gz = tmp_path / "small.json", tmp_path / "big.json", tmp_path / "big.json.gz"
    small.write_text(head + "]}")
    with open(big, "w") as fh:
        fh.write(head)
        block = " " * (1 << 20)
        for _ in range(pad >> 20):
            fh.write(block)
        fh.write(", " + json.dumps(GOOD_EVENTS[0]) + "]}")
    with open(big, "rb") as src, gzip.open(big_gz, "wb", compresslevel=1) as dst:
        while chunk := src.read(1 << 22):
            dst.write(chunk)
    base = _peak_kib(tmp_path, small)
    # the file is 96 MiB; reading it whole would add at least that; the stream adds a few chunks
    for trace in (big, big_gz):
        grown_mib = (_peak_kib(tmp_path, trace) - base) / 1024
        assert grown_mib < 24, (trace.name, grown_mib)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                           | st.text(max_size=8), lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=6), kids, max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6), json_values, max_size=4), st.lists(json_values, max_size=6),
       st.integers(1, 40), st.booleans())
def test_the_stream_equals_json_on_any_document(extra, events, chunk, indent):
    doc = dict(extra, traceEvents=events)
    text = json.dumps(doc, indent=1 if indent else None)
    got, meta = _stream(text, chunk)
    assert got == json.loads(text)["traceEvents"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(GOOD)), st.integers(0, 8), st.binary(max_size=4)), min_size=1, max_size=4))
def test_a_damaged_trace_is_read_or_refused_never_a_crash(edits):
    import tempfile

    data = bytearray(GOOD.encode())
    for at, cut, insert in edits:  # delete `cut` bytes at `at`, put `insert` there
        data[at:at + cut] = insert
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.json"
        path.write_bytes(bytes(data))
        try:
            kineto.load(path)
        except kineto.TraceFormatError as exc:
            assert "\n" not in str(exc)
