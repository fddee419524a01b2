"""Outbound HTTP for components and tools, guarded (docs/design.md §11): one place for the rules.

    from agent import net
    allow = net.AllowList(settings["allow_hosts"])        # ValueError names the bad entry
    response = net.request(
        "POST", "https://api.example.com/items", headers={...}, body=b"...",
        deadline=canvas.deadline.within(timeout, "timeout"), allow=allow, max_bytes=cap,
    )
    response.status, response.reason, response.headers, response.body

Rules, each checked here so that every caller gets all of them:

* **Destinations.** The host is resolved once and every address it resolves to is
  checked against :data:`DENIED_NETWORKS`, the IANA IPv4 and IPv6 special-purpose
  registries (private, loopback, link-local, shared, documentation, benchmarking,
  site-local, unique-local, multicast, reserved...), IPv4 embedded in IPv6
  (mapped, NAT64, 6to4, Teredo) included; IPv6 outside global unicast
  (``2000::/3``) is refused too. An address or host name in the :class:`AllowList`
  passes. The connection goes to a checked address — never through a second lookup
  — so a DNS answer that changes in between (rebinding) cannot redirect it; TLS
  still verifies the certificate against the host name. :func:`check_destination`
  gives the same check to callers that open their own connections (a database).
* **No redirects**: a 3xx raises :class:`RedirectRefused` naming its ``Location``.
* **Size**: a body over ``max_bytes`` raises :class:`ResponseTooLarge`.
* **Time**: connecting, sending, the headers and the body together obey ``deadline``
  (an :class:`agent.deadline.Deadline`, usually the turn's narrowed by the caller's
  timeout): every socket wait is a ``select`` of at most ``POLL_SECONDS``, so a
  server that drips one byte a second, or a cancel, ends the call within that much
  of the end. ``deadline.check()`` raises the error naming the limit (cancel, the
  turn's ``max_seconds``, or the caller's timeout).
* No proxy is ever used (it would defeat the address check); header values are never
  logged or put in errors (they may be secrets).

Errors: :class:`DestinationRefused` (a ``PermissionError``), :class:`RedirectRefused`,
:class:`ResponseTooLarge` and :class:`NetError` (connection failures, as
``OSError``); plus what ``deadline.check()`` raises.
"""

from __future__ import annotations

import http.client
import io
import ipaddress
import os
import select
import socket
import ssl
from dataclasses import dataclass
from email.message import Message
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from agent.deadline import Deadline

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_URL_SAFE = ":/?#[]@!$&'()*+,;=%~"
_CHUNK = 64 * 1024

