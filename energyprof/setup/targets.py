"""The live export's targets (--influx, --pushgateway): parsed and checked before anything runs, pure
(the environment is handed in), so the options' checks and the sinks read one grammar."""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, quote, urlsplit

from ..record import field, record

TOKEN_ENV = "INFLUX_TOKEN"


class TargetError(ValueError):
    """A bad --influx or --pushgateway URL: one line, said before the program starts."""


@record
class InfluxTarget:
    scheme: str
    host: str
    port: int
    path: str  # the write request's path and query
    headers: dict[str, str] = field(default_factory=dict)
    version: int = 1


def influx_target(url: str, env: dict[str, str] | None = None) -> InfluxTarget:
    """`http://HOST:8086/DB` (1.x: /write?db=DB) or `http://HOST:8086?org=ORG&bucket=B` (also with the
    path /api/v2/write; 2.x: the token from INFLUX_TOKEN, org and bucket also from INFLUX_ORG and
    INFLUX_BUCKET). A 1.x server that wants a login gets INFLUX_TOKEN as `user:password`."""
    env = dict(os.environ) if env is None else env
    scheme, host, port, path, query = _split(url, "--influx", 8086)
    q = dict(parse_qsl(query))
    token = env.get(TOKEN_ENV, "")
    base = path.rstrip("/")
    if base.endswith("/api/v2/write"):
        base = base[: -len("/api/v2/write")]
    org, bucket = q.get("org") or env.get("INFLUX_ORG", ""), q.get("bucket") or env.get("INFLUX_BUCKET", "")
    v2 = "org" in q or "bucket" in q or path.rstrip("/").endswith("/api/v2/write")
    if v2:
        if not org or not bucket:
            raise TargetError(f"--influx {url}: InfluxDB 2 needs ?org=ORG&bucket=BUCKET (or INFLUX_ORG and INFLUX_BUCKET)")
        if not token:
            raise TargetError(f"--influx {url}: InfluxDB 2 needs a token: set {TOKEN_ENV}")
        write = f"{base}/api/v2/write?org={quote(org, safe='')}&bucket={quote(bucket, safe='')}&precision=ns"
        return InfluxTarget(scheme, host, port, write, {"Authorization": f"Token {token}"}, 2)
    db = base.strip("/")
    if not db or "/" in db:
        raise TargetError(f"--influx {url}: give the database as the path (http://HOST:8086/DB), or"
                          " ?org=ORG&bucket=BUCKET for InfluxDB 2")
    headers = {"Authorization": f"Token {token}"} if token else {}
    return InfluxTarget(scheme, host, port, f"/write?db={quote(db, safe='')}&precision=ns", headers, 1)


def pushgateway_target(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, base path) of `http://HOST:9091` (the group's path is added per run), or
    of a URL that names its own group (`.../metrics/job/NAME/...`), used as it is."""
    scheme, host, port, path, query = _split(url, "--pushgateway", 9091)
    if query:
        raise TargetError(f"--pushgateway {url}: a pushgateway URL takes no query")
    return scheme, host, port, path.rstrip("/")


def _split(url: str, flag: str, default_port: int) -> tuple[str, str, int, str, str]:
    if not isinstance(url, str) or not url.strip():
        raise TargetError(f"{flag} needs a URL (http://HOST:PORT...), not {url!r}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetError(f"{flag} {url}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError(f"{flag} {url}: give an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise TargetError(f"{flag} {url}: no credentials in the URL (InfluxDB reads {TOKEN_ENV})")
    return parts.scheme, parts.hostname, port or default_port, parts.path or "/", parts.query
