"""The ``agentcanvas`` command.

Every command takes its database from ``AGENTCANVAS_DATABASE_URL`` or
``conf/service_conf.yaml`` (found from the package, so the working directory does not
matter) and works while a server runs on the same database.

    agentcanvas serve [--host H] [--port P] [--workers N] [--threads N] [--dev]
    agentcanvas token create [--tenant NAME] [--embed]    # the token is the last word printed
    agentcanvas token list [--tenant NAME]
    agentcanvas token revoke TOKEN
    agentcanvas agent import FILE.json [--tenant NAME] [--title TITLE]
    agentcanvas run FILE.json [--state FILE]               # chat in the terminal, no server
    agentcanvas components                                 # the component types this build knows
    agentcanvas quickstart [--host H] [--port P]           # database, token, samples, then serve
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peewee import PeeweeException

from agent.errors import CanvasError
from agent.settings import load_settings
from api import config as app_config
from api.db import Agent, db, init_database
from api.errors import ApiError
from api.services.tokens import DEFAULT_TENANT


def _settings() -> dict[str, Any]:
    config = dict(app_config.DEFAULTS)
    app_config.merge(config, app_config.from_settings(load_settings()))
    return config


def _open_db(config: dict[str, Any] | None = None) -> dict[str, Any]:
    config = config or _settings()
    init_database(config["DATABASE_URL"], max_connections=4)
    return config


def _server_defaults() -> dict[str, Any]:
    return load_settings().get("server") or {}


# ---------------------------------------------------------------------- retention
def cmd_sweep(args: argparse.Namespace) -> int:
    from api.services.retention import MAX_BATCH, RetentionSettings, sweep

    settings = RetentionSettings.from_config(_open_db())
    if args.batch is not None:
        if not 1 <= args.batch <= MAX_BATCH:
            raise ValueError(f"--batch must be from 1 to {MAX_BATCH}, got {args.batch}")
        settings.batch = args.batch
    with db.connection_context():
        report = sweep(settings)
    if report.skipped:
        print("another worker is sweeping now (it holds the sweep lease); nothing done")
        return 0
    print(
        f"removed {report.removed} sessions ({report.expired} expired, {report.deleted} deleted) and "
        f"{report.memory_entries} keyed memory entries and {report.files} uploaded files in {report.batches} batches"
    )
    return 0


# ---------------------------------------------------------------------- tokens
def cmd_token_create(args: argparse.Namespace) -> int:
    from api.services import tokens

    _open_db()
    with db.connection_context():
        tenant = tokens.tenant_by_name(args.tenant)
        plain, _ = tokens.create_token(tenant.id, "embed" if args.embed else "api")
    kind = "embed token" if args.embed else "API token"
    print(f"tenant {tenant.name!r} ({tenant.id})")
    print(f"new {kind}, shown only now: {plain}")
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    from api.db import date_of
    from api.services import tokens

    _open_db()
    with db.connection_context():
        tenant_id = tokens.tenant_by_name(args.tenant, create=False).id if args.tenant else None
        rows = tokens.list_tokens(tenant_id)
    if not rows:
        print("no tokens; make one with `agentcanvas token create`")
    for row in rows:
        print(f"{row.id}  {row.kind:5}  {row.hint}…  tenant {row.tenant_id}  {date_of(row.create_time)}")
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from api.services import tokens

    _open_db()
    with db.connection_context():
        row = tokens.revoke_token(args.token)
    print(f"revoked token {row.id} ({row.hint}…)")
    return 0


# ---------------------------------------------------------------------- agents
def import_agent(tenant_id: str, path: str | Path, title: str | None, limits: Any) -> Agent:
    from api.services import agents

    file_title, dsl, description = agents.read_agent_file(path)
    return agents.create_agent(tenant_id, title or file_title, dsl, description, limits)


def cmd_agent_import(args: argparse.Namespace) -> int:
    from api.services import tokens

    config = _open_db()
    with db.connection_context():
        tenant = tokens.tenant_by_name(args.tenant)
        agent = import_agent(tenant.id, args.file, args.title, app_config.canvas_limits(config))
    for warning in getattr(agent, "warnings", None) or []:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"imported agent {agent.title!r} for tenant {tenant.name!r}: {agent.id}")
    return 0


def cmd_components(args: argparse.Namespace) -> int:
    from agent.component import component_names

    for name in component_names():
        print(name)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from agent import chat  # the terminal chat lives with the runtime

    return chat.main(args.rest)


# ---------------------------------------------------------------------- serving
def access_log_target(settings: dict[str, Any] | None = None) -> str | None:
    """Where gunicorn writes its access log: off unless ``AGENTCANVAS_ACCESS_LOG`` says.

    ``1``/``true``/``on``/``-`` log to standard output; any other text is a file path;
    unset, empty, ``0``, ``false`` or ``off`` leave it off (one line per request costs
    a worker more than routing the request does).
    """
    settings = load_settings() if settings is None else settings
    value = (settings.get("access") or {}).get("log")
    if value in (None, "", False, 0) or (
        isinstance(value, str) and value.lower() in ("0", "false", "off", "no")
    ):
        return None
    if (
        value is True
        or value == 1
        or (isinstance(value, str) and value.lower() in ("1", "true", "on", "yes", "-"))
    ):
        return "-"
    return str(value)


def freeze_startup_objects(_worker: object = None) -> None:
    """gunicorn's ``post_worker_init``: once a worker has built its app, move what is
    alive into the collector's permanent generation (``gc.freeze``).

    The app, its modules, routes and caches (~130,000 objects) live as long as the
    worker, yet every full collection walked them all again: one every ~3,000 turns,
    60-80 ms with every thread of the worker stopped; frozen, 2-3 ms (intake sample,
    SQLite, 6,000 turns in one process: the collector's time per turn 0.066-0.083 ->
    0.048-0.055 ms). Garbage made while starting is collected first so that none of
    it is kept for ever. The bench's floor app is served through this too.
    """
    gc.collect()
    gc.freeze()


def run_gunicorn(
    load_app: Callable[[], Any], host: str, port: int, workers: int, threads: int, max_seconds: float = 600
) -> None:
    """Serve the WSGI app ``load_app()`` builds (in each worker) with our gunicorn settings.

    ``bench/http.py`` serves its floor app through this too, so both run alike.
    """
    from gunicorn.app.base import BaseApplication

    from api import connection_balance, telemetry

    log_settings = load_settings().get("log") or {}
    log_format = str(log_settings.get("format") or "json")
    telemetry.configure_logging(log_format, str(log_settings.get("level") or "info"))
    telemetry.prepare_multiprocess()

    # Two workers or more: keep-alive connections spread by least connections (see
    # api/connection_balance.py). Seats for twice the workers, as a reload (HUP) starts
    # the new workers before the old ones leave.
    board = connection_balance.ConnectionBoard(2 * workers) if workers > 1 else None

    def child_exit(_server: Any, worker: Any) -> None:
        telemetry.worker_exited(worker.pid)
        if board is not None:
            board.unseat(worker)

    class Server(BaseApplication):
        def load_config(self) -> None:
            options = {
                "bind": f"{host}:{port}",
                "workers": workers,
                "threads": threads,
                "worker_class": connection_balance.BalancedThreadWorker,
                # Turns may stream for minutes; the worker heartbeat is separate.
                "timeout": max(120, int(float(max_seconds)) + 60),
                "graceful_timeout": 30,
                "accesslog": access_log_target(),
                "errorlog": "-",
                # JSON lines like the app's (AGENTCANVAS_LOG_FORMAT=text for plain), tokens masked.
                "logger_class": telemetry.gunicorn_logger_class(log_format),
                "child_exit": child_exit,
                "post_worker_init": freeze_startup_objects,
            }
            if board is not None:
                options["pre_fork"] = board.seat
            if "control_socket_disable" in self.cfg.settings:
                # gunicorn ≥ 25 opens a control socket at one fixed path per user, so a
                # second server on the same machine would fight over it; we do not use it.
                options["control_socket_disable"] = True
            for key, value in options.items():
                self.cfg.set(key, value)

        def load(self):  # noqa: ANN202 - gunicorn's signature
            return load_app()

    Server().run()


def serve(host: str, port: int, workers: int, threads: int, dev: bool = False) -> int:
    """Run the app: gunicorn (threaded workers), or Flask's own server with ``dev``."""
    config = _open_db()
    from agent.llm.client import load_sdk
    from api import create_app

    # The model client's package, imported by this process before its workers fork, so
    # no turn waits for it (the commands that serve nothing never load it).
    load_sdk()
    if dev:
        create_app().run(host=host, port=port, threaded=True)
        return 0
    # Schema is up to date; drop this process's connections before gunicorn forks.
    db.obj.close_all()
    run_gunicorn(create_app, host, port, workers, threads, config["LIMITS"].get("max_seconds", 600))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    return serve(args.host, args.port, args.workers, args.threads, args.dev)


