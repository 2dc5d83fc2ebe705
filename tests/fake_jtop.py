"""A stand-in for jetson-stats' `jtop` module: `jtop(interval=...)` whose `power` is the
dictionary in FAKE_JTOP_POWER (JSON, jtop 4.x layout), refreshed every interval; copied as
`jtop.py` onto PYTHONPATH, the real CLI uses it."""

import json
import os
import time


class JtopException(Exception):
    pass


class jtop:  # noqa: N801 - jetson-stats' name
    def __init__(self, interval=1.0):
        self.interval = interval
        self.power = {}
        self._open = False

    def start(self):
        if os.environ.get("FAKE_JTOP_NO_SERVICE"):
            raise JtopException("The jtop.service is not active. Please run: sudo systemctl restart jtop.service")
        self._open = True

    def ok(self):
        time.sleep(self.interval)
        self.power = json.loads(os.environ["FAKE_JTOP_POWER"])
        return self._open

    def close(self):
        self._open = False
