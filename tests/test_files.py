"""files.py: writing a report never changes the process's umask, and a new file is 0666 less it."""

from __future__ import annotations

import os
import stat

import pytest

from energyprof.store import files


@pytest.mark.parametrize("mask", [0o077, 0o022, 0o002])
def test_a_new_report_follows_the_umask_without_setting_it(tmp_path, monkeypatch, mask) -> None:
    """Defect: writing a report set the umask to 022 for a moment to read it, so a program thread
    creating a file then made it 0644 where its own umask said 0600."""
    set_by_us: list[int] = []
    real_umask = os.umask

    def watched(value: int) -> int:  # the test's own calls go to real_umask, not through here
        set_by_us.append(value)
        return real_umask(value)

    before = real_umask(mask)
    try:
        monkeypatch.setattr(os, "umask", watched)
        files.write_text(str(tmp_path / "r.html"), "<p>report</p>")
        (tmp_path / "kept.json").write_text("{}")
        os.chmod(tmp_path / "kept.json", 0o640)
        files.write_text(str(tmp_path / "kept.json"), "{}\n")
    finally:
        monkeypatch.undo()
        real_umask(before)
    assert set_by_us == []
    assert stat.S_IMODE(os.stat(tmp_path / "r.html").st_mode) == 0o666 & ~mask
    assert stat.S_IMODE(os.stat(tmp_path / "kept.json").st_mode) == 0o640  # an existing file keeps its mode
    assert (tmp_path / "r.html").read_text() == "<p>report</p>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json", "r.html"]  # no temporary left behind


# ---------------------------------------------------------------- files written as root

import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

from conftest import run_cli  # noqa: E402

OTHER_UID = 65534  # nobody: a user who is not us
PROGRAM = "from pathlib import Path\nPath('ran.txt').write_text('yes')\nprint('hello')\n"
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="a link owned by another user can be made by root only")