#: The dataset the "Docs assistant" sample answers from, made from samples/knowledge/.
SAMPLE_DATASET = "agentcanvas docs"


def sample_dataset(tenant_id: str) -> str:
    """Make the sample dataset from the bundled documents and queue them for parsing
    (the server parses them as it starts); nothing if the tenant has it already."""
    from api.db import Dataset
    from api.services import datasets, parsing
    from api.services.agents import SAMPLES_DIR

    folder = SAMPLES_DIR / "knowledge"
    files = sorted(folder.glob("*.md")) if folder.is_dir() else []
    if not files:
        return ""
    if Dataset.select().where((Dataset.tenant_id == tenant_id) & (Dataset.name == SAMPLE_DATASET)).exists():
        return f"dataset {SAMPLE_DATASET!r}: already there"
    ds = datasets.create_dataset(
        tenant_id, {"name": SAMPLE_DATASET, "description": "agentcanvas in a few pages (samples/knowledge)"}
    )
    docs = datasets.upload_documents(
        tenant_id, ds.id, [(f.name, f.read_bytes()) for f in files], datasets.KnowledgeLimits()
    )
    parsing.start_parsing(tenant_id, ds.id, [d.id for d in docs])
    return (
        f"dataset {SAMPLE_DATASET!r}: {len(docs)} documents from {folder}, parsed by the server as it starts"
    )