#: Special-purpose ranges no call may reach unless allow-listed: the IANA IPv4 and
#: IPv6 Special-Purpose Address Registries (all entries, also the few marked globally
#: reachable: anycast relays and AS112 servers are no web service), multicast, and
#: the deprecated IPv6 site-local range. ``(network, reason)``; the first match names it.
DENIED_NETWORKS: tuple[tuple[Network, str], ...] = tuple(
    (ipaddress.ip_network(net), reason)
    for net, reason in (
        # IPv4 (RFC 6890 and successors)
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared address space"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.0.2.0/24", "documentation"),
        ("192.31.196.0/24", "AS112"),
        ("192.52.193.0/24", "AMT"),
        ("192.88.99.0/24", "6to4 relay anycast"),
        ("192.168.0.0/16", "private"),
        ("192.175.48.0/24", "AS112"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
        ("255.255.255.255/32", "broadcast"),
        # IPv6
        ("::1/128", "loopback"),
        ("::/128", "unspecified"),
        ("::/96", "IPv4-compatible (deprecated)"),
        ("64:ff9b:1::/48", "local-use NAT64"),
        ("100::/64", "discard-only"),
        ("100:0:0:1::/64", "dummy prefix"),
        ("2001::/23", "IETF protocol assignments"),
        ("2001:db8::/32", "documentation"),
        ("2620:4f:8000::/48", "AS112"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "segment routing SIDs"),
        ("fc00::/7", "unique-local"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    )
)
_GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class NetError(OSError):
    """The call failed on the way (connection refused, reset, a broken answer)."""


class DestinationRefused(PermissionError):
    """The destination is not public and not allow-listed; nothing was sent."""


class RedirectRefused(NetError):
    """The server answered a redirect; redirects are never followed."""


class ResponseTooLarge(NetError):
    """The answer is over ``max_bytes``; it was not read further."""


# ---------------------------------------------------------------------- destinations
def split_url(url: str) -> tuple[str, str, int, str]:
    """``(scheme, host, port, target)`` of an http(s) URL; ``ValueError`` says what is wrong.

    ``http://`` is assumed when no scheme is given; spaces and non-ASCII text are
    percent-encoded.
    """
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(quote(url, safe=_URL_SAFE))
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"url scheme {parts.scheme!r} is not supported; use http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise ValueError("url must not carry a user name or password; send credentials in headers")
    if not parts.hostname:
        raise ValueError(f"url {url!r} has no host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"url {url!r} has an invalid port") from None
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return parts.scheme, parts.hostname.rstrip(".").lower(), port, target


def refusal_reason(address: Address) -> str | None:
    """Why ``address`` is not a public destination (e.g. ``"loopback"``), or ``None``."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        for inner in embedded:
            reason = refusal_reason(inner)
            if reason:
                return reason if address.ipv4_mapped is not None else f"{reason} (embedded IPv4 {inner})"
    for network, reason in DENIED_NETWORKS:
        if address.version == network.version and address in network:
            return reason
    if isinstance(address, ipaddress.IPv6Address) and address not in _GLOBAL_UNICAST_V6:
        return "not global unicast"
    if not address.is_global:
        return "non-public"
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    found = [a for a in (address.ipv4_mapped, address.sixtofour, *(address.teredo or ())) if a]
    if address in _NAT64:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


class AllowList:
    """Host names and networks that may be reached although not public.

    ``entries``: a list (or a comma/space separated text) of host names and networks
    in CIDR notation; ``ValueError`` names an entry that is neither.
    """

    def __init__(self, entries: Any, setting: str = "invoke.allow_hosts"):
        self.setting = setting
        if isinstance(entries, str):
            entries = [e for e in entries.replace(",", " ").split() if e]
        if entries is None:
            entries = []
        if not isinstance(entries, (list, tuple)):
            raise ValueError(f"{setting} must be a list of host names or networks, got {entries!r}")
        self.hosts: set[str] = set()
        self.networks: list[Network] = []
        for entry in entries:
            text = str(entry).strip().lower().rstrip(".")
            try:
                self.networks.append(ipaddress.ip_network(text.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            if not text or "/" in text or not all(c.isalnum() or c in "-._" for c in text):
                raise ValueError(f"{setting} entry {entry!r} is neither a host name nor a network (CIDR)")
            self.hosts.add(text)

    def allows_host(self, host: str) -> bool:
        return host in self.hosts

    def allows_address(self, address: Address) -> bool:
        forms = [address]
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            forms.append(address.ipv4_mapped)
        return any(a in net for a in forms for net in self.networks if a.version == net.version)


def resolve(host: str, port: int) -> list[Address]:
    """The addresses ``host`` stands for, in the resolver's order (one lookup)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise NetError(f"cannot resolve host {host!r}: {e.strerror or e}") from None
    found: list[Address] = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        if address not in found:
            found.append(address)
    return found


def check_destination(host: str, port: int, allow: AllowList) -> list[Address]:
    """The checked addresses to connect to (one lookup); raises :class:`DestinationRefused`.

    Every address is checked before any connection is attempted. For callers that
    open their own connection (a database driver): connect to one of these addresses.
    """
    addresses = resolve(host, port)
    if allow.allows_host(host):
        return addresses
    permitted, refused = [], []
    for address in addresses:
        reason = refusal_reason(address)
        if reason is None or allow.allows_address(address):
            permitted.append(address)
        else:
            refused.append(f"{address} ({reason})")
    if not permitted:
        raise DestinationRefused(
            f"refused to call {host!r}: it resolves to {', '.join(refused)}, not a public address; "
            f"add the host or its network to {allow.setting} to allow it"
        )
    return permitted


# ---------------------------------------------------------------------- sockets
def _wait(sock: socket.socket, writing: bool, deadline: Deadline) -> None:
    """Block until ``sock`` is ready, in steps that let ``deadline`` stop it."""
    while True:
        deadline.check()
        step = deadline.step()
        if step <= 0:
            deadline.check()
            step = 0.001
        ready = select.select([], [sock], [], step) if writing else select.select([sock], [], [], step)
        if ready[1 if writing else 0]:
            return


def connect(addresses: list[Address], port: int, deadline: Deadline) -> socket.socket:
    """A non-blocking TCP socket connected to the first of ``addresses`` that answers."""
    last: OSError | None = None
    for address in addresses:
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            try:
                sock.connect((str(address), port))
            except BlockingIOError:
                _wait(sock, True, deadline)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, os.strerror(code)) from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as e:
            sock.close()
            last = e
        except BaseException:
            sock.close()
            raise
    assert last is not None
    raise last


def start_tls(sock: socket.socket, host: str, deadline: Deadline) -> ssl.SSLSocket:
    """TLS over a connected non-blocking socket; the certificate must name ``host``."""
    context = ssl.create_default_context()
    tls = context.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
    while True:
        try:
            tls.do_handshake()
            return tls
        except ssl.SSLWantReadError:
            _wait(tls, False, deadline)
        except ssl.SSLWantWriteError:
            _wait(tls, True, deadline)


class GuardedSocket:
    """A connected non-blocking socket whose every wait obeys a deadline.

    Offers what ``http.client`` uses (``sendall``, ``makefile``, ``close``), so a
    connection object can be given one; its reads go through :meth:`recv_into`. As
    with a real socket, :meth:`close` waits for the files made by :meth:`makefile`
    (``http.client`` closes the connection while the response is still read).
    """

    def __init__(self, sock: socket.socket, deadline: Deadline):
        self._sock = sock
        self._deadline = deadline
        self._files = 0
        self._closing = False

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                sent = self._sock.send(view)
            except (BlockingIOError, ssl.SSLWantWriteError):
                _wait(self._sock, True, self._deadline)
                continue
            except ssl.SSLWantReadError:
                _wait(self._sock, False, self._deadline)
                continue
            view = view[sent:]

    def recv_into(self, buffer: Any) -> int:
        while True:
            try:
                return self._sock.recv_into(buffer)
            except (BlockingIOError, ssl.SSLWantReadError):
                _wait(self._sock, False, self._deadline)
            except ssl.SSLWantWriteError:
                _wait(self._sock, True, self._deadline)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        self._files += 1
        return io.BufferedReader(_Reader(self))

    def close(self) -> None:
        self._closing = True
        if self._files <= 0:
            self._sock.close()

    def _file_closed(self) -> None:
        self._files -= 1
        if self._closing and self._files <= 0:
            self._sock.close()


class _Reader(io.RawIOBase):
    def __init__(self, sock: GuardedSocket):
        self._sock: GuardedSocket | None = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        assert self._sock is not None
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if self._sock is not None:
            sock, self._sock = self._sock, None
            sock._file_closed()
        super().close()


class _Connection(http.client.HTTPConnection):
    """``http.client`` over a :class:`GuardedSocket` to checked addresses."""

    def __init__(self, scheme: str, host: str, port: int, addresses: list[Address], deadline: Deadline):
        super().__init__(host, port)
        self._scheme = scheme
        self._addresses = addresses
        self._deadline = deadline

    def connect(self) -> None:
        sock: socket.socket = connect(self._addresses, self.port, self._deadline)
        if self._scheme == "https":
            try:
                sock = start_tls(sock, self.host, self._deadline)
            except BaseException:
                sock.close()
                raise
        self.sock = GuardedSocket(sock, self._deadline)


# ---------------------------------------------------------------------- requests
@dataclass
class Response:
    """A whole answer: ``headers`` is an ``email.message.Message`` (case-insensitive)."""

    status: int
    reason: str
    headers: Message
    body: bytes

    def text(self) -> str:
        return self.body.decode(self.headers.get_content_charset() or "utf-8", errors="replace")

    @property
    def content_type(self) -> str:
        return self.headers.get_content_type()


def request(
    method: str,
    url: str,
    *,
    deadline: Deadline,
    allow: AllowList,
    max_bytes: int,
    query: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> Response:
    """One HTTP(S) call under the module's rules; see the module docstring for errors.

    ``query`` is url-encoded onto the URL's own query. ``ValueError`` for a malformed
    URL (before any lookup).
    """
    scheme, host, port, target = split_url(url)
    if query:
        target += ("&" if "?" in target else "?") + urlencode(query)
    deadline.check()
    addresses = check_destination(host, port, allow)
    conn = _Connection(scheme, host, port, addresses, deadline)
    answer = None
    try:
        conn.request(method.upper(), target, body=body, headers=dict(headers or {}))
        answer = conn.getresponse()
        if 300 <= answer.status < 400:
            location = answer.getheader("Location")
            where = f"to {location!r}" if location else "without a Location"
            raise RedirectRefused(
                f"{host!r} answered {answer.status} {answer.reason}, a redirect {where}; "
                f"redirects are not followed — call the final URL instead"
            )
        data = _read_body(answer, max_bytes)
        return Response(answer.status, answer.reason, answer.headers, data)
    except (RedirectRefused, ResponseTooLarge):
        raise
    except (OSError, http.client.HTTPException) as e:
        raise NetError(f"the request to {host!r} failed: {type(e).__name__}: {e}") from None
    finally:
        if answer is not None:
            answer.close()
        conn.close()


def _read_body(answer: http.client.HTTPResponse, cap: int) -> bytes:
    too_big = f"the answer is larger than max_response_bytes ({cap} bytes); it was not read further"
    length = answer.getheader("Content-Length")
    if length and length.strip().isdigit() and int(length) > cap:
        raise ResponseTooLarge(f"{too_big} (Content-Length {int(length)})")
    parts, size = [], 0
    while True:
        chunk = answer.read1(_CHUNK)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > cap:
            raise ResponseTooLarge(too_big)
        parts.append(chunk)
