"""Invoke: HTTP calls against a real server on 127.0.0.1, and the destination checks."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError
from tests.agent.dsl_helpers import answer, final, make_dsl, node, outputs_of, run

SECRET = "s3cret-token-value"
LOCAL = {"allow_hosts": ["127.0.0.1"], "timeout_seconds": 5, "max_response_bytes": 4096}


class Handler(BaseHTTPRequestHandler):
    """Answers by path; records every request on the server."""

    def log_message(self, *args):  # keep the test output quiet
        pass

    def _reply(self, status, body, content_type="text/plain; charset=utf-8", headers=()):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _handle(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        self.server.requests.append(
            {"method": self.command, "path": self.path, "headers": dict(self.headers)}
        )
        path = urlsplit(self.path).path
        if path == "/json":
            self._reply(200, json.dumps({"name": "ok", "n": 1}), "application/json")
        elif path == "/echo":
            echo = {
                "method": self.command,
                "path": self.path,
                "body": body,
                "type": self.headers.get("Content-Type"),
            }
            self._reply(200, json.dumps(echo), "application/json")
        elif path == "/text":
            self._reply(200, "plain words")
        elif path == "/html":
            page = "<html><head><title>T</title><style>p{}</style></head><body><h1>Hi</h1><script>x()</script><p>there  you</p></body></html>"
            self._reply(200, page, "text/html")
        elif path == "/missing":
            self._reply(404, "nope")
        elif path == "/redirect":
            self._reply(302, "", headers=[("Location", "/json")])
        elif path == "/big":
            self._reply(200, "x" * 5000)
        elif path == "/big-unsized":
            # No Content-Length: the body ends when the connection closes.
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Connection", "close")
            self.end_headers()
            for _ in range(50):
                self.wfile.write(b"y" * 1000)
            self.close_connection = True
        elif path == "/slow":
            self.server.release.wait(10)
            try:
                self._reply(200, "late")
            except ConnectionError:  # the client gave up waiting, as a deadline test wants
                self.close_connection = True
        else:
            self._reply(500, "unknown path")

    do_GET = do_POST = do_PUT = _handle


def serve(wrap=None):
    """A local test server in a thread (``wrap`` may turn its socket into TLS); stop with ``stop(srv)``."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.requests, srv.release = [], threading.Event()
    if wrap is not None:
        srv.socket = wrap(srv.socket)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    return srv


def stop(srv) -> None:
    srv.release.set()
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def server():
    srv = serve()
    yield srv
    stop(srv)


@pytest.fixture
def connects(monkeypatch):
    """Every address a socket connected to during the test (the real connect still runs)."""
    seen = []
    real = socket.socket.connect

    def spy(sock, address):
        seen.append(address)
        return real(sock, address)

    monkeypatch.setattr(socket.socket, "connect", spy)
    return seen


@pytest.fixture
def localhost():
    """Skips the test where 'localhost' does not resolve (it is looked up locally, never on the network)."""
    try:
        socket.getaddrinfo("localhost", 80)
    except socket.gaierror:
        pytest.skip("this machine cannot resolve 'localhost'")
    return "localhost"


def base(srv, host="127.0.0.1"):
    return f"http://{host}:{srv.server_address[1]}"


def invoke_canvas(params, show="{Invoke:Call@result}", settings=LOCAL, begin=None, variables=None):
    dsl = make_dsl(
        node("Invoke:Call", "Invoke", params),
        node("Message:Show", "Message", {"content": [show]}),
        begin=begin,
        variables=variables,
    )
    services = {} if settings is None else {"invoke": settings}
    return Canvas(dsl, services=services)


def test_get_parses_json_answers_and_reports_the_status(server):
    canvas = invoke_canvas(
        {"url": base(server) + "/json"}, show="{Invoke:Call@result.name} {Invoke:Call@status_code}"
    )
    events = run(canvas, "go")
    assert final(events)["status"] == "succeeded"
    assert answer(events) == "ok 200"
    assert outputs_of(events, "Invoke:Call") == {"result": {"name": "ok", "n": 1}, "status_code": 200}


