"""RAPL handed over by the privileged reader (`energyprof sensors serve`, energyprof/serve/), for users
without root: the client side.

The reader runs as root and answers root and the members of one group over a Unix socket (the
grammar is energyprof/collect/sensors/served_protocol.py). The client turns each zone of a `read` reply into a sensor
with its own wraparound handling; one request per tick serves every zone.
"""

from __future__ import annotations

import threading
from typing import Any

from .base import Discovery, Sensor, SensorError, WrapCounter
# Where the reader listens (presence.py: this module, the grammar and the socket module are imported
# only once a reader is there; every run's discovery looks for it, few machines have one).
from .presence import SERVED_ENABLE as ENABLE, SOCKET as DEFAULT_SOCKET, no_served, socket_path  # noqa: F401

TIMEOUT_S = 1.0


# ---------------------------------------------------------------- the client (sensors)


class ServedClient:
    """One connection shared by every zone's sensor; a tick's zones share one request."""

    def __init__(self, path: str) -> None:
        import socket

        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(path)
        self.file = self.sock.makefile("rwb")
        self._lock = threading.Lock()
        self._at: int | None = None
        self._last: dict[str, Any] = {}
        self.users = 0
        self.period_s: float | None = None  # the reader's limits for this user, where it sets any
        self.resolution_uj: int | None = None

    def fetch(self, t_ns: int | None = None) -> dict[str, dict[str, Any]]:
        from . import served_protocol as protocol

        with self._lock:
            if t_ns is not None and t_ns == self._at:
                return self._last
            try:
                self.file.write(protocol.encode(protocol.Request("read")))
                self.file.flush()
                line = self.file.readline()
            except OSError as exc:
                raise SensorError(f"the energyprof sensor reader at {self.path} stopped answering ({exc})") from None
            if not line:
                raise SensorError(f"the energyprof sensor reader at {self.path} closed the connection")
            reply = protocol.decode(line)
            self._last = {z["id"]: z for z in reply["zones"]}
            self.period_s, self.resolution_uj = reply.get("period_s"), reply.get("resolution_uj")
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
        detail = {"domain": zone.get("domain"), "via": f"energyprof sensors serve ({client.path})",
                  "max_energy_range_uj": zone.get("max_energy_range_uj")}
        if client.resolution_uj:  # the reader rounds this user's counters (the power side channel)
            detail["resolution_uj"] = client.resolution_uj
        super().__init__(id=zone["id"], component=zone["component"], method="measured", sensor="rapl",
                         detail=detail, update_period_s=max(0.001, float(client.period_s or 0.0)), tier="counter")
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
    absent = no_served(path, explicit)
    if absent is not None:
        return absent
    found = Discovery()
    where = socket_path(path)
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
