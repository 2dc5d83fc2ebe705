"""Real InfluxDB 1.x and Prometheus pushgateway servers on loopback, on free ports, for the live export's
tests (Debian's `influxdb` and `prometheus-pushgateway`, which .ci/run installs); and two dead servers:
a closed port, and one that accepts connections and never answers."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

START_WAIT_S = 60.0  # a loaded machine starts influxd slowly; the tests wait for it, never time it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path is None:
        pytest.skip(f"{name} is not installed (apt-get install {'influxdb' if name == 'influxd' else name};"
                    " .ci/run installs it)")
    return path


def _wait(url: str, proc: subprocess.Popen, ok: tuple[int, ...] = (200, 204)) -> None:
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status in ok:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {START_WAIT_S:g} s")


class Influx:
    def __init__(self, port: int, db: str, login: tuple[str, str] | None = None) -> None:
        self.port, self.db, self.login = port, db, login
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"{self.base}/{db}"

    def query(self, q: str) -> list[dict]:
        """The series of one InfluxQL query: [{name, tags, columns, values}]."""
        # influxd reads u and p from the URL's query only, never from a form body
        auth = "?" + urllib.parse.urlencode({"u": self.login[0], "p": self.login[1]}) if self.login else ""
        data = urllib.parse.urlencode({"db": self.db, "q": q, "epoch": "ns"}).encode()
        with urllib.request.urlopen(f"{self.base}/query{auth}", data=data, timeout=30) as resp:
            out = json.loads(resp.read())
        result = out["results"][0]
        assert "error" not in result, result
        return result.get("series", [])

    def rows(self, q: str) -> list[dict]:
        """Each row as {column: value, plus the series' tags}."""
        return [{**s.get("tags", {}), **dict(zip(s["columns"], v))} for s in self.query(q) for v in s["values"]]


def _influxd(root: Path, login: tuple[str, str] | None) -> Iterator[Influx]:
    binary = _binary("influxd")
    port, rpc = free_port(), free_port()
    (root / "influxdb.conf").write_text(f"""reporting-disabled = true
bind-address = "127.0.0.1:{rpc}"
[meta]
  dir = "{root / 'meta'}"
[data]
  dir = "{root / 'data'}"
  wal-dir = "{root / 'wal'}"
  query-log-enabled = false
[http]
  bind-address = "127.0.0.1:{port}"
  log-enabled = false
  auth-enabled = {'true' if login else 'false'}
[monitor]
  store-enabled = false
[continuous_queries]
  enabled = false
""")
    proc = subprocess.Popen([binary, "-config", str(root / "influxdb.conf")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait(f"http://127.0.0.1:{port}/ping", proc)
        if login:  # with auth on and no user yet, the first admin may be made without a login
            q = f"CREATE USER \"{login[0]}\" WITH PASSWORD '{login[1]}' WITH ALL PRIVILEGES"
            urllib.request.urlopen(f"http://127.0.0.1:{port}/query", data=urllib.parse.urlencode({"q": q}).encode(),
                                   timeout=30).read()
        server = Influx(port, "energy", login)
        server.query("CREATE DATABASE energy")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def influx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Influx]:
    yield from _influxd(tmp_path_factory.mktemp("influxd"), None)


@pytest.fixture
def influx_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Influx]:
    """InfluxDB 1.x with auth-enabled: writes need the admin's login (`login`)."""
    yield from _influxd(tmp_path_factory.mktemp("influxd"), ("admin", "S3cret&p=x"))


class Pushgateway:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def scrape(self) -> list[tuple[str, dict[str, str], float]]:
        """(metric, labels, value) of every sample its /metrics shows."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        out = []
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            head, value = line.rsplit(" ", 1)
            name, labels = head, {}
            if "{" in head:
                name, rest = head.split("{", 1)
                labels = _labels(rest.rstrip("}"))
            out.append((name, labels, float(value)))
        return out


def _labels(text: str) -> dict[str, str]:
    out, i = {}, 0
    while i < len(text):
        eq = text.index("=", i)
        key = text[i:eq].strip(", ")
        j, val = eq + 2, []
        while text[j] != '"':
            if text[j] == "\\":
                j += 1
                val.append({"n": "\n"}.get(text[j], text[j]))
            else:
                val.append(text[j])
            j += 1
        out[key] = "".join(val)
        i = j + 1
    return out


@pytest.fixture
def pushgateway() -> Iterator[Pushgateway]:
    binary = _binary("prometheus-pushgateway")
    port = free_port()
    proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait(f"http://127.0.0.1:{port}/-/ready", proc)
        yield Pushgateway(port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def closed_port() -> str:
    """A loopback port nobody listens on: every connection is refused at once."""
    return f"http://127.0.0.1:{free_port()}"


class Silent:
    """Accepts every connection and never answers (reads and sleeps until the test ends)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            self.conns.append(conn)  # held open, never read from nor answered

    def close(self) -> None:
        self.stop.set()
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def silent_server() -> Iterator[Silent]:
    server = Silent()
    try:
        yield server
    finally:
        server.close()
