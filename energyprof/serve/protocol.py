"""The reader's wire: a fixed request grammar and one JSON line per reply, shared by server and client.

Requests are single ASCII lines of at most MAX_LINE bytes:

    read                    every served counter: {"zones": [{"id", "component", "domain",
                            "energy_uj", "max_energy_range_uj"}]}
    knobs                   the knobs: {"knobs": [{"name", "unit", "value", "low", "high", "choices"}]}
    set NAME VALUE          set a knob within its range: {"ok": NAME, "value": VALUE}
    restore NAME            put back what it was before this connection set it: {"ok": NAME}

Anything else (a longer line, bytes that are not printable ASCII, an unknown verb, a malformed
number) is answered by closing the connection. An error the client may act on is a reply:
{"error": "one line"}. Nothing a client sends is ever used as a path.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

MAX_LINE = 128  # bytes, newline included: the longest valid request is far shorter
_NAME = re.compile(r"[a-z_]{1,40}:[A-Za-z0-9_.-]{1,40}")
_NUMBER = re.compile(r"-?[0-9]{1,15}(\.[0-9]{1,9})?")


class ProtocolError(Exception):
    """A request outside the grammar: the connection is closed."""


@dataclass(frozen=True)
class Request:
    verb: str  # read | knobs | set | restore
    name: str = ""
    value: float = math.nan


def parse(line: bytes) -> Request:
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise ProtocolError("request too long or unterminated")
    try:
        text = line[:-1].decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("not ASCII") from None
    if not text.isprintable():
        raise ProtocolError("not printable")
    parts = text.split(" ")
    if parts == ["read"] or parts == ["knobs"]:
        return Request(parts[0])
    if len(parts) == 2 and parts[0] == "restore" and _NAME.fullmatch(parts[1]):
        return Request("restore", parts[1])
    if len(parts) == 3 and parts[0] == "set" and _NAME.fullmatch(parts[1]) and _NUMBER.fullmatch(parts[2]):
        return Request("set", parts[1], float(parts[2]))
    raise ProtocolError(f"not a request: {text[:40]!r}")


def request(verb: str, name: str = "", value: float | None = None) -> bytes:
    """A request line as the client sends it (the same grammar `parse` accepts)."""
    words = [verb] + ([name] if name else []) + ([f"{value:.9f}".rstrip("0").rstrip(".")] if value is not None else [])
    line = (" ".join(words) + "\n").encode("ascii")
    parse(line)  # never send what the reader would refuse
    return line


def reply(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"
