"""The REST API: ``create_app(config=None)`` builds the Flask app.

Configuration is layered: :data:`api.config.DEFAULTS`, then ``conf/service_conf.yaml``
with ``AGENTCANVAS_*`` overrides (:func:`agent.settings.load_settings`), then the
``config`` dict (tests pass one). The database is opened and its schema brought up to
date here, so every process that builds the app can serve at once.
"""

from __future__ import annotations

import time
from inspect import iscoroutinefunction
from typing import Any

from flask import Flask
from flask.sessions import SecureCookieSessionInterface
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge
from werkzeug.routing import Map, MapAdapter
from werkzeug.routing.matcher import StateMachineMatcher

from agent.llm.client import load_sdk
from agent.settings import load_settings
from api import config as app_config
from api.blueprints import register_all
from api.blueprints.completions import CompletionLane
from api.db import db as db_proxy  # not ``db``: that name would hide the api.db package
from api.db import init_database
from api.errors import TooLarge
from api.http import JsonReplies, error_reply, wsgi_text
from api.openapi import spec
from api.ratelimit import Limiter
from api.telemetry import configure_tracing_once


class _NoCookieSessions(SecureCookieSessionInterface):
    """The API keeps no cookie sessions (every request carries its token). Without a
    secret key Flask makes each request an empty session that refuses writes; this
    hands out one such session, made once, instead of one per request."""

    _null: Any = None

    def open_session(self, app: Flask, request: Any) -> Any:
        if app.secret_key:
            return super().open_session(app, request)
        if self._null is None:
            self._null = self.make_null_session(app)
        return self._null


class _RouteMemory(StateMachineMatcher):
    """Werkzeug's route matcher, remembering what a path matched.

    Matching walks the rules' state machine part by part (a regular expression per
    dynamic part); every request to ``/api/v1/agents/<id>/completions`` did it again.
    A successful match of the same host, path, method and websocket flag is the same
    rule with the same values while the rules stay as they are, so it is kept (up to
    :attr:`MEMORY` of them, then forgotten all at once) and handed out as a copy: Flask
    passes the values to the view as its arguments. Whatever does not match (404, 405,
    a redirect) is worked out every time, as before. Adding rules forgets everything.
    """

    MEMORY = 1024

    def __init__(self, merge_slashes: bool) -> None:
        self._known: dict[tuple, tuple[Any, dict]] = {}
        super().__init__(merge_slashes)

    @property
    def merge_slashes(self) -> bool:
        return self._merge_slashes

    @merge_slashes.setter
    def merge_slashes(self, value: bool) -> None:
        self._known.clear()
        self._merge_slashes = value

    def add(self, rule: Any) -> None:
        self._known.clear()
        super().add(rule)

    def update(self) -> None:
        self._known.clear()
        super().update()

    def match(self, domain: str, path: str, method: str, websocket: bool) -> tuple[Any, dict]:
        key = (domain, path, method, websocket)
        known = self._known.get(key)
        if known is not None:
            return known[0], dict(known[1])
        rule, values = super().match(domain, path, method, websocket)
        if len(self._known) >= self.MEMORY:
            self._known.clear()
        self._known[key] = (rule, dict(values))
        return rule, values


