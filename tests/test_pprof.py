"""--pprof: decoded with the published perftools.profiles schema (github.com/google/pprof,
proto/profile.proto), built here as descriptors, so the test reads the file as pprof would."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import run_cli
from energyprof.analysis.report import RenderOptions, ReportModel, build
from energyprof.facts.profile import IDLE_NODE
from energyprof.facts.profile import SELF_NODE
from energyprof.facts.profile import Node
from energyprof.facts.profile import Profile
from energyprof.facts.profile import load
from energyprof.store.files import write_text
from energyprof.render.pprof import pprof_bytes, pprof_gzip

pb = pytest.importorskip("google.protobuf", reason="the protobuf package decodes the file")

# (name, number, type, label, message type) per field, as published in profile.proto
I64, U64, STR, BOOL, MSG = "TYPE_INT64", "TYPE_UINT64", "TYPE_STRING", "TYPE_BOOL", "TYPE_MESSAGE"
REP, OPT = "LABEL_REPEATED", "LABEL_OPTIONAL"
MESSAGES = {
    "Profile": [("sample_type", 1, MSG, REP, "ValueType"), ("sample", 2, MSG, REP, "Sample"),
                ("mapping", 3, MSG, REP, "Mapping"), ("location", 4, MSG, REP, "Location"),
                ("function", 5, MSG, REP, "Function"), ("string_table", 6, STR, REP, None),
                ("drop_frames", 7, I64, OPT, None), ("keep_frames", 8, I64, OPT, None),
                ("time_nanos", 9, I64, OPT, None), ("duration_nanos", 10, I64, OPT, None),
                ("period_type", 11, MSG, OPT, "ValueType"), ("period", 12, I64, OPT, None),
                ("comment", 13, I64, REP, None), ("default_sample_type", 14, I64, OPT, None)],
    "ValueType": [("type", 1, I64, OPT, None), ("unit", 2, I64, OPT, None)],
    "Sample": [("location_id", 1, U64, REP, None), ("value", 2, I64, REP, None), ("label", 3, MSG, REP, "Label")],
    "Label": [("key", 1, I64, OPT, None), ("str", 2, I64, OPT, None), ("num", 3, I64, OPT, None),
              ("num_unit", 4, I64, OPT, None)],
    "Mapping": [("id", 1, U64, OPT, None), ("memory_start", 2, U64, OPT, None), ("memory_limit", 3, U64, OPT, None),
                ("file_offset", 4, U64, OPT, None), ("filename", 5, I64, OPT, None), ("build_id", 6, I64, OPT, None),
                ("has_functions", 7, BOOL, OPT, None), ("has_filenames", 8, BOOL, OPT, None),
                ("has_line_numbers", 9, BOOL, OPT, None), ("has_inline_frames", 10, BOOL, OPT, None)],
    "Location": [("id", 1, U64, OPT, None), ("mapping_id", 2, U64, OPT, None), ("address", 3, U64, OPT, None),
                 ("line", 4, MSG, REP, "Line"), ("is_folded", 5, BOOL, OPT, None)],
    "Line": [("function_id", 1, U64, OPT, None), ("line", 2, I64, OPT, None)],
    "Function": [("id", 1, U64, OPT, None), ("name", 2, I64, OPT, None), ("system_name", 3, I64, OPT, None),
                 ("filename", 4, I64, OPT, None), ("start_line", 5, I64, OPT, None)],
}


@pytest.fixture(scope="module")
def ProfileMessage():
    return _message_class()


_CLASS: list = []


def _message_class():
    if _CLASS:
        return _CLASS[0]
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FileDescriptorProto(name="profile.proto", package="perftools.profiles", syntax="proto3")
    for name, fields in MESSAGES.items():
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            fd = m.field.add(name=fname, number=number, type=getattr(descriptor_pb2.FieldDescriptorProto, ftype),
                             label=getattr(descriptor_pb2.FieldDescriptorProto, label))
            if type_name:
                fd.type_name = f".perftools.profiles.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    _CLASS.append(message_factory.GetMessageClass(pool.FindMessageTypeByName("perftools.profiles.Profile")))
    return _CLASS[0]


def model(p: Profile) -> ReportModel:
    """The report model pprof renders: the run under its own policy, no carbon."""
    return build(p, RenderOptions(carbon=None))


def decode(ProfileMessage, raw: bytes):
    msg = ProfileMessage()
    msg.ParseFromString(raw)
    return msg


def sums(msg) -> dict[str, int]:
    names = [msg.string_table[t.type] for t in msg.sample_type]
    return {n: sum(s.value[i] for s in msg.sample) for i, n in enumerate(names)}


def test_a_real_run_decodes_and_sums_to_the_totals(tmp_path: Path, ProfileMessage) -> None:
    (tmp_path / "t.csv").write_text("t_s,cpu,dram\n0,40,5\n")
    (tmp_path / "w.py").write_text(
        "import time\n"
        "def crunch():\n    end = time.perf_counter() + 0.3\n    while time.perf_counter() < end: pass\n"
        "def rest():\n    time.sleep(0.2)\n"
        "crunch()\nrest()\n")
    res = run_cli(["-q", "--power-trace", "t.csv", "--json", "p.json", "--pprof", "p.pb.gz", "-o", "r.html", "w.py"],
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    profile = load(tmp_path / "p.json")
    raw = (tmp_path / "p.pb.gz").read_bytes()
    assert raw[:2] == b"\x1f\x8b"  # gzipped, as pprof reads it
    msg = decode(ProfileMessage, gzip.decompress(raw))
    assert msg.string_table[0] == ""
    units = [(msg.string_table[t.type], msg.string_table[t.unit]) for t in msg.sample_type]
    assert units == [("energy_cpu", "microjoules"), ("energy_dram", "microjoules"), ("cpu", "nanoseconds"),
                     ("wall", "nanoseconds")]
    got = sums(msg)
    # the program's nodes: the idle node and energyprof's own are not the program's (no pprof sample)
    not_program = [n for n in profile.root.children if n.function in (IDLE_NODE, SELF_NODE)]
    assert not_program and sum(n.total_energy for n in not_program) > 0
    nodes = [n for n, _ in profile.nodes() if all(n is not x for x in not_program)]  # leaves, both
    for sid in ("cpu", "dram"):
        # exactly the rounded sum of the program's self energies, and that is the program's total, as in the
        # report (conservation: the rest is the idle node's and energyprof's)
        assert got[f"energy_{sid}"] == round(sum(n.self_energy_j.get(sid, 0.0) for n in nodes) * 1e6)
        assert abs(got[f"energy_{sid}"] - profile.totals["attributed_j"][sid] * 1e6) <= 1
        assert got[f"energy_{sid}"] < profile.totals["energy_j"][sid] * 1e6  # not the machine's
    assert got["wall"] == round(sum(n.self_time_s for n in nodes) * 1e9)
    assert abs(got["wall"] - profile.root.time_s * 1e9) <= 1
    assert got["cpu"] == round(sum(n.self_cpu_time_s for n in nodes) * 1e9)

    functions = {f.id: f for f in msg.function}
    locations = {loc.id: loc for loc in msg.location}
    crunch = next(f for f in msg.function if msg.string_table[f.name] == "crunch")
    assert msg.string_table[crunch.filename].endswith("w.py") and crunch.start_line == 2
    leaf_first = [s for s in msg.sample if locations[s.location_id[0]].line[0].function_id == crunch.id]
    assert leaf_first, "no sample has crunch as its leaf"
    for s in msg.sample:
        assert all(loc in locations for loc in s.location_id)
        assert all(locations[loc].line[0].function_id in functions for loc in s.location_id)
        root = functions[locations[s.location_id[-1]].line[0].function_id]
        assert msg.string_table[root.name] == profile.root.function  # the bottom frame is the program
        labels = {msg.string_table[lb.key]: lb for lb in s.label}
        assert msg.string_table[labels["process"].str] == f"[process {profile.meta['pid']}]"
    assert msg.duration_nanos == round(profile.totals["duration_s"] * 1e9)
    assert msg.string_table[msg.default_sample_type] == "energy_cpu"


def test_ranks_processes_and_exact_integers(tmp_path: Path, ProfileMessage) -> None:
    """Thirds of a joule in three places: rounded as a running total, they still sum exactly."""
    third = 1.0 / 3.0

    def leaf(name: str) -> Node:
        return Node(name, "t.py", 7, time_s=third, self_time_s=third, cpu_time_s=third, self_cpu_time_s=third,
                    samples=1, self_samples=1, energy_j={"gpu:0": third}, self_energy_j={"gpu:0": third})

    rank = Node("[rank 1]", energy_j={"gpu:0": 2 * third}, self_energy_j={"gpu:0": 0.0}, time_s=2 * third,
                children=[leaf("a"), leaf("b")])
    root = Node("job", energy_j={"gpu:0": 1.0}, self_energy_j={"gpu:0": 0.0}, time_s=1.0, children=[rank, leaf("c")])
    p = Profile(meta={"pid": 42, "host": {"hostname": "node-7"}}, root=root,
                sources=[{"id": "gpu:0", "component": "gpu:0", "method": "measured"}],
                totals={"energy_j": {"gpu:0": 1.0}, "attributed_j": {"gpu:0": 1.0}, "duration_s": 1.0})
    path = tmp_path / "x.pb.gz"
    write_text(str(path), pprof_gzip(model(p)))
    msg = decode(ProfileMessage, gzip.decompress(path.read_bytes()))
    assert sums(msg) == {"energy_gpu:0": 1_000_000, "cpu": 1_000_000_000, "wall": 1_000_000_000}
    assert len(msg.sample) == 3
    by_leaf = {}
    for s in msg.sample:
        fn = {f.id: f for f in msg.function}[s.location_id[0]]
        by_leaf[msg.string_table[fn.name]] = {msg.string_table[lb.key]: lb for lb in s.label}
    assert by_leaf["a"]["rank"].num == 1 and msg.string_table[by_leaf["a"]["process"].str] == "[rank 1]"
    assert "rank" not in by_leaf["c"] and msg.string_table[by_leaf["c"]["process"].str] == "[process 42]"
    assert all(msg.string_table[labels["node"].str] == "node-7" for labels in by_leaf.values())
    assert gzip.decompress(path.read_bytes()) == pprof_bytes(model(p))  # deterministic bytes


@st.composite
def trees(draw) -> Node:
    """Random trees of self energies on two sources (joules with many digits) and times."""
    count = draw(st.integers(1, 30))
    nodes = []
    for i in range(count):
        e = draw(st.tuples(st.floats(0, 50), st.floats(0, 5)))
        t = draw(st.floats(0, 3))
        nodes.append(Node(f"f{i}", "m.py", i, self_time_s=t, self_cpu_time_s=t / 2,
                          self_energy_j={"cpu": e[0], "gpu:0": e[1]}))
        if i:
            nodes[draw(st.integers(0, i - 1))].children.append(nodes[i])
    return nodes[0]


@settings(max_examples=40, deadline=None)
@given(trees())
def test_every_sample_type_sums_exactly(root: Node) -> None:
    """Whatever the tree, each type's integer samples add up to the rounded sum of its self figures."""
    p = Profile(meta={}, root=root, totals={"energy_j": {}, "attributed_j": {}, "duration_s": 0.0},
                sources=[{"id": "cpu", "method": "measured"}, {"id": "gpu:0", "method": "measured"}])
    msg = decode(_message_class(), pprof_bytes(model(p)))
    got = sums(msg)
    nodes = [n for n, _ in root.walk()]
    assert got["energy_cpu"] == round(sum(n.self_energy_j["cpu"] for n in nodes) * 1e6)
    assert got["energy_gpu:0"] == round(sum(n.self_energy_j["gpu:0"] for n in nodes) * 1e6)
    assert got["wall"] == round(sum(n.self_time_s for n in nodes) * 1e9)
    assert all(v >= 0 for s in msg.sample for v in s.value)
