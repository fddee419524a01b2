"""create_app's layering: defaults, then conf/ and AGENTCANVAS_* variables, then the dict;
stop_background ending what it started."""

from __future__ import annotations

import datetime
import decimal
import importlib
import pkgutil
import threading
import uuid
from typing import Any

import pytest
from flask import Blueprint, Flask
from flask.json.provider import DefaultJSONProvider

from api import create_app, stop_background
from tests.api.conftest import Api, echo_dsl, make_token
from tests.api.test_datasets import parsed_dataset


def test_environment_overrides_conf_and_the_dict_overrides_both(monkeypatch, app_factory):
    monkeypatch.setenv("AGENTCANVAS_LIMITS_PAGE_SIZE", "5")
    from_env = app_factory()
    api = Api(from_env, make_token(from_env))
    resp = api.get("/agents", query_string={"page_size": 6})
    assert resp.status_code == 400 and "between 1 and 5" in resp.json["message"]

    from_dict = app_factory(PAGE_SIZE=50)
    assert Api(from_dict, api.token).get("/agents", query_string={"page_size": 6}).status_code == 200


def test_database_url_from_the_environment(monkeypatch, database_url, started_apps):
    monkeypatch.setenv("AGENTCANVAS_DATABASE_URL", database_url)
    app = create_app()
    started_apps.append(app)
    assert app.config["DATABASE_URL"] == database_url


def test_a_stopped_app_leaves_none_of_its_threads_running_and_still_answers(app_factory):
    """Parse threads, the sweeper, the lease keepers and turns all end: one left running
    went on using the process's database handle, and closing the pool under its query
    crashed SQLite's driver (a segfault that hung the whole xdist run)."""
    before = set(threading.enumerate())
    app = app_factory(SWEEP_INTERVAL_SECONDS=0.05)
    api = Api(app, make_token(app))
    parsed_dataset(api)
    agent_id = api.create_agent(echo_dsl())
    assert api.ask(agent_id, api.create_session(agent_id), "hi").status_code == 200

    def ours() -> set[str]:
        return {
            t.name for t in threading.enumerate() if t not in before and t.name.startswith("agentcanvas-")
        }

    assert {"agentcanvas-sweeper", "agentcanvas-parse-0", "agentcanvas-lease-keeper-Document"} <= ours()
    assert stop_background(app) == []
    assert ours() == set()
    assert api.ask(agent_id, None, "still there").json["data"]["data"]["content"] == "echo: still there"


@pytest.mark.parametrize(("key", "value"), [("LEASE_SECONDS", 0), ("PAGE_SIZE", "many"), ("LIMITS", [1])])
def test_unusable_settings_are_named(database_url, key, value):
    with pytest.raises(ValueError, match=key):
        create_app({"DATABASE_URL": database_url, key: value})


def test_the_db_package_is_reachable_through_api():
    """``api.db`` is the storage package, not the peewee proxy (``api.db.database`` once
    failed with "Cannot use uninitialized Proxy" because create_app's module bound ``db``)."""
    import api
    import api.db.database

    assert api.db.database.open_database is not None
    assert api.db.db is api.db.database.db


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": "é ü 中", "n": None, "t": True, "l": [1.5, -2, "x"]},  # order and non-ASCII kept
        {1: "int key", "when": datetime.datetime(2026, 1, 2, 3, 4, 5), "d": decimal.Decimal("1.25")},
        {"beyond 64 bits": 2**70, "id": uuid.UUID(int=7)},
        [],
    ],
)
def test_json_replies_read_as_flask_writes_them(app_factory, value):
    app = app_factory()
    flask_own = DefaultJSONProvider(app)
    flask_own.ensure_ascii = flask_own.sort_keys = False
    with app.test_request_context():
        ours = app.json.response(value)
        theirs = flask_own.response(value)
    assert ours.mimetype == "application/json"
    assert ours.get_data() == theirs.get_data()


def test_every_blueprint_defined_in_api_blueprints_is_served():
    """The list in api.blueprints is explicit: a module whose blueprint is missing from it
    (and from the blueprints nested in a listed one) fails here, not silently as a 404."""
    package = importlib.import_module("api.blueprints")
    defined = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        defined |= {f"{info.name}.{name}": v for name, v in vars(module).items() if isinstance(v, Blueprint)}

    app = Flask(__name__)
    package.register_all(app)
    served = set(app.iter_blueprints())
    assert sorted(name for name, bp in defined.items() if bp not in served) == []


def test_views_read_models_through_services():
    """No blueprint module holds a model class: its reads and writes are in api/services/."""
    from peewee import Model

    package = importlib.import_module("api.blueprints")
    holding = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        holding += [
            f"{info.name}.{name}"
            for name, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, Model)
        ]
    assert holding == []