def cmd_quickstart(args: argparse.Namespace) -> int:
    from api.services import embed, tokens
    from api.services.agents import SAMPLES_DIR, read_agent_file

    config = _open_db()
    limits = app_config.canvas_limits(config)
    base_url = f"http://{args.host}:{args.port}"
    with db.connection_context():
        tenant = tokens.tenant_by_name(args.tenant)
        plain, _ = tokens.create_token(tenant.id, "api")
        existing = {a.title for a in Agent.select(Agent.title).where(Agent.tenant_id == tenant.id)}
        for path in sorted(SAMPLES_DIR.glob("*.json")):
            title, _, _ = read_agent_file(path)
            if title in existing:
                continue
            try:
                import_agent(tenant.id, path, None, limits)
            except (CanvasError, ApiError, ValueError) as exc:
                print(f"skipped sample {path.name}: {exc}", file=sys.stderr)
        agents = list(Agent.select().where(Agent.tenant_id == tenant.id).order_by(Agent.title))
        dataset_note = sample_dataset(tenant.id)
        # One embed token per run for the agents' embed pages (api.services.embed).
        embed_token, _ = tokens.create_token(tenant.id, "embed")
    print(f"database: {config['DATABASE_URL']}")
    if dataset_note:
        print(dataset_note)
    for agent in agents:
        print(f"agent {agent.title!r}:")
        print(f"  completions: POST {base_url}/api/v1/agents/{agent.id}/completions")
        print(f"  embed page: {embed.page_url(base_url, agent.id, embed_token)}")
    print(f"API token (send as 'Authorization: Bearer <token>'): {plain}")
    sys.stdout.flush()
    if args.no_serve:
        return 0
    return serve(args.host, args.port, args.workers, args.threads, args.dev)


# ---------------------------------------------------------------------- parsing
def build_parser() -> argparse.ArgumentParser:
    server = _server_defaults()
    parser = argparse.ArgumentParser(prog="agentcanvas", description="Run and serve agent workflows.")
    sub = parser.add_subparsers(dest="command", required=True)

    def server_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--host", default=str(server.get("host") or "127.0.0.1"))
        p.add_argument("--port", type=int, default=int(server.get("port") or 8080))
        p.add_argument("--workers", type=int, default=int(server.get("workers") or 2))
        p.add_argument("--threads", type=int, default=int(server.get("threads") or 8))
        p.add_argument("--dev", action="store_true", help="Flask's development server instead of gunicorn")

    p = sub.add_parser("serve", help="run the API server")
    server_options(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("quickstart", help="set up the database, a token and the samples, then serve")
    server_options(p)
    p.add_argument("--tenant", default=DEFAULT_TENANT)
    p.add_argument("--no-serve", action="store_true", help="set up and print, but do not start the server")
    p.set_defaults(func=cmd_quickstart)

    tok = sub.add_parser("token", help="API and embed tokens").add_subparsers(dest="action", required=True)
    p = tok.add_parser("create", help="a new token (the last word printed)")
    p.add_argument("--tenant", default=DEFAULT_TENANT, help="tenant name, made if missing")
    p.add_argument("--embed", action="store_true", help="an embed token (embed routes only)")
    p.set_defaults(func=cmd_token_create)
    p = tok.add_parser("list", help="tokens (hints only; tokens are stored hashed)")
    p.add_argument("--tenant", help="only this tenant's")
    p.set_defaults(func=cmd_token_list)
    p = tok.add_parser("revoke", help="delete a token, given as itself or by its id")
    p.add_argument("token")
    p.set_defaults(func=cmd_token_revoke)

    ag = sub.add_parser("agent", help="agents").add_subparsers(dest="action", required=True)
    p = ag.add_parser("import", help="load a DSL file (a RAGFlow export or a bare DSL)")
    p.add_argument("file")
    p.add_argument("--tenant", default=DEFAULT_TENANT, help="tenant name, made if missing")
    p.add_argument("--title", help="the agent's title (default: the export's title or the file name)")
    p.set_defaults(func=cmd_agent_import)

    p = sub.add_parser("run", help="chat with a DSL in the terminal (no server)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="remove expired and deleted sessions and old keyed memory now")
    p.add_argument("--batch", type=int, help="sessions per batch (default: session.sweep_batch)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("components", help="list the component types")
    p.set_defaults(func=cmd_components)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ApiError, CanvasError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except PeeweeException as exc:
        print(f"error: database: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