class _Routes(Map):
    """The app's URL map, matched through :class:`_RouteMemory`, bound to a request
    through :meth:`bind_to_environ`."""

    #: How many request origins (host, scheme, script name...) :meth:`bind_to_environ` remembers.
    ORIGINS = 256

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._matcher = _RouteMemory(self._matcher.merge_slashes)
        self._origins: dict[tuple, tuple[str, str, str | None, str]] = {}

    def bind_to_environ(
        self, environ: Any, server_name: str | None = None, subdomain: str | None = None
    ) -> MapAdapter:
        """Werkzeug's, with the part worked out from where the request came from kept.

        Every request made the adapter anew from its host (validated, lower-cased,
        IDNA-encoded), scheme, upgrade headers and script name; Flask calls this once
        per request with no server name. For the same environ values (the key) that
        part is the same, so it is kept (up to :attr:`ORIGINS`, then forgotten at once)
        and only the path, query and method are read from each request, as Werkzeug
        reads them. A server name given (``SERVER_NAME``: its check may warn) or an
        environ that is not a plain dict goes through Werkzeug every time.
        """
        if server_name is not None or type(environ) is not dict:
            return super().bind_to_environ(environ, server_name, subdomain)
        key = (
            self.host_matching,
            environ.get("HTTP_HOST"),
            environ.get("SERVER_NAME"),
            environ.get("SERVER_PORT"),
            environ["wsgi.url_scheme"],
            environ.get("HTTP_CONNECTION"),
            environ.get("HTTP_UPGRADE"),
            environ.get("SCRIPT_NAME"),
            subdomain,
        )
        origin = self._origins.get(key)
        if origin is None:
            adapter = super().bind_to_environ(environ, server_name, subdomain)
            if len(self._origins) >= self.ORIGINS:
                self._origins.clear()
            self._origins[key] = (
                adapter.server_name,
                adapter.script_name,
                adapter.subdomain,
                adapter.url_scheme,
            )
            return adapter
        path_info = environ.get("PATH_INFO")
        query_args = environ.get("QUERY_STRING")
        return MapAdapter(
            self,
            origin[0],
            origin[1],
            origin[2],
            origin[3],
            "/" if path_info is None else wsgi_text(path_info),
            environ["REQUEST_METHOD"],
            None if query_args is None else wsgi_text(query_args),
        )


class App(Flask):
    """Flask, minus per-request work the API does not need (see :class:`_NoCookieSessions`,
    :meth:`ensure_sync`, :class:`_RouteMemory`, :meth:`_Routes.bind_to_environ`)."""

    session_interface = _NoCookieSessions()
    url_map_class = _Routes
    #: How many functions :meth:`ensure_sync` remembers (the app's views and hooks).
    _SYNC_MEMORY = 1024

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._sync: dict[Any, Any] = {}

    def ensure_sync(self, func: Any) -> Any:
        """Flask's, remembered per function: it asked ``iscoroutinefunction`` of every
        view and hook on every request."""
        sync = self._sync.get(func)
        if sync is None:
            sync = self.async_to_sync(func) if iscoroutinefunction(func) else func
            if len(self._sync) < self._SYNC_MEMORY:
                self._sync[func] = sync
        return sync


def create_app(config: dict[str, Any] | None = None) -> Flask:
    """Build the app (see the module docstring for where settings come from)."""
    app = App("api")  # its name, logger and root folder are the package's
    app.config.from_mapping(app_config.DEFAULTS)
    app_config.merge(app.config, app_config.from_settings(load_settings()))
    if config:
        app_config.merge(app.config, config)
    app_config.check(app.config)
    app.json = JsonReplies(app)  # keys in order, non-ASCII kept, written by orjson

    init_database(app.config["DATABASE_URL"], int(app.config["DB_MAX_CONNECTIONS"]))
    configure_tracing_once()
    # The model client's package (agent.llm.client imports it lazily, for the CLI's sake):
    # loaded with the app, however it is served, so that no turn waits for the import.
    load_sdk()

    # Imported here: the turn service needs the configured app.
    from api.services.turns import TurnService

    app.extensions["agentcanvas.turns"] = TurnService(app.config)
    app.extensions["agentcanvas.ratelimit"] = Limiter.from_settings(app.config.get("SETTINGS") or {})
    _start_knowledge_bases(app)
    _start_sweeper(app)

    @app.teardown_appcontext
    def _release_connection(exc: BaseException | None) -> None:
        # The database itself: a method read through the proxy is a failed attribute
        # look-up first (an AttributeError made and dropped), on every request.
        database = db_proxy.obj
        if not database.is_closed():
            database.close()

    @app.errorhandler(Exception)
    def _error(exc: Exception):  # noqa: ANN202 - a Flask handler
        if isinstance(exc, RequestEntityTooLarge):
            exc = TooLarge(
                f"the request body is larger than {app.config['MAX_CONTENT_LENGTH']} bytes "
                f"(limit limits.max_body_bytes)"
            )
        elif isinstance(exc, HTTPException) and exc.code and exc.code < 400:
            return exc
        return error_reply(exc)

    register_all(app)
    spec.register(app)  # /api/v1/openapi.json, from the routes' declared schemas
    app.wsgi_app = CompletionLane(app, _TokensOutOfLogs(app.wsgi_app))
    return app