def _routed(app: Flask) -> Flask:
    """A few routes of each kind: static, converted, a trailing slash, a path tail, a
    value preprocessor that takes a value out of the view's arguments."""
    seen = []

    @app.url_value_preprocessor
    def take_lang(endpoint, values):  # noqa: ANN001, ANN202 - a Flask hook
        if values and "lang" in values:
            seen.append(values.pop("lang"))

    app.add_url_rule("/a/<x>/b", "ab", lambda x: f"ab {x}", methods=["GET", "POST"])
    app.add_url_rule("/n/<int:k>", "n", lambda k: f"n {k + 1}")
    app.add_url_rule("/things/", "things", lambda: "things")
    app.add_url_rule("/files/<path:rest>", "files", lambda rest: f"files {rest}")
    app.add_url_rule("/<lang>/hello", "hello", lambda: f"hello {seen[-1]}")

    def page(page):  # noqa: ANN001, ANN202 - a Flask view
        return f"d {page}"

    app.add_url_rule("/d/", "d", page, defaults={"page": 1})
    app.add_url_rule("/d/<int:page>", "d", page)
    return app


def test_routes_remembered_by_the_app_answer_as_flask_routes_them():
    """api.App keeps the rule and values a path matched (_RouteMemory); every request,
    first or repeated, is answered as by Flask's own matching: values, 404, 405,
    redirects (a missing trailing slash, merged slashes, a default), HEAD, OPTIONS."""
    from api import App

    ours, theirs = _routed(App("ours")), _routed(Flask("theirs"))
    requests = [
        ("GET", "/a/1/b"), ("POST", "/a/1/b"), ("PUT", "/a/1/b"), ("GET", "/a/2/b"), ("HEAD", "/a/2/b"),
        ("OPTIONS", "/a/2/b"), ("GET", "/n/5"), ("GET", "/n/x"), ("GET", "/n/-1"), ("GET", "/things"),
        ("GET", "/things/"), ("GET", "//a//3/b"), ("GET", "/files/x/y.txt"), ("GET", "/files/"),
        ("GET", "/en/hello"), ("GET", "/fr/hello"), ("GET", "/d/"), ("GET", "/d/1"), ("GET", "/d/2"),
        ("GET", "/nowhere"),
    ]  # fmt: skip
    answers = []
    for client in (ours.test_client(), theirs.test_client()):
        answers.append(
            [
                (method, path, r.status_code, r.get_data(), r.headers.get("Location"), r.headers.get("Allow"))
                for _ in range(3)
                for method, path in requests
                for r in [client.open(path, method=method)]
            ]
        )
    assert answers[0] == answers[1]
    assert ours.url_map._matcher._known  # it did remember


def test_the_route_memory_forgets_when_full_and_when_rules_change():
    from api import App

    app = _routed(App("ours"))
    memory = app.url_map._matcher
    memory.MEMORY = 3
    client = app.test_client()
    for n in range(5):
        assert client.get(f"/n/{n}").get_data() == f"n {n + 1}".encode()
    assert 0 < len(memory._known) <= 3
    app.url_map.add(type(next(app.url_map.iter_rules()))("/late", endpoint="late"))
    assert memory._known == {}


def _bound(routes, environ: dict, **kwargs: Any) -> tuple:  # noqa: ANN001 - a werkzeug Map
    """What ``routes.bind_to_environ`` made of ``environ``: the adapter's fields, or the error."""
    try:
        adapter = routes.bind_to_environ(environ, **kwargs)
    except Exception as exc:  # noqa: BLE001 - compared, not handled
        return (type(exc), str(exc))
    return tuple(
        getattr(adapter, name)
        for name in (
            "server_name", "script_name", "subdomain", "url_scheme", "path_info",
            "default_method", "query_args", "websocket",
        )
    )  # fmt: skip


