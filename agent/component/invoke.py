"""Invoke: call an HTTP endpoint (RAGFlow's "HTTP request" component).

Params (RAGFlow's):
    url: the endpoint, with ``{references}``; ``http://`` is assumed when no scheme is
        given. Only ``http`` and ``https``.
    method: ``get``, ``post`` or ``put``.
    headers: a JSON object (as text, as RAGFlow's editor writes it, or as an object) whose
        string values may hold ``{references}`` — ``{"Authorization": "Bearer {env.key}"}``.
    variables: ``[{"key", "ref"?, "value"?}]``: the query parameters (GET) or the body
        (POST/PUT). ``ref`` is a bare reference whose raw value is sent; without it
        ``value`` is sent, rendered when it holds references.
    datatype: ``json`` (the body is a JSON object; a value that is JSON text of an object
        or a list is sent as that structure, as RAGFlow does) or ``formdata`` (an
        url-encoded form).
    timeout: seconds; the configured ``timeout_seconds`` caps it.
    clean_html: return the text of an HTML answer without tags, scripts and styles.
    proxy: accepted and ignored: requests never go through a proxy, which would defeat
        the address check below.

Outputs: ``result`` — the answer parsed from JSON when the server says it is JSON
(``application/json`` or ``+json``), else its text — and ``status_code``. An answer
with an error status (4xx, 5xx) is an output like any other, so the flow can branch on
``status_code``; what fails the component is a refused destination, a redirect, a
timeout, an answer over the size cap, or a connection error.

Safety (DESIGN §11). Settings come from ``canvas.services["invoke"]`` or else
``agent.settings.load_settings()["invoke"]``: ``allow_hosts`` (host names or networks
in CIDR notation), ``timeout_seconds``, ``max_response_bytes``.

* The host is resolved once, and every address it resolves to is checked: private,
  loopback, link-local, multicast, reserved, unspecified and other non-public
  addresses (IPv4 and IPv6, including IPv4-mapped and 6to4/Teredo-embedded IPv4) are
  refused unless the host name or the address is allow-listed. The connection is made
  to a checked address — never through a second lookup — so a DNS answer that changes
  between check and connect (rebinding) cannot redirect it. TLS still verifies the
  certificate against the host name.
* Redirects are not followed: a 3xx fails with an error naming its ``Location``.
* The time budget covers connecting and reading; reading stops past
  ``max_response_bytes``.
* Header values may be secrets: they are never put in outputs, events, errors or logs.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import socket
import ssl
import time
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.refs import Ref, parse_ref, require_ref, to_text
from agent.settings import load_settings
from agent.stream import LazyText

log = logging.getLogger("agentcanvas.invoke")

DEFAULT_SETTINGS = {"allow_hosts": [], "timeout_seconds": 30, "max_response_bytes": 1024 * 1024}
_CHUNK = 64 * 1024
_URL_SAFE = ":/?#[]@!$&'()*+,;=%~"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def split_url(url: str) -> tuple[str, str, int, str]:
    """``(scheme, host, port, target)`` of an http(s) URL; ``ValueError`` says what is wrong."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    # Rendered values may carry spaces or non-ASCII text; percent-encode just those.
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
        if address.ipv4_mapped is not None:
            return refusal_reason(address.ipv4_mapped)
        for embedded in (address.sixtofour, *(address.teredo or ())):
            if embedded is not None and refusal_reason(embedded):
                return f"{refusal_reason(embedded)} (embedded IPv4 {embedded})"
    for reason in ("loopback", "link_local", "multicast", "unspecified", "reserved", "private"):
        if getattr(address, f"is_{reason}"):
            return reason.replace("_", "-")
    if not address.is_global:
        return "non-public"
    return None