def test_url_references_and_variables_make_the_query_of_a_get(server):
    params = {
        "url": base(server) + "/{begin@where}",
        "method": "GET",
        "variables": [{"key": "city", "ref": "begin@city"}, {"key": "note", "value": "for {sys.query}"}],
    }
    form = {"where": {"name": "Where", "type": "line"}, "city": {"name": "City", "type": "line"}}
    events = run(
        invoke_canvas(params, begin={"inputs": form}), "Ann", inputs={"where": "echo", "city": "São Paulo"}
    )
    assert final(events)["status"] == "succeeded"
    echoed = outputs_of(events, "Invoke:Call")["result"]
    query = parse_qs(urlsplit(echoed["path"]).query)
    assert query == {"city": ["São Paulo"], "note": ["for Ann"]} and echoed["method"] == "GET"


def test_post_sends_a_json_body_with_raw_and_json_text_values(server):
    params = {
        "url": base(server) + "/echo",
        "method": "post",
        "variables": [
            {"key": "tags", "ref": "env.tags"},
            {"key": "filter", "value": '{"age": 3}'},
            {"key": "who", "value": "{sys.query}"},
        ],
    }
    canvas = invoke_canvas(params, variables={"tags": {"type": "array<string>", "value": ["a", "b"]}})
    events = run(canvas, "Bo")
    echoed = outputs_of(events, "Invoke:Call")["result"]
    assert echoed["method"] == "POST" and echoed["type"] == "application/json"
    assert json.loads(echoed["body"]) == {"tags": ["a", "b"], "filter": {"age": 3}, "who": "Bo"}


def test_put_formdata_sends_an_urlencoded_form(server):
    params = {
        "url": base(server) + "/echo",
        "method": "PUT",
        "datatype": "formdata",
        "variables": [{"key": "a", "value": "1 & 2"}, {"key": "b", "value": "x"}],
    }
    events = run(invoke_canvas(params), "go")
    echoed = outputs_of(events, "Invoke:Call")["result"]
    assert echoed["method"] == "PUT" and echoed["type"] == "application/x-www-form-urlencoded"
    assert parse_qs(echoed["body"]) == {"a": ["1 & 2"], "b": ["x"]}


def test_headers_are_sent_but_never_appear_in_events_or_logs(server, caplog):
    caplog.set_level(logging.DEBUG)
    params = {
        "url": base(server) + "/json",
        "headers": json.dumps({"Authorization": "Bearer {env.token}", "X-Api-Key": SECRET + "-literal"}),
    }
    canvas = invoke_canvas(params, variables={"token": {"type": "string", "value": SECRET}})
    events = run(canvas, "go")
    assert final(events)["status"] == "succeeded"
    sent = server.requests[0]["headers"]
    assert sent["Authorization"] == "Bearer " + SECRET and sent["X-Api-Key"] == SECRET + "-literal"
    assert SECRET not in json.dumps(events)
    assert SECRET not in caplog.text
    # A failing call does not leak them either.
    params["url"] = base(server) + "/redirect"
    events = run(invoke_canvas(params, variables={"token": {"type": "string", "value": SECRET}}), "go")
    assert final(events)["status"] == "failed" and SECRET not in json.dumps(events)
    assert SECRET not in caplog.text


def test_an_error_status_is_an_output_not_a_failure(server):
    events = run(
        invoke_canvas(
            {"url": base(server) + "/missing"}, show="{Invoke:Call@status_code}: {Invoke:Call@result}"
        ),
        "go",
    )
    assert final(events)["status"] == "succeeded"
    assert answer(events) == "404: nope"


def test_text_answers_stay_text_and_clean_html_keeps_only_the_visible_text(server):
    events = run(invoke_canvas({"url": base(server) + "/text"}), "go")
    assert outputs_of(events, "Invoke:Call")["result"] == "plain words"
    events = run(invoke_canvas({"url": base(server) + "/html", "clean_html": True}), "go")
    assert outputs_of(events, "Invoke:Call")["result"] == "Hi\nthere you"


