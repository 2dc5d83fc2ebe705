"""The live export's targets (--influx, --pushgateway): parsed and checked before anything runs, pure
(the environment is handed in), so the options' checks and the sinks read one grammar.

Credentials: InfluxDB 1.x takes a user and password as `u` and `p` in the URL's query (as its own
`/write?u=..&p=..` does) or as `http://USER:PASSWORD@HOST/DB`; they are sent in an Authorization header
(HTTP basic, which 1.x reads as it reads u and p), never in the request line. InfluxDB 2 takes its token
from INFLUX_TOKEN only. Wherever a target is written down (the profile, the page, MLflow, stderr) it is
`redacted`: the URL with every credential replaced by `***`."""

from __future__ import annotations

import base64
import os
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from ..record import field, record

TOKEN_ENV = "INFLUX_TOKEN"
HIDDEN = "***"
# query keys that carry a secret in an InfluxDB or Prometheus URL
_SECRET_KEYS = frozenset({"u", "p", "token", "password", "user", "username"})


class TargetError(ValueError):
    """A bad --influx or --pushgateway URL: one line, said before the program starts."""


@record
class InfluxTarget:
    scheme: str
    host: str
    port: int
    path: str  # the write request's path and query (no credential in it)
    headers: dict[str, str] = field(default_factory=dict)
    version: int = 1


def redacted(url: str) -> str:
    """`url` with its user, password and every secret query value (u, p, token, ...) replaced by `***`:
    what may be written down or shown. A URL that cannot be parsed is hidden whole."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except (ValueError, TypeError, AttributeError):
        return HIDDEN
    netloc = parts.hostname or ""
    if ":" in netloc:  # an IPv6 literal
        netloc = f"[{netloc}]"
    if port is not None:
        netloc += f":{port}"
    if parts.username is not None or parts.password is not None:
        netloc = f"{HIDDEN}@{netloc}"
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k.lower() in _SECRET_KEYS for k, _ in query):
        shown = urlencode([(k, HIDDEN if k.lower() in _SECRET_KEYS else v) for k, v in query], safe="*")
    else:
        shown = parts.query
    return urlunsplit((parts.scheme, netloc, parts.path, shown, ""))


def redacted_argv(argv: list[str], urls: list[str]) -> list[str]:
    """A command line with each of `urls` (the parsed --influx and --pushgateway, however the flag was
    spelled or abbreviated) `redacted` wherever it stands, alone or after `=`."""
    hidden = {u: redacted(u) for u in urls if u}
    if not hidden:
        return list(argv)
    out = []
    for arg in argv:
        for url, shown in hidden.items():
            if arg == url:
                arg = shown
            elif arg.endswith("=" + url):
                arg = arg[: -len(url)] + shown
        out.append(arg)
    return out


def influx_target(url: str, env: dict[str, str] | None = None) -> InfluxTarget:
    """`http://HOST:8086/DB` (1.x: /write?db=DB) or `http://HOST:8086?org=ORG&bucket=B` (also with the
    path /api/v2/write; 2.x: the token from INFLUX_TOKEN, org and bucket also from INFLUX_ORG and
    INFLUX_BUCKET). A 1.x server that wants a login gets `u` and `p` from the URL's query (or the URL's
    user and password), else INFLUX_TOKEN as `user:password`."""
    env = dict(os.environ) if env is None else env
    scheme, host, port, path, query, login = _split(url, "--influx", 8086)
    q = dict(parse_qsl(query))
    shown = redacted(url)
    user, password = q.pop("u", None), q.pop("p", None)
    if login is not None:
        if user is not None or password is not None:
            raise TargetError(f"--influx {shown}: give the login once, as USER:PASSWORD@ or as ?u=USER&p=PASSWORD")
        user, password = login
    token = env.get(TOKEN_ENV, "")
    base = path.rstrip("/")
    if base.endswith("/api/v2/write"):
        base = base[: -len("/api/v2/write")]
    org, bucket = q.get("org") or env.get("INFLUX_ORG", ""), q.get("bucket") or env.get("INFLUX_BUCKET", "")
    v2 = "org" in q or "bucket" in q or path.rstrip("/").endswith("/api/v2/write")
    if v2:
        if user is not None or password is not None:
            raise TargetError(f"--influx {shown}: InfluxDB 2 takes a token, from {TOKEN_ENV}, not a user and password")
        if not org or not bucket:
            raise TargetError(f"--influx {shown}: InfluxDB 2 needs ?org=ORG&bucket=BUCKET (or INFLUX_ORG and INFLUX_BUCKET)")
        if not token:
            raise TargetError(f"--influx {shown}: InfluxDB 2 needs a token: set {TOKEN_ENV}")
        write = f"{base}/api/v2/write?org={quote(org, safe='')}&bucket={quote(bucket, safe='')}&precision=ns"
        return InfluxTarget(scheme, host, port, write, {"Authorization": f"Token {token}"}, 2)
    db = base.strip("/")
    if not db or "/" in db:
        raise TargetError(f"--influx {shown}: give the database as the path (http://HOST:8086/DB), or"
                          " ?org=ORG&bucket=BUCKET for InfluxDB 2")
    if (user is None) != (password is None) or user == "":
        raise TargetError(f"--influx {shown}: a login needs both a user and a password (?u=USER&p=PASSWORD)")
    if user is not None:
        basic = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        headers = {"Authorization": f"Basic {basic}"}
    else:
        headers = {"Authorization": f"Token {token}"} if token else {}
    return InfluxTarget(scheme, host, port, f"/write?db={quote(db, safe='')}&precision=ns", headers, 1)


def pushgateway_target(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, base path) of `http://HOST:9091` (the group's path is added per run), or
    of a URL that names its own group (`.../metrics/job/NAME/...`), used as it is."""
    scheme, host, port, path, query, login = _split(url, "--pushgateway", 9091)
    if login is not None:
        raise TargetError(f"--pushgateway {redacted(url)}: no credentials in a pushgateway URL")
    if query:
        raise TargetError(f"--pushgateway {redacted(url)}: a pushgateway URL takes no query")
    return scheme, host, port, path.rstrip("/")


def _split(url: str, flag: str, default_port: int) -> tuple[str, str, int, str, str, tuple[str, str] | None]:
    """(scheme, host, port, path, query, (user, password) or None)."""
    if not isinstance(url, str) or not url.strip():
        raise TargetError(f"{flag} needs a URL (http://HOST:PORT...), not {redacted(url) if isinstance(url, str) else url!r}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetError(f"{flag} {redacted(url)}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError(f"{flag} {redacted(url)}: give an http:// or https:// URL with a host")
    login = None
    if parts.username is not None or parts.password is not None:
        from urllib.parse import unquote

        login = (unquote(parts.username or ""), unquote(parts.password or ""))
    return parts.scheme, parts.hostname, port or default_port, parts.path or "/", parts.query, login