class AllowList:
    """Host names and networks that may be reached although not public."""

    def __init__(self, entries: Any):
        if isinstance(entries, str):
            entries = [e for e in entries.replace(",", " ").split() if e]
        if not isinstance(entries, (list, tuple)):
            raise ValueError(f"invoke.allow_hosts must be a list of host names or networks, got {entries!r}")
        self.hosts: set[str] = set()
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in entries:
            text = str(entry).strip().lower().rstrip(".")
            try:
                self.networks.append(ipaddress.ip_network(text.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            if not text or "/" in text or not all(c.isalnum() or c in "-._" for c in text):
                raise ValueError(
                    f"invoke.allow_hosts entry {entry!r} is neither a host name nor a network (CIDR)"
                )
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
        raise OSError(f"cannot resolve host {host!r}: {e.strerror or e}") from None
    found: list[Address] = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        if address not in found:
            found.append(address)
    return found


def permitted_addresses(host: str, port: int, allow: AllowList) -> list[Address]:
    """The checked addresses to connect to; raises ``PermissionError`` naming the refusal.

    Every address is checked before any connection is attempted.
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
        raise PermissionError(
            f"refused to call {host!r}: it resolves to {', '.join(refused)}, not a public address; "
            f"add the host or its network to invoke.allow_hosts to allow it"
        )
    return permitted


def _open_socket(addresses: list[Address], port: int, timeout: float) -> socket.socket:
    """Connect to the first of ``addresses`` that answers (no name lookup here)."""
    last: OSError | None = None
    for address in addresses:
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect((str(address), port))
            return sock
        except OSError as e:
            sock.close()
            last = e
    assert last is not None
    raise last


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to the given checked addresses; ``Host`` is still the URL's host name."""

    def __init__(self, host: str, port: int, addresses: list[Address], timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._addresses = addresses

    def connect(self) -> None:
        self.sock = _open_socket(self._addresses, self.port, self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to the given checked addresses; the certificate is verified against the host name."""

    def __init__(self, host: str, port: int, addresses: list[Address], timeout: float):
        self._tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self._tls)
        self._addresses = addresses

    def connect(self) -> None:
        sock = _open_socket(self._addresses, self.port, self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self.host)


class _TextOfHTML(HTMLParser):
    _SKIP = {"script", "style", "noscript", "template", "head"}
    _BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "table"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in self._SKIP:
            self._skipping += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP and self._skipping:
            self._skipping -= 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """The visible text of an HTML page, one block per line."""
    parser = _TextOfHTML()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


def _header_templates(headers: Any) -> dict[str, str]:
    """The ``headers`` param as ``{name: template}``; ``ValueError`` naming the problem.

    Values are never quoted in messages: they may be secrets.
    """
    if headers in (None, ""):
        return {}
    if isinstance(headers, str):
        try:
            headers = json.loads(headers)
        except ValueError as e:
            raise ValueError(
                f'headers is not valid JSON ({e.msg}); write a JSON object like {{"Authorization": "Bearer {{env.key}}"}}'
            ) from None
    if not isinstance(headers, dict):
        raise ValueError(f"headers must be a JSON object of name: value, got {type(headers).__name__}")
    out = {}
    for name, value in headers.items():
        if not name or not all(33 <= ord(c) <= 126 and c != ":" for c in name):
            raise ValueError(f"header name {name!r} is not a valid HTTP header name")
        if isinstance(value, (dict, list)) or value is None:
            raise ValueError(f"header {name!r} must have a text value")
        out[name] = value if isinstance(value, str) else to_text(value)
    return out


class InvokeParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.url = ""
        self.method = "get"
        self.headers: Any = ""
        self.variables: list[dict] = []
        self.datatype = "json"
        self.timeout: float = 60
        self.clean_html = False
        self.proxy: Any = None

    def check(self) -> None:
        if not isinstance(self.url, str) or not self.url.strip():
            raise ValueError("url is empty; give the endpoint to call, e.g. 'https://api.example.com/items'")
        if "{" not in self.url:
            split_url(self.url)  # a fixed URL can be checked now; a templated one when it runs
        if not isinstance(self.method, str) or self.method.lower() not in ("get", "post", "put"):
            raise ValueError(f"method {self.method!r} is not one of 'get', 'post', 'put'")
        self.method = self.method.lower()
        if not isinstance(self.datatype, str) or self.datatype.lower() not in ("json", "formdata"):
            raise ValueError(f"datatype {self.datatype!r} is not one of 'json', 'formdata'")
        self.datatype = self.datatype.lower()
        self.check_number("timeout", minimum=0)
        if self.timeout <= 0:
            raise ValueError(f"timeout must be more than 0 seconds, got {self.timeout!r}")
        if not isinstance(self.clean_html, bool):
            raise ValueError(f"clean_html must be true or false, got {self.clean_html!r}")
        self.headers = _header_templates(self.headers)
        self.check_list("variables")
        for n, var in enumerate(self.variables, 1):
            if not isinstance(var, dict) or not isinstance(var.get("key"), str) or not var["key"]:
                raise ValueError(
                    f"variables item {n} needs a 'key' (the parameter name) and a 'ref' or 'value'"
                )
            if var.get("ref"):
                require_ref(var["ref"], f"variables item {n} ({var['key']!r}): ref", "'begin@city'")


@register
class Invoke(ComponentBase):
    """See the module docstring."""

    component_name = "Invoke"
    param_class = InvokeParam

    def references(self) -> list[Ref]:
        refs = super().references()
        refs.extend(parse_ref(var["ref"]) for var in self._param.variables if var.get("ref"))
        return refs

    def _settings(self) -> dict:
        configured = self._canvas.services.get("invoke")
        if configured is None:
            configured = load_settings().get("invoke") or {}
        return {**DEFAULT_SETTINGS, **configured}

    def _arguments(self) -> dict[str, Any]:
        args = {}
        for var in self._param.variables:
            if var.get("ref"):
                value = self.get_value(var["ref"])
                value = value.text if isinstance(value, LazyText) else value
            else:
                value = self.render_value(var.get("value"))
            if self._param.datatype == "json" and isinstance(value, str):
                try:
                    parsed = json.loads(value)
                except ValueError:
                    parsed = None
                if isinstance(parsed, (dict, list)):
                    value = parsed
            args[var["key"]] = value
        return args

    def _headers(self, has_body: bool) -> dict[str, str]:
        headers = {"User-Agent": "agentcanvas-invoke", "Accept": "*/*"}
        if has_body:
            kind = (
                "application/json" if self._param.datatype == "json" else "application/x-www-form-urlencoded"
            )
            headers["Content-Type"] = kind
        for name, template in self._param.headers.items():
            value = self.render(template)
            if "\r" in value or "\n" in value:
                raise self.fail(f"header {name!r} holds a line break after rendering; remove it")
            for existing in [k for k in headers if k.lower() == name.lower()]:
                del headers[existing]
            headers[name] = value
        return headers

    def _invoke(self, **kwargs: Any) -> None:
        settings = self._settings()
        try:
            allow = AllowList(settings.get("allow_hosts") or [])
        except ValueError as e:
            raise self.fail(str(e), retryable=False) from None
        timeout = min(float(self._param.timeout), float(settings["timeout_seconds"]))
        cap = int(settings["max_response_bytes"])

        url = self.render(self._param.url)
        try:
            scheme, host, port, target = split_url(url)
        except ValueError as e:
            raise self.fail(str(e), retryable=False) from None
        method = self._param.method.upper()
        args = self._arguments()
        self.inputs_seen = {"url": url, "method": method, "variables": args}
        body = None
        if method == "GET":
            if args:
                query = urlencode({k: to_text(v) for k, v in args.items()})
                target += ("&" if "?" in target else "?") + query
        elif self._param.datatype == "json":
            body = json.dumps(args, ensure_ascii=False, default=str).encode("utf-8")
        else:
            body = urlencode({k: to_text(v) for k, v in args.items()}).encode("utf-8")
        headers = self._headers(body is not None)

        try:
            addresses = permitted_addresses(host, port, allow)
        except PermissionError as e:
            raise self.fail(str(e), retryable=False) from None
        except OSError as e:  # the name did not resolve: perhaps a passing DNS failure
            raise self.fail(str(e)) from None
        log.info("%s: %s %s://%s:%s", self.id, method, scheme, host, port)
        connection_class = _PinnedHTTPSConnection if scheme == "https" else _PinnedHTTPConnection
        conn = connection_class(host, port, addresses, timeout)
        deadline = time.monotonic() + timeout
        try:
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            status = response.status
            if 300 <= status < 400:
                location = response.getheader("Location")
                where = f"to {location!r}" if location else "without a Location"
                raise self.fail(
                    f"{host!r} answered {status} {response.reason}, a redirect {where}; "
                    f"redirects are not followed — call the final URL instead",
                    retryable=False,
                )
            raw = self._read(response, cap, deadline, timeout)
        except TimeoutError:
            raise self.fail(f"{host!r} did not answer within {timeout:g} s (timeout)") from None
        except (OSError, http.client.HTTPException) as e:
            raise self.fail(f"the request to {host!r} failed: {type(e).__name__}: {e}") from None
        finally:
            conn.close()

        text = raw.decode(response.headers.get_content_charset() or "utf-8", errors="replace")
        content_type = response.headers.get_content_type()
        result: Any = text
        if content_type == "application/json" or content_type.endswith("+json"):
            try:
                result = json.loads(text)
            except ValueError:
                result = text
        elif self._param.clean_html:
            result = html_to_text(text)
        self.set_output("result", result)
        self.set_output("status_code", status)

    def _read(self, response: http.client.HTTPResponse, cap: int, deadline: float, timeout: float) -> bytes:
        """The body, at most ``cap`` bytes; fails past the cap or the deadline."""
        too_big = f"the answer is larger than max_response_bytes ({cap} bytes); it was not read further"
        length = response.getheader("Content-Length")
        if length and length.strip().isdigit() and int(length) > cap:
            raise self.fail(f"{too_big} (Content-Length {int(length)})", retryable=False)
        parts, size = [], 0
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError()
            chunk = response.read1(_CHUNK) if hasattr(response, "read1") else response.read(_CHUNK)
            if not chunk:
                return b"".join(parts)
            size += len(chunk)
            if size > cap:
                raise self.fail(too_big, retryable=False)
            parts.append(chunk)
