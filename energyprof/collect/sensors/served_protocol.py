"""The reader's fixed request grammar and its reply encoding: one home for client and server.

A request is one line of at most MAX_LINE bytes:

    read                 -> {"zones": [{"id", "component", "domain", "energy_uj", "max_energy_range_uj"}]}
                            (+ "period_s", "resolution_uj" where the reader limits this user's reads)
    knobs                -> {"knobs": [{"name", "value", "low", "high", "step", "choices", "unit"}]}
    set NAME VALUE       -> {"ok": NAME, "value": V}   or {"error": "..."}
    restore NAME         -> {"ok": NAME, "value": V}   or {"error": "..."}

Every reply is one JSON line. Anything that does not parse closes the connection.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ...record import record

MAX_LINE = 256  # bytes, newline included: the longest request is `set ` + a knob name + a number
_NAME = re.compile(r"[a-z_]{1,40}:[A-Za-z0-9_.-]{1,40}\Z")


@record(frozen=True)
class Request:
    verb: str  # read | knobs | set | restore
    name: str | None = None
    value: float | None = None


class BadRequest(ValueError):
    """A line outside the grammar: the server closes the connection."""


def parse(line: bytes) -> Request:
    if len(line) > MAX_LINE:
        raise BadRequest(f"request longer than {MAX_LINE} bytes")
    try:
        words = line.decode("ascii").strip().split(" ")
    except UnicodeDecodeError:
        raise BadRequest("request is not ASCII") from None
    if words in (["read"], ["knobs"]):
        return Request(words[0])
    if len(words) == 3 and words[0] == "set" and _NAME.match(words[1]):
        try:
            value = float(words[2])
        except ValueError:
            raise BadRequest("set needs a number") from None
        if not math.isfinite(value):
            raise BadRequest("set needs a finite number")
        return Request("set", words[1], value)
    if len(words) == 2 and words[0] == "restore" and _NAME.match(words[1]):
        return Request("restore", words[1])
    raise BadRequest("not in the grammar (read, knobs, set NAME VALUE, restore NAME)")


def encode(request: Request) -> bytes:
    if request.verb == "set":
        return f"set {request.name} {request.value!r}\n".encode()
    if request.verb == "restore":
        return f"restore {request.name}\n".encode()
    return f"{request.verb}\n".encode()


def reply(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("the reader's reply is not an object")
    return obj
