"""The facts a request's window carries at its end: the one definition of their names, which the agent
writes (agent/requests.py), the ledger reads to end and name the right window (core/ledger.py) and the
analysis reads to find requests (analysis/units.py)."""

from __future__ import annotations

REQUEST_FACT = "request"  # the window is a web request's (1.0)
STATUS_FACT = "status"  # its response's status (0: unknown)
WINDOW_INDEX = "window_index"  # which window of its name ends: its index (not kept)
OPENED_AS = "opened_as"  # the index it was opened under, as PENDING: the ledger names it at its end (not kept)
PENDING = "[request]"  # a request's window until its end names it: opened as the request begins, so
#                        every interval of its span is charged to it, however late routing (or its end) names it