def _shared_folder_with_a_planted_link(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A folder like /tmp (world-writable, sticky) holding another user's link to a file of ours."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    link = shared / name
    os.symlink(victim, link)
    os.lchown(link, OTHER_UID, OTHER_UID)
    return shared, victim


@needs_root
@pytest.mark.parametrize("flag, name", [("--emissions-csv", "emissions.csv"), ("-o", "r.html"), ("--json", "p.json")])
def test_another_users_link_in_a_sticky_folder_is_refused_before_the_run(tmp_path: Path, flag: str, name: str) -> None:
    """Defect: as root, `--emissions-csv /tmp/x` followed another user's link planted there (the
    protected_symlinks rule that the kernel applies to opens was stepped around by reading the link):
    one line, exit 2, the program not run and the link's target untouched."""
    shared, victim = _shared_folder_with_a_planted_link(tmp_path, name)
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,40\n")
    (tmp_path / "w.py").write_text(PROGRAM)
    res = run_cli(["--power-trace", "trace.csv", "-q", flag, str(shared / name), "w.py"], cwd=tmp_path, timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "protected_symlinks" in lines[0] and lines[0].startswith("energyprof: error:"), res.stderr
    assert not (tmp_path / "ran.txt").exists() and res.stdout == ""
    assert victim.read_text() == "precious\n"


@needs_root
def test_the_writers_refuse_the_link_that_appears_after_the_check(tmp_path: Path) -> None:
    """A link planted after the preflight (a ten-hour run gives time) is refused where the file is written."""
    from energyprof.output.emissions import append

    shared, victim = _shared_folder_with_a_planted_link(tmp_path, "e.csv")
    with pytest.raises(files.ProtectedLink, match="protected_symlinks"):
        files.write_text(str(shared / "e.csv"), "x")
    with pytest.raises(files.ProtectedLink):
        append(str(shared / "e.csv"), [{"duration": 1.0}])
    with pytest.raises(files.ProtectedLink):
        files.write_text(str(shared / "e.csv" / ".." / "e.csv"), "x")
    assert victim.read_text() == "precious\n"


@needs_root
def test_links_the_kernel_would_follow_are_followed(tmp_path: Path) -> None:
    """Our own link in a shared folder, a link of the folder's owner, and any link in a folder that is not
    shared: written through to their targets, as before."""
    shared, victim = _shared_folder_with_a_planted_link(tmp_path, "theirs")
    os.symlink(victim, shared / "ours")
    files.write_text(str(shared / "ours"), "ours\n")
    assert victim.read_text() == "ours\n" and (shared / "ours").is_symlink()
    owned = tmp_path / "owned"
    owned.mkdir()
    os.chmod(owned, 0o1777)
    os.chown(owned, OTHER_UID, OTHER_UID)
    os.symlink(victim, owned / "by-owner")
    os.lchown(owned / "by-owner", OTHER_UID, OTHER_UID)
    files.write_text(str(owned / "by-owner"), "owner\n")
    assert victim.read_text() == "owner\n"
    private = tmp_path / "private"
    private.mkdir()
    os.symlink(victim, private / "link")
    os.lchown(private / "link", OTHER_UID, OTHER_UID)
    files.write_text(str(private / "link"), "private\n")
    assert victim.read_text() == "private\n"


def test_emissions_csv_on_a_fifo_is_refused_before_the_run(tmp_path: Path) -> None:
    """Defect: `--emissions-csv FIFO` with no reader blocked the run's end for ever. A log that is
    appended to and read back is refused before the program starts."""
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,40\n")
    (tmp_path / "w.py").write_text(PROGRAM)
    res = run_cli(["--power-trace", "trace.csv", "-q", "--emissions-csv", "pipe", "w.py"], cwd=tmp_path, timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "FIFO" in lines[0] and not (tmp_path / "ran.txt").exists()


WRITE_TO_FIFO = """
import sys, time
from energyprof.store import files
t = time.monotonic()
try:
    getattr(files, sys.argv[2])(sys.argv[1], "data\\n")
except OSError as exc:
    print(type(exc).__name__, exc, round(time.monotonic() - t, 1))
"""


@pytest.mark.parametrize("how", ["write_text", "append_text"])
def test_a_fifo_with_no_reader_fails_in_a_bounded_time(tmp_path: Path, how: str) -> None:
    """Defect: an output on a FIFO that no process reads blocked in open() for ever. It fails after
    FIFO_WAIT_S with one line (the run keeps its profile, as for any output that fails)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    if not hasattr(files, how):
        pytest.fail(f"store.files has no {how}")
    try:
        done = subprocess.run([sys.executable, "-c", WRITE_TO_FIFO, str(fifo), how], capture_output=True, text=True,
                              timeout=60, env=env, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the write blocked on a FIFO with no reader")
    assert done.stdout.startswith("NoReader") and "no process is reading the FIFO" in done.stdout, done.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_fifo_with_a_reader_is_written_through(tmp_path: Path) -> None:
    """A reader that opens after the write began (within FIFO_WAIT_S) gets all of it, however large."""
    import time

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def late_reader() -> None:
        time.sleep(0.2)
        got.append(fifo.read_bytes())

    reader = threading.Thread(target=late_reader)
    reader.start()
    big = "x" * (1 << 20) + "\n"  # many times a pipe's buffer: the writer waits for the reader between writes
    files.write_text(str(fifo), big)
    reader.join(30)
    assert got == [big.encode()]


def test_a_lone_surrogate_is_written_as_its_escape(tmp_path: Path) -> None:
    """A name with a lone surrogate (no UTF-8 form) never loses a file: it is written as its escape."""
    files.write_text(str(tmp_path / "a.txt"), "bad\ud800name\n")
    assert (tmp_path / "a.txt").read_text() == "bad\\ud800name\n"


@pytest.fixture(scope="module")
def link_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folders, relative and absolute links, a chain, a dangling link and a loop."""
    d = tmp_path_factory.mktemp("links")
    (d / "a" / "b").mkdir(parents=True)
    (d / "a" / "b" / "f.txt").write_text("")
    os.symlink("a/b", d / "l")
    os.symlink("../x.txt", d / "a" / "b" / "rel")
    os.symlink(str(d / "a"), d / "abs")
    os.symlink("b/../../l", d / "a" / "chain")
    os.symlink("nowhere/deeper", d / "dangling")
    os.symlink(str(d / "loop"), d / "loop")
    return d


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "l", "rel", "abs", "chain", "dangling", "loop", "f.txt", "new", "..", ".", ""]),
                min_size=1, max_size=7))
def test_the_writers_resolution_is_realpaths(link_tree: Path, parts: list[str]) -> None:
    """Property: walking links one by one (to apply the protected_symlinks rule) resolves every path as
    os.path.realpath does, so a file is written where it was before wherever no link is refused."""
    path = str(link_tree) + "/" + "/".join(parts)
    assert files.resolve(path) == os.path.realpath(path)