class _TokensOutOfLogs:
    """``DELETE /api/v1/system/tokens/<token>`` with a plain token becomes ``…/sha256:<hash>``
    before anything sees the request, so no access log or trace ever holds the token.

    The route revokes by id, by ``sha256:<hash>`` or (this old form) by the token itself.
    """

    _PATH = "/api/v1/system/tokens/"

    def __init__(self, wsgi_app: Any):
        self.wsgi_app = wsgi_app

    def __call__(self, environ: dict, start_response: Any) -> Any:
        path = environ.get("PATH_INFO") or ""
        if path.startswith(self._PATH) and environ.get("REQUEST_METHOD") == "DELETE":
            from api.services.tokens import HASHED, hashed_name, is_token_id

            given = path[len(self._PATH) :]
            if given and "/" not in given and not is_token_id(given) and not given.startswith(HASHED):
                hidden = self._PATH + hashed_name(given)
                environ["PATH_INFO"] = hidden
                for key in ("RAW_URI", "REQUEST_URI"):
                    if key in environ:
                        query = environ[key].partition("?")[2]
                        environ[key] = hidden + (f"?{query}" if query else "")
        return self.wsgi_app(environ, start_response)


def stop_background(app: Flask, timeout: float = 30.0) -> list[str]:
    """Stop what ``create_app`` started beside the requests, within ``timeout`` seconds
    in all: the sweeper and the parse threads stop (a parse after its current batch, the
    task left queued for others), running turns finish and commit, queued memory
    extractions run, and the lease keepers stop once nothing they renew is held.

    Returns what still runs at the timeout, by name (empty when everything stopped):
    while anything does, its database connection is in use (``close_all`` leaves a
    SQLite one to its thread until given back; MySQL's and Postgres' it closes under
    it, failing what the thread is doing). The app
    still answers requests afterwards; a turn or a parse it is then given starts its
    threads again.
    """
    from api.services import retention

    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    running = []
    if not app.extensions["agentcanvas.sweeper"].stop(left()):
        running.append("the sweeper")
    elif not retention.stop_keepers(left()):
        running.append("the sweep lease's keeper")
    if not app.extensions["agentcanvas.parsing"].stop(left()):
        running.append("parse threads")
    turns = app.extensions["agentcanvas.turns"]
    if not turns.wait_idle(left()):
        running.append("turns")
    elif not turns.keeper.stop(left()):  # renews the leases of running turns
        running.append("the turns' lease keeper")
    if not turns.extractor.wait_idle(left()):
        running.append("memory extraction")
    return running


def _start_sweeper(app: Flask) -> None:
    """This process's background sweep of expired and deleted sessions (api.services.retention)."""
    from api.services.retention import RetentionSettings, Sweeper

    sweeper = Sweeper(RetentionSettings.from_config(app.config), float(app.config["SWEEP_INTERVAL_SECONDS"]))
    app.extensions["agentcanvas.sweeper"] = sweeper
    sweeper.start()


def _start_knowledge_bases(app: Flask) -> None:
    """The ``datasets`` settings and this process's parse threads (see api.services.parsing)."""
    from api.services.datasets import KnowledgeLimits
    from api.services.files import FileSettings
    from api.services.parsing import ParseWorkers
    from api.services.retrieval import embedder

    settings = app.config.get("SETTINGS") or {}
    # One size limit per file for every upload (limits.max_file_bytes), unless datasets set their own.
    section = {"max_file_bytes": FileSettings.from_config(app.config).max_file_bytes}
    section.update(settings.get("datasets") or {})
    section.update(app.config.get("DATASETS") or {})
    limits = KnowledgeLimits.from_settings({"datasets": section})
    app.extensions["agentcanvas.knowledge_limits"] = limits
    workers = ParseWorkers(
        limits,
        float(app.config["LEASE_SECONDS"]),
        float(app.config.get("PARSE_POLL_SECONDS", 1.0)),
        embedder(settings.get("llm") or {}, limits.embedding_batch),
    )
    app.extensions["agentcanvas.parsing"] = workers
    workers.start()
