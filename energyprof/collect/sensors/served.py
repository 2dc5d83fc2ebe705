"""RAPL handed over by a small privileged reader (`energyprof sensors serve`), for users without root.

The reader runs as root, reads powercap's counters (rapl.py's discovery) and answers anyone
who can open its Unix socket: the socket is mode 0660 and owned by a group (as Zeus's daemon
does), so membership of that group is the permission. Protocol: the client writes a line, the
reader answers one JSON line {"zones": [{"id", "component", "domain", "energy_uj",
"max_energy_range_uj"}]}. The client turns each zone into a sensor with its own wraparound
handling; one request per tick serves every zone.
"""

from __future__ import annotations

import grp
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

from . import rapl
from .base import Discovery, Sensor, SensorError, WrapCounter

DEFAULT_SOCKET = "/run/energyprof/rapl.sock"
ENABLE = ("start the privileged reader as root: sudo energyprof sensors serve --group energyprof "
          "(then add users to that group), or see docs/sensors.md for the udev rule")
TIMEOUT_S = 1.0


def socket_path(explicit: str | None = None) -> str:
    return explicit or os.environ.get("ENERGYPROF_SENSOR_SOCKET") or DEFAULT_SOCKET


# ---------------------------------------------------------------- the reader (server)


def snapshot(zones: list[rapl.RaplSensor]) -> dict[str, Any]:
    out = []
    for z in zones:
        try:
            uj = rapl.read_counter(z.path)
        except (OSError, ValueError):
            continue
        out.append({"id": z.id, "component": z.component, "domain": z.detail.get("domain"), "energy_uj": uj,
                    "max_energy_range_uj": z.detail.get("max_energy_range_uj")})
    return {"zones": out}


def _server_classes() -> tuple[type, type]:
    """(the server, its handler), made when a reader is served: socketserver is the reader's
    alone, and importing it cost every run's sensor discovery 2.4 ms."""
    import socketserver

    class _Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            zones = self.server.zones  # type: ignore[attr-defined]
            for _ in self.rfile:
                self.wfile.write(json.dumps(snapshot(zones)).encode() + b"\n")
                self.wfile.flush()

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    return Server, _Handler


def make_server(path: str, powercap_root: str | None = None, group: str | None = None) -> tuple[Any, list[str]]:
    """The bound reader and what it serves; raises ValueError with a line for the user."""
    found = rapl.discover(powercap_root)
    if not found.sensors:
        raise ValueError("no readable RAPL counter to serve: " + "; ".join(found.notes or ["none found"]))
    sock = Path(path)
    sock.parent.mkdir(parents=True, exist_ok=True)
    if sock.exists() or sock.is_symlink():
        if not sock.is_socket():
            raise ValueError(f"{path} exists and is not a socket; not replaced")
        sock.unlink()
    server_class, handler = _server_classes()
    server = server_class(path, handler)
    server.zones = found.sensors  # type: ignore[attr-defined]
    os.chmod(path, 0o660 if group else 0o666)
    if group:
        try:
            os.chown(path, -1, grp.getgrnam(group).gr_gid)
        except KeyError:
            server.server_close()
            raise ValueError(f"no group named {group!r} (create it: sudo groupadd {group})") from None
    return server, [f"{s.id} ({s.detail.get('domain')})" for s in found.sensors]


# ---------------------------------------------------------------- the client (sensors)


class ServedClient:
    """One connection shared by every zone's sensor; a tick's zones share one request."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(path)
        self.file = self.sock.makefile("rwb")
        self._lock = threading.Lock()
        self._at: int | None = None
        self._last: dict[str, Any] = {}
        self.users = 0

    def fetch(self, t_ns: int | None = None) -> dict[str, dict[str, Any]]:
        with self._lock:
            if t_ns is not None and t_ns == self._at:
                return self._last
            try:
                self.file.write(b"read\n")
                self.file.flush()
                line = self.file.readline()
            except OSError as exc:
                raise SensorError(f"the energyprof sensor reader at {self.path} stopped answering ({exc})") from None
            if not line:
                raise SensorError(f"the energyprof sensor reader at {self.path} closed the connection")
            self._last = {z["id"]: z for z in json.loads(line)["zones"]}
            self._at = t_ns
            return self._last

    def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            try:
                self.file.close()
                self.sock.close()
            except OSError:
                pass


class ServedSensor(Sensor):
    def __init__(self, client: ServedClient, zone: dict[str, Any]) -> None:
        super().__init__(id=zone["id"], component=zone["component"], method="measured", sensor="rapl",
                         detail={"domain": zone.get("domain"), "via": f"energyprof sensors serve ({client.path})",
                                 "max_energy_range_uj": zone.get("max_energy_range_uj")},
                         update_period_s=0.001, tier="counter")
        self.client = client
        client.users += 1
        self._max = zone.get("max_energy_range_uj")
        self._counter: WrapCounter | None = None

    def _raw(self, t_ns: int | None) -> float:
        zone = self.client.fetch(t_ns).get(self.id)
        if zone is None:
            raise SensorError(f"the sensor reader no longer serves {self.id}")
        return float(zone["energy_uj"])

    def start(self, t_ns: int) -> None:
        self._counter = WrapCounter(self._raw(None), self._max)

    def read(self, t_ns: int) -> float:
        raw = self._raw(t_ns)
        if self._counter is None:
            self._counter = WrapCounter(raw, self._max)
        return self._counter.update(raw) / 1e6

    def close(self) -> None:
        self.client.release()


def discover(path: str | None = None, explicit: bool = False) -> Discovery:
    found = Discovery()
    where = socket_path(path)
    if not os.path.exists(where):
        if explicit:
            found.notes.append(f"served RAPL: no reader at {where}. {ENABLE}")
        return found
    try:
        client = ServedClient(where)
        zones = list(client.fetch().values())
    except (OSError, SensorError, ValueError, KeyError) as exc:
        found.notes.append(f"served RAPL: cannot use the reader at {where} ({exc}); is this user in its group?")
        return found
    found.sensors.extend(ServedSensor(client, z) for z in zones)
    if not zones:
        client.release()
    found.notes.append(f"RAPL: read through the privileged reader at {where}")
    return found
