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
SAMPLES_FACT = "samples"  # how many samples ran the request (the ledger counts them): its joules are theirs
CPU_FACT = "cpu_s"  # ... and their CPU time
# No hook saw the request's response; what ended it instead (ENDED_BY's value; absent: its response):
ENDED_BY = "ended_by"
END_NEXT = 1.0  # the next request on its thread or task began
END_TASK = 2.0  # its task ended (an application that raised, a server that answered 500 itself)
END_THREAD = 3.0  # its thread ended
END_RUN = 4.0  # the run ended
END_NAMES = {END_NEXT: "the next request on its thread", END_TASK: "its task's end", END_THREAD: "its thread's end",
             END_RUN: "the run's end"}
# A long run keeps a bounded set of each name's runs (core/unit_book.py): the rest are folded into one window
RUNS_FACT = "runs"  # ... that stands for this many runs (its joules their sum)
RUNS_TIME_FACT = "runs_time_s"  # ... and their time, summed
COSTLIEST_ONLY = "costliest_only"  # a run kept for the costliest list only, outside the uniform sample of runs
