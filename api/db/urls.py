"""Parsing a server database URL that may name several hosts.

``mysql://user:password@h1:3306,h2:3306,h3/dbname?charset=utf8mb4`` and
``postgresql://user@h1:5432,h2:5432/dbname?target_session_attrs=read-write`` (libpq's
own multi-host form). The standard library's ``urlparse`` reads only one host (its
``.port`` fails on ``3306,h2:3306``), so the part between ``@`` and the path is split
here. A host may be a name, an IPv4 address or a bracketed IPv6 address
(``[::1]:3306``); a host without a port uses the scheme's default, and a URL without
a host means ``localhost`` (as the drivers do).

Every error is a ``ValueError`` that quotes the URL's bad part, never its password.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit


@dataclass(frozen=True)
class ServerUrl:
    """A MySQL or Postgres URL taken apart.

    Attributes:
        hosts: ``(host, port)`` pairs in the URL's order (the first is preferred).
        options: the query string, each value a string as written.
    """

    scheme: str
    database: str
    hosts: tuple[tuple[str, int], ...]
    user: str | None = None
    password: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    def describe_hosts(self) -> str:
        """``h1:3306, h2:3306`` for messages."""
        return ", ".join(_host_text(host, port) for host, port in self.hosts)


def parse_server_url(url: str, default_port: int, example: str) -> ServerUrl:
    """Take ``url`` apart; ``example`` (a correct URL) is quoted by the errors.

    Raises:
        ValueError: a host list entry is empty, a port is not a number from 1 to
            65535, an IPv6 address lacks its closing bracket, the URL names no
            database, or an option is given twice. The message names the bad part.
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unbalanced '[' or ']'
        raise ValueError(
            f"database URL {url.split('@')[-1]!r} cannot be read ({exc}); write hosts as {example}"
        ) from None
    scheme = parts.scheme.lower()
    netloc = parts.netloc
    user = password = None
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        name, colon, secret = userinfo.partition(":")
        user = unquote(name) or None
        password = unquote(secret) if colon else None
    shown = url
    if password:
        shown = url.replace(parts.netloc, f"{userinfo.split(':', 1)[0]}:***@{netloc}", 1)
    hosts = tuple(_parse_host(entry, default_port, shown) for entry in netloc.split(","))
    database = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    if not database:
        raise ValueError(f"database URL {shown!r} names no database; add it: {example}")
    if "/" in database:
        raise ValueError(f"database URL {shown!r}: database name {database!r} contains '/'; use {example}")
    options: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in options:
            raise ValueError(f"database URL {shown!r} gives option {key!r} twice")
        options[key] = value
    return ServerUrl(scheme, database, hosts, user, password, options)


def typed_option(value: str) -> Any:
    """A query-string value as a driver keyword wants it: ``true``/``false``, a number, or text."""
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if value.isdigit():
        return int(value)
    try:
        return float(value) if "." in value else value
    except ValueError:
        return value


def _parse_host(entry: str, default_port: int, shown: str) -> tuple[str, int]:
    if not entry:
        if "," in shown:
            raise ValueError(
                f"database URL {shown!r} has an empty entry in its host list; separate hosts with one "
                f"comma: host1:{default_port},host2:{default_port}"
            )
        return "localhost", default_port  # mysql:///db?unix_socket=...: the driver's default
    if entry.startswith("["):
        end = entry.find("]")
        if end < 0:
            raise ValueError(
                f"database URL {shown!r}: host {entry!r} lacks the closing ']' of its IPv6 address"
            )
        host, rest = entry[1:end], entry[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError(f"database URL {shown!r}: host {entry!r} has {rest!r} after its IPv6 address")
        port_text = rest[1:] if rest else ""
    else:
        host, colon, port_text = entry.partition(":")
        if colon and not port_text:
            raise ValueError(f"database URL {shown!r}: host {entry!r} has an empty port; write {host}:PORT")
    if not host:
        raise ValueError(f"database URL {shown!r}: host list entry {entry!r} has no host name")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(
            f"database URL {shown!r}: port {port_text!r} of host {host!r} is not a number from 1 to 65535"
        )
    return host, int(port_text)


def _host_text(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