def test_redirects_are_not_followed(server):
    events = run(invoke_canvas({"url": base(server) + "/redirect"}), "go")
    data = final(events)
    assert data["status"] == "failed"
    assert "302" in data["error"] and "'/json'" in data["error"] and "not followed" in data["error"]
    assert [r["path"] for r in server.requests] == ["/redirect"]


def test_failures_that_cannot_change_are_not_retried_but_a_refused_connection_is(server):
    for params, settings, expected_sleeps in (
        ({"url": base(server) + "/redirect"}, LOCAL, 0),
        ({"url": base(server) + "/big"}, LOCAL, 0),
        ({"url": f"http://10.0.0.1:{server.server_address[1]}/json"}, {"allow_hosts": []}, 0),
        ({"url": f"http://127.0.0.1:{_closed_port()}/json"}, LOCAL, 2),
    ):
        canvas = invoke_canvas({**params, "max_retries": 2, "delay_after_error": 5}, settings=settings)
        slept = []
        canvas.sleep = slept.append
        assert final(run(canvas, "go"))["status"] == "failed"
        assert len(slept) == expected_sleeps, params


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("path", ["/big", "/big-unsized"])
def test_answers_over_the_size_cap_fail_clearly(server, path):
    events = run(invoke_canvas({"url": base(server) + path}), "go")
    data = final(events)
    assert data["status"] == "failed"
    assert "Invoke:Call: the answer is larger than max_response_bytes (4096 bytes)" in data["error"]


def test_a_server_that_does_not_answer_in_time_fails_with_a_timeout(server):
    settings = {**LOCAL, "timeout_seconds": 0.3}
    events = run(invoke_canvas({"url": base(server) + "/slow", "timeout": 60}, settings=settings), "go")
    data = final(events)
    assert data["status"] == "failed"
    assert "'127.0.0.1' did not answer within 0.3 s (timeout)" in data["error"]


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("10.0.0.1", "private"),
        ("169.254.169.254", "link-local"),
        ("[::1]", "loopback"),
        ("[::ffff:127.0.0.1]", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("2130706433", "loopback"),  # 127.0.0.1 written as one number
        # IANA special-purpose ranges that is_private/is_global do not all catch
        ("[fec0::1]", "site-local"),
        ("192.0.0.8", "IETF protocol assignments"),
        ("100.64.0.1", "shared address space"),
        ("198.18.0.1", "benchmarking"),
        ("[2001:db8::1]", "documentation"),
        ("[64:ff9b::7f00:1]", "loopback (embedded IPv4 127.0.0.1)"),
        ("[2002:7f00:1::]", "loopback (embedded IPv4 127.0.0.1)"),
        ("[fd00::1]", "unique-local"),
    ],
)
def test_non_public_addresses_are_refused_before_any_connection(server, connects, host, reason):
    canvas = invoke_canvas(
        {"url": f"http://{host}:{server.server_address[1]}/json"}, settings={"allow_hosts": []}
    )
    events = run(canvas, "go")
    data = final(events)
    assert data["status"] == "failed"
    assert f"Invoke:Call: refused to call {host.strip('[]')!r}" in data["error"]
    assert f"({reason})" in data["error"] and "invoke.allow_hosts" in data["error"]
    assert connects == [] and server.requests == []


def test_without_invoke_services_the_configured_settings_apply(server, connects, monkeypatch):
    monkeypatch.delenv("AGENTCANVAS_INVOKE_ALLOW_HOSTS", raising=False)
    events = run(invoke_canvas({"url": base(server) + "/json"}, settings=None), "go")
    assert final(events)["status"] == "failed" and "refused" in final(events)["error"]
    assert connects == [] and server.requests == []


def test_a_network_in_the_allow_list_admits_its_addresses(server):
    events = run(
        invoke_canvas({"url": base(server) + "/text"}, settings={"allow_hosts": ["127.0.0.0/8"]}), "go"
    )
    assert answer(events) == "plain words"