def test_a_fifo_whose_reader_takes_nothing_fails_in_a_bounded_time(tmp_path: Path, monkeypatch) -> None:
    """A reader that opened the FIFO and never reads holds a write of more than the pipe's buffer: after
    FIFO_STALL_S without progress it fails with one line, never for ever."""
    monkeypatch.setattr(files, "FIFO_STALL_S", 0.2)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    opened = threading.Event()
    release = threading.Event()

    def idle_reader() -> None:
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        opened.set()
        release.wait(30)
        os.close(fd)

    reader = threading.Thread(target=idle_reader)
    reader.start()
    assert opened.wait(30)
    try:
        with pytest.raises(files.NoReader, match="took nothing"):
            files.write_text(str(fifo), "x" * (4 << 20))
    finally:
        release.set()
        reader.join(30)


@given(st.lists(st.tuples(st.binary(max_size=300), st.booleans()), max_size=5))
@settings(max_examples=25, deadline=None)
def test_parts_are_written_as_their_concatenation(drawn: list[tuple[bytes, bool]]) -> None:
    """The page's three parts (plotly.js never copied into one object with the rest, but from its file) land
    as one joined object would: in a regular file (replaced), through an open descriptor (at its offset),
    through a device, through a FIFO (where the kernel's copy refuses and the file is read and written)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        parts: list[bytes | files.FileBytes] = []
        for i, (data, from_file) in enumerate(drawn):
            if from_file:
                Path(folder, f"part{i}").write_bytes(data)
                parts.append(files.FileBytes(os.path.join(folder, f"part{i}")))
            else:
                parts.append(data)
        joined = b"".join(data for data, _ in drawn)
        path = os.path.join(folder, "r.html")
        files.write_text(path, b"old")
        files.write_text(path, tuple(parts))
        assert Path(path).read_bytes() == joined
        with open(os.path.join(folder, "out"), "wb+") as fh:
            fh.write(b"program's ")
            fh.flush()
            files.write_text(f"/dev/fd/{fh.fileno()}", tuple(parts))
            fh.seek(0)
            assert fh.read() == b"program's " + joined
        files.write_text(os.devnull, tuple(parts))
        fifo = os.path.join(folder, "pipe")
        os.mkfifo(fifo)
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(Path(fifo).read_bytes()))
        reader.start()
        files.write_text(fifo, tuple(parts))
        reader.join(30)
        assert got == [joined]


def test_a_large_file_part_is_copied_whole(tmp_path: Path) -> None:
    """A file part larger than one read (the page's plotly.js is 1.2 MB) is copied whole, in a regular file as
    through a descriptor opened for appending, where the kernel's copy refuses."""
    big = os.urandom(3 << 20)
    (tmp_path / "big").write_bytes(big)
    part = files.FileBytes(str(tmp_path / "big"))
    files.write_text(str(tmp_path / "r.html"), (b"<a>", part, b"</a>"))
    assert (tmp_path / "r.html").read_bytes() == b"<a>" + big + b"</a>"
    with open(tmp_path / "log", "ab") as fh:
        files.write_text(f"/dev/fd/{fh.fileno()}", (b"x", part))
    assert (tmp_path / "log").read_bytes() == b"x" + big


def test_a_file_part_is_written_where_one_descriptor_is_left(tmp_path: Path) -> None:
    """The copy holds the file's descriptor and the destination's at once; where the limit leaves room for one
    only, the file is read through its open descriptor first, and the page written as before (a regular file,
    a device)."""
    (tmp_path / "part").write_bytes(b"plotly" * 50_000)
    script = (
        "import os, resource, sys\n"
        "from energyprof.store import files\n"
        "top = max(int(fd) for fd in os.listdir('/proc/self/fd'))\n"
        "for fd in range(3, top + 1):\n"
        "    try:\n"
        "        os.fstat(fd)\n"
        "    except OSError:\n"
        "        os.dup2(0, fd)  # no gap below the last: exactly one descriptor left\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (top + 2, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "part = files.FileBytes(sys.argv[1] + '/part')\n"
        "files.write_text(sys.argv[1] + '/r.html', (b'<a>', part, b'</a>'))\n"
        "files.write_text(os.devnull, (b'<a>', part))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.html").read_bytes() == b"<a>" + b"plotly" * 50_000 + b"</a>"