def test_the_app_binds_its_routes_to_a_request_as_werkzeug_does():
    """api.App's URL map keeps what it worked out from where a request came from
    (_Routes.bind_to_environ); first or repeated, each request is bound as Werkzeug
    binds it: host or server address, ports, IDNA, websocket upgrades, script names,
    paths and queries in latin-1, host matching, a subdomain or a server name given."""
    from werkzeug.routing import Map
    from werkzeug.test import EnvironBuilder

    from api import App

    def environs() -> list[dict]:
        made = [
            EnvironBuilder(path="/api/v1/agents/x/completions", method="POST").get_environ(),
            EnvironBuilder(path="/a", base_url="http://Example.COM:80/").get_environ(),
            EnvironBuilder(path="/a", base_url="https://example.com:443/app/").get_environ(),
            EnvironBuilder(
                path="/a", base_url="https://example.com:8443/", query_string="q=1&r=é"
            ).get_environ(),
            EnvironBuilder(path="/caf\u00e9", base_url="http://b\u00fccher.example/").get_environ(),
            EnvironBuilder(
                path="/ws", headers={"Connection": "keep-alive, Upgrade", "Upgrade": "websocket"}
            ).get_environ(),
            EnvironBuilder(
                path="/ws", base_url="https://h/", headers={"Connection": "upgrade", "Upgrade": "WebSocket"}
            ).get_environ(),
        ]
        no_host = EnvironBuilder(path="/a").get_environ()
        del no_host["HTTP_HOST"]
        no_query = EnvironBuilder(path="/a").get_environ()
        del no_query["QUERY_STRING"], no_query["PATH_INFO"]
        one = EnvironBuilder(path="/a").get_environ()
        # each value the binding depends on, changed alone
        varied = (
            [
                {**one, "HTTP_HOST": host, "wsgi.url_scheme": scheme}
                for host in ("h:443", "h:80", "H")
                for scheme in ("http", "https")
            ]
            + [
                {**one, "HTTP_CONNECTION": connection, "HTTP_UPGRADE": upgrade}
                for connection in ("upgrade", "keep-alive")
                for upgrade in ("websocket", "h2c")
            ]
            + [
                {**no_host, "SERVER_NAME": name, "SERVER_PORT": port}
                for name in ("::1", "s.example")
                for port in ("8080", "80", "unix")
            ]
            + [{**one, "SCRIPT_NAME": script} for script in ("", "/app", "/caf\u00c3\u00a9")]
        )
        return [*made, no_host, no_query, *varied]

    for options in ({}, {"host_matching": True}, {"default_subdomain": "www"}):
        ours, theirs = App("ours").url_map_class(**options), Map(**options)
        for subdomain, server_name in ((None, None), ("", None), ("api", None), (None, "example.com")):
            for n in range(4):
                if n == 2:  # Flask sets these after making the map
                    ours.default_subdomain = theirs.default_subdomain = "www2"
                if n == 3:
                    ours.host_matching = theirs.host_matching = not options.get("host_matching")
                for environ in environs():
                    mine, werkzeugs = (
                        _bound(routes, environ, server_name=server_name, subdomain=subdomain)
                        for routes in (ours, theirs)
                    )
                    assert mine == werkzeugs, environ
        assert ours._origins  # it did remember


@pytest.mark.parametrize(
    ("status", "headers", "method", "on_close", "body"),
    [
        (200, {}, "POST", False, None),
        (201, {"X-Request": "r"}, "GET", False, None),
        (429, {"Retry-After": "3"}, "POST", False, None),
        (200, {}, "HEAD", False, None),
        (204, {}, "DELETE", False, None),
        (302, {"Location": "/elsewhere"}, "GET", False, None),
        (200, {"Content-Location": "/caf\u00e9"}, "GET", False, None),
        (200, {}, "GET", True, None),
        (200, {}, "GET", False, ["two ", "parts"]),
        (200, {}, "GET", False, "set"),
    ],
)
def test_a_json_reply_reaches_the_server_as_werkzeug_hands_it_over(
    app_factory, status, headers, method, on_close, body
):
    """api.http.JsonReply hands a plain reply to the WSGI server more directly: the status,
    headers and bytes are Werkzeug's, and its close hooks still run, whatever the reply."""
    from flask import Response
    from werkzeug.test import EnvironBuilder

    from api.http import JsonReply

    app = app_factory()
    results = []
    for kind in (JsonReply, Response):
        environ = EnvironBuilder(path="/api/v1/agents/x", method=method).get_environ()
        closed = []
        with app.test_request_context():
            reply = app.json.response({"code": 0, "data": {"é": [1, None]}})
            assert type(reply) is JsonReply
            reply.__class__ = kind
            reply.status_code = status
            reply.headers.update(headers)
            if on_close:
                reply.call_on_close(lambda closed=closed: closed.append(True))
            if body == "set":
                reply.set_data("replaced")
            elif body is not None:
                reply.response = list(body)
        started: list = []

        def start_response(status: str, headers: list, exc_info: Any = None, started: list = started) -> None:
            started.append((status, headers))

        app_iter = reply(environ, start_response)
        sent = b"".join(app_iter)
        if hasattr(app_iter, "close"):
            app_iter.close()
        results.append((started, sent, closed))
    assert results[0] == results[1]
    assert results[0][2] == ([True] if on_close else [])


@pytest.mark.parametrize("body", [b"", b'{"code":0}\n', "é 中".encode()])
def test_a_json_reply_is_made_as_werkzeug_makes_it(body):
    """JsonReply.of sets a reply's attributes directly: they are the ones Werkzeug's
    constructor sets, with the same values (a Werkzeug that sets others fails here)."""
    from flask import Response

    from api.http import JsonReply

    ours = JsonReply.of(body, "application/json")
    theirs = JsonReply(body, mimetype="application/json")
    assert isinstance(ours, Response)
    assert sorted(vars(ours)) == sorted(vars(theirs))
    for name, value in vars(theirs).items():
        if name == "headers":
            assert list(ours.headers) == list(value) and type(ours.headers) is type(value)
        else:
            assert getattr(ours, name) == value, name
    assert ours.get_data() == body and ours.status == "200 OK" and ours.mimetype == "application/json"
