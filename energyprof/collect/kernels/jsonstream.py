"""A Chrome/Kineto trace's events, one at a time, in memory that follows the events, not the file.

A trace is `{"key": value, ..., "traceEvents": [event, ...], ...}` (or a bare `[event, ...]`,
Chrome's array format, whose closing `]` may be missing). The file is read in chunks; whitespace
and finished events are dropped as they pass, so a file of padding costs one chunk. Each event
(and each other top-level value) is decoded by `json.JSONDecoder.raw_decode` once it is whole in
the buffer; when it is not, the reader reads more, doubling what it asks for, so an event split
over many chunks costs linear time. One value may not exceed `MAX_VALUE_CHARS`: the memory a
hostile file can claim is bounded.

Strict where the standard module is lenient: NaN and Infinity are not JSON and are refused;
nesting deeper than the decoder's recursion limit is refused. Control characters inside strings
are taken (torch has written them unescaped, pytorch#130622). Every failure is a `StreamError`
whose message is one line.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any, IO, Iterator

CHUNK = 1 << 20  # characters read at a time
MAX_VALUE_CHARS = 64 << 20  # the largest single event (or top-level value) taken
_WS = re.compile(r"[ \t\n\r]*")
_AFTER_VALUE = frozenset(" \t\n\r,]}:")


class StreamError(ValueError):
    """Not a trace this reader takes; the message is one line."""


def _no_constant(name: str) -> Any:
    raise StreamError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_no_constant, strict=False)


class TraceStream:
    """Iterate `events()`; afterwards `meta` holds the document's other top-level keys in `keep`."""

    def __init__(self, fh: IO[bytes], keep: frozenset[str] = frozenset(), chunk: int = CHUNK) -> None:
        self._fh = fh
        self._dec = codecs.getincrementaldecoder("utf-8")()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._chunk = chunk
        self._line = 1  # lines before the buffer's start, for messages
        self.keep = keep
        self.meta: dict[str, Any] = {}
        self.found_events = False

    # ------------------------------------------------------------ input

    def _more(self, want: int) -> bool:
        """Read about `want` more characters; False at the end of the input."""
        if self._eof:
            return False
        raw = self._fh.read(want)
        if not raw:
            self._eof = True
            tail = self._dec.decode(b"", final=True)
            if tail:
                self._append(tail)
            return bool(tail)
        self._append(self._dec.decode(raw))
        return True

    def _append(self, text: str) -> None:
        if self._pos:
            self._line += self._buf.count("\n", 0, self._pos)
            self._buf = self._buf[self._pos:]
            self._pos = 0
        self._buf += text

    def _where(self) -> str:
        return f"line {self._line + self._buf.count(chr(10), 0, self._pos)}"

    def _skip_ws(self) -> None:
        while True:
            self._pos = _WS.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf) or not self._more(self._chunk):
                return

    def _peek(self) -> str:
        self._skip_ws()
        return self._buf[self._pos] if self._pos < len(self._buf) else ""

    def _expect(self, chars: str, what: str) -> str:
        c = self._peek()
        if not c:
            raise StreamError(f"truncated: it ends where {what} should be")
        if c not in chars:
            raise StreamError(f"not valid JSON: expected {what} at {self._where()}, found {c!r}")
        self._pos += 1
        return c

    def _value(self) -> Any:
        """The next whole JSON value."""
        self._skip_ws()
        want = self._chunk
        while True:
            buf, pos = self._buf, self._pos
            try:
                value, end = _DECODER.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                # incomplete (the value runs past the buffer) or wrong: only more input tells,
                # except where the fault lies well inside what has been read
                if exc.pos < len(buf) - 16 and not exc.msg.startswith("Unterminated string"):
                    raise StreamError(f"not valid JSON: {exc.msg} at {self._where_at(exc.pos)}") from None
                if not self._grow(want):
                    raise StreamError(f"truncated: it ends inside a value that starts at {self._where()}") from None
                want *= 2
                continue
            except RecursionError:
                raise StreamError(f"nests deeper than this reader takes, at {self._where()}") from None
            except ValueError as exc:  # a number over int's digit limit
                raise StreamError(f"holds a value this reader refuses at {self._where()}: "
                                  f"{str(exc).splitlines()[0][:120]}") from None
            if end - pos > MAX_VALUE_CHARS:  # whole already (a chunk holds it, gzipped or not): refused all the same
                raise StreamError(f"holds a value over {MAX_VALUE_CHARS >> 20} MiB at {self._where()}: "
                                  "not a profiler's event")
            if end == len(buf) or buf[end] not in _AFTER_VALUE:  # a number may go on in the next chunk
                if self._grow(want):
                    want *= 2
                    continue
                if end < len(buf):
                    raise StreamError(f"not valid JSON: unexpected {buf[end]!r} at {self._where_at(end)}")
            self._pos = end
            return value

    def _grow(self, want: int) -> bool:
        held = len(self._buf) - self._pos
        if held > MAX_VALUE_CHARS:
            raise StreamError(f"holds a value over {MAX_VALUE_CHARS >> 20} MiB at {self._where()}: "
                              "not a profiler's event")
        # never more than one character past the bound: a plain file's read is not held back by gzip's
        return self._more(max(1, min(want, MAX_VALUE_CHARS + 1 - held)))

    def _where_at(self, pos: int) -> str:
        return f"line {self._line + self._buf.count(chr(10), 0, pos)}"

    # ------------------------------------------------------------ structure

    def events(self) -> Iterator[Any]:
        c = self._peek()
        if c == "[":
            self._pos += 1
            self.found_events = True
            yield from self._array(closing_optional=True)
        elif c == "{":
            self._pos += 1
            yield from self._object()
        elif not c:
            raise StreamError("empty")
        else:
            raise StreamError(f"not a JSON object or array (it starts with {c!r})")
        if self._peek():
            raise StreamError(f"not valid JSON: more text after the document at {self._where()}")

    def _object(self) -> Iterator[Any]:
        if self._peek() == "}":
            self._pos += 1
            return
        while True:
            if self._peek() != '"':
                self._expect('"', "a key")
            key = self._value()
            self._expect(":", "':'")
            if key == "traceEvents" and self._peek() == "[":
                self._pos += 1
                self.found_events = True
                yield from self._array(closing_optional=False)
            else:
                value = self._value()
                if key in self.keep:
                    self.meta[key] = value
                elif key == "traceEvents":
                    self.meta[key] = value  # not a list: the caller says so
            if self._expect(",}", "',' or '}'") == "}":
                return

    def _array(self, closing_optional: bool) -> Iterator[Any]:
        if self._peek() == "]":
            self._pos += 1
            return
        while True:
            yield self._value()
            c = self._peek()
            if not c and closing_optional:
                return
            if self._expect(",]", "',' or ']'") == "]":
                return
            if closing_optional and not self._peek():
                return  # Chrome's array format may end with a comma