def test_a_host_name_is_resolved_once_and_the_checked_address_is_called(
    server, connects, monkeypatch, localhost
):
    lookups = []
    real = socket.getaddrinfo

    def counting(host, *args, **kwargs):
        lookups.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", counting)
    port = server.server_address[1]
    canvas = invoke_canvas(
        {"url": f"http://localhost:{port}/text"}, settings={"allow_hosts": ["127.0.0.1/32"]}
    )
    events = run(canvas, "go")
    assert answer(events) == "plain words"
    assert lookups == ["localhost"]
    assert connects == [("127.0.0.1", port)]
    assert server.requests[0]["headers"]["Host"] == f"localhost:{port}"


def test_an_allow_listed_host_name_may_be_called(server, localhost):
    port = server.server_address[1]
    canvas = invoke_canvas({"url": f"http://LocalHost:{port}/text"}, settings={"allow_hosts": ["localhost"]})
    assert answer(run(canvas, "go")) == "plain words"


def test_a_malformed_allow_list_entry_fails_naming_the_setting(server):
    events = run(
        invoke_canvas({"url": base(server) + "/json"}, settings={"allow_hosts": ["10.0.0.0/33"]}), "go"
    )
    assert (
        "invoke.allow_hosts entry '10.0.0.0/33' is neither a host name nor a network"
        in final(events)["error"]
    )


@pytest.fixture
def tls_server(tmp_path):
    """The same handler over HTTPS, with a fresh self-signed certificate for 'localhost' only."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    srv = serve(lambda sock: context.wrap_socket(sock, server_side=True))
    srv.cert = cert
    yield srv
    stop(srv)


def test_https_verifies_the_certificate_against_the_url_host(tls_server, monkeypatch, localhost):
    """The connection goes to the checked address, but TLS still checks the host name."""
    port = tls_server.server_address[1]
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_server.cert))  # trust the test certificate
    events = run(
        invoke_canvas({"url": f"https://localhost:{port}/text"}, settings={"allow_hosts": ["localhost"]}),
        "go",
    )
    assert answer(events) == "plain words"
    # The certificate names 'localhost', not the address: calling the address must fail.
    events = run(invoke_canvas({"url": f"https://127.0.0.1:{port}/text"}), "go")
    assert final(events)["status"] == "failed"
    assert "SSLCertVerificationError" in final(events)["error"]


def test_an_untrusted_certificate_fails(tls_server, localhost):
    port = tls_server.server_address[1]
    events = run(
        invoke_canvas({"url": f"https://localhost:{port}/text"}, settings={"allow_hosts": ["localhost"]}),
        "go",
    )
    assert final(events)["status"] == "failed"
    assert "certificate verify failed" in final(events)["error"]


def test_a_closed_port_fails_with_the_connection_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    events = run(invoke_canvas({"url": f"http://127.0.0.1:{port}/"}), "go")
    assert final(events)["status"] == "failed"
    assert "the request to '127.0.0.1' failed: ConnectionRefusedError" in final(events)["error"]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"url": ""}, "url is empty"),
        ({"url": "ftp://example.com/x"}, "url scheme 'ftp' is not supported"),
        ({"url": "http://me:pw@example.com/"}, "must not carry a user name or password"),
        ({"url": "http://example.com", "method": "delete"}, "method 'delete' is not one of"),
        ({"url": "http://example.com", "datatype": "xml"}, "datatype 'xml' is not one of"),
        ({"url": "http://example.com", "timeout": 0}, "timeout must be more than 0 seconds"),
        ({"url": "http://example.com", "headers": "{not json"}, "headers is not valid JSON"),
        (
            {"url": "http://example.com", "headers": '{"Bad Name": "v"}'},
            "header name 'Bad Name' is not a valid HTTP header name",
        ),
        ({"url": "http://example.com", "variables": [{"value": 1}]}, "variables item 1 needs a 'key'"),
        (
            {"url": "http://example.com", "variables": [{"key": "a", "ref": "Gone:X@y"}]},
            "unknown component 'Gone:X'",
        ),
    ],
)
def test_malformed_params_are_dsl_errors_naming_the_component(params, message):
    with pytest.raises(DSLError, match=message) as err:
        invoke_canvas(params)
    assert str(err.value).startswith("Invoke:Call:")
