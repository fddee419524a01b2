"""Embedding: the chat page, its API (embed tokens), and the snippet (API tokens).

Three blueprints under one, because each part authenticates differently:

* ``GET /embed/agents/<id>?auth=<embed token>``: the chat page (``templates/embed.html``
  with ``static/embed.js`` and ``static/embed.css``), sent with
  ``Content-Security-Policy: frame-ancestors`` from the agent's allowed origins.
* ``/api/v1/agentbots/<id>/...``: what the page calls, with
  ``Authorization: Bearer <embed token>`` and the end user's ``user_id``; CORS for the
  agent's allowed origins only.
* ``GET/PUT /api/v1/agents/<id>/embed`` (API token): the iframe snippet and the
  allowed origins.

See :mod:`api.services.embed` for end users and origins.
"""

from __future__ import annotations

import json

from flask import Blueprint, Response, current_app, g, render_template, request
from flask.typing import ResponseReturnValue
from werkzeug.wsgi import get_current_url

from api import ratelimit
from api.auth import bearer_token, require_api_token
from api.blueprints.completions import blocking_reply, sse_reply, turn_request
from api.blueprints.files import allow_upload_body, upload_reply
from api.errors import ArgumentError, AuthError, NotFound, TooLarge
from api.http import flag, json_body, ok, tenant_id, transcript_page_args
from api.openapi import Body, Query, spec
from api.services import embed
from api.services.agents import agent_limits_of, get_agent
from api.services.tokens import hash_token, tenant_for_token
from api.services.turns import TurnRequest, turn_service

bp = Blueprint("embed", __name__)
page_bp = Blueprint("page", __name__)
bot_bp = Blueprint("bot", __name__, url_prefix="/api/v1")
admin_bp = Blueprint("admin", __name__, url_prefix="/api/v1")
admin_bp.before_request(require_api_token)

#: Headers the page reads from a completion reply to know its session before any event.
SESSION_HEADER = "X-Session-Id"
TASK_HEADER = "X-Task-Id"


# ---------------------------------------------------------------------- the page
def _page_headers(response: Response, ancestors: str | None) -> Response:
    # No inline script or style, nothing from elsewhere: text that slipped into the
    # page as markup still could not run.
    policy = (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'"
    )
    if ancestors is not None:
        policy += f"; frame-ancestors {ancestors}"
    response.headers["Content-Security-Policy"] = policy
    # The page URL carries the embed token: keep it out of Referer headers and caches.
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def _error_page(status: int, message: str) -> tuple[Response, int]:
    html = render_template("embed_error.html", message=message)
    return _page_headers(Response(html, mimetype="text/html"), None), status


@page_bp.get("/embed/agents/<agent_id>")
def chat_page(agent_id: str) -> ResponseReturnValue:
    token = request.args.get("auth", "").strip()
    if not token:
        return _error_page(
            401, "This chat cannot open: its link has no embed token (auth=...). Ask the site's owner."
        )
    tenant = tenant_for_token(token, "embed")
    if tenant is None:
        if tenant_for_token(token, "api") is not None:
            return _error_page(
                401,
                "This chat cannot open: the link carries an API token, and the embed page takes embed "
                "tokens only. Never put an API token in a web page: revoke it and make an embed token "
                "(agentcanvas token create --embed).",
            )
        return _error_page(401, "This chat cannot open: its embed token is not valid (revoked or mistyped).")
    try:
        agent = get_agent(tenant, agent_id)
    except NotFound:
        return _error_page(404, "This chat cannot open: the agent does not exist (or not for this token).")
    html = render_template(
        "embed.html",
        title=agent.title,
        agent_id=agent.id,
        token=token,
        api_base=f"{request.script_root}/api/v1",
    )
    return _page_headers(Response(html, mimetype="text/html"), embed.frame_ancestors(embed.origins_of(agent)))


# ---------------------------------------------------------------------- the page's API
@bot_bp.before_request
def require_embed_token() -> None:
    """Refuse the request unless it carries a valid embed token (preflights carry none)."""
    if request.method == "OPTIONS":
        return
    g.tenant_id = embed_tenant(request.environ)


def embed_tenant(environ: dict) -> str:
    """The tenant of the request ``environ`` describes, whose embed token must be valid."""
    token = bearer_token(environ)
    if not token:
        raise AuthError(
            "missing embed token: send 'Authorization: Bearer <embed token>' "
            "(make one with `agentcanvas token create --embed`)"
        )
    tenant = tenant_for_token(token, "embed")
    if tenant is None:
        raise AuthError(
            "the embed token is not valid (revoked, mistyped, or an API token: "
            "the embed routes take embed tokens only)"
        )
    return tenant


@bot_bp.after_request
def allow_listed_origins(response: Response) -> Response:
    """CORS for the agent's allowed parent origins, and for nobody else."""
    return with_listed_origins(response, request.environ, (request.view_args or {}).get("agent_id"))


def with_listed_origins(response: Response, environ: dict, agent_id: str | None) -> Response:
    """``response`` to the request ``environ`` describes, on agent ``agent_id``'s route,
    with CORS for the agent's allowed parent origins (:func:`allow_listed_origins`)."""
    response.vary.add("Origin")
    origin = environ.get("HTTP_ORIGIN")
    if not origin or not agent_id:
        return response
    trusted = current_app._get_current_object().config.get("TRUSTED_HOSTS")  # type: ignore[attr-defined]
    if origin == get_current_url(environ, host_only=True, trusted_hosts=trusted).rstrip("/"):
        return response
    allowed = embed.cors_origin(agent_id, origin)
    if allowed is None:
        return response
    response.headers["Access-Control-Allow-Origin"] = allowed
    response.headers["Access-Control-Expose-Headers"] = f"{SESSION_HEADER}, {TASK_HEADER}"
    if environ.get("REQUEST_METHOD") == "OPTIONS":
        response.headers["Access-Control-Allow-Methods"] = "GET, POST"
        response.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
        response.headers["Access-Control-Max-Age"] = "600"
    return response


@bot_bp.get("/agentbots/<agent_id>/inputs")
def bot_inputs(agent_id: str) -> ResponseReturnValue:
    return ok(embed.bot_info(tenant_id(), agent_id, turn_service().limits))


class BotCompletionBody(Body):
    """A visitor's turn: ``user_id`` is the random id the page made (32-128 of A-Z a-z 0-9 - _)."""

    user_id: str
    question: str | None = None
    query: str | None = None
    stream: bool | str | int | None = None
    session_id: str | None = None
    inputs: dict | None = None
    files: list | None = None


class VisitorBody(Body):
    user_id: str
    stream: bool | str | int | None = None


class VisitorQuery(Query):
    user_id: str
    messages_page: str | None = None
    messages_page_size: str | None = None


class EmbedQuery(Query):
    embed_token: str | None = None


class EmbedOrigins(Body):
    """``allowed_origins``: origins ``https://host[:port]`` (at most 50) or ``"*"``."""

    allowed_origins: list


@bot_bp.post("/agentbots/<agent_id>/completions")
@spec.validate(json=BotCompletionBody, tags=["embed"])
def bot_completions(agent_id: str) -> ResponseReturnValue:
    return bot_complete(agent_id, json_body(), bearer_token())


def bot_complete(agent_id: str, body: dict, token: str | None) -> ResponseReturnValue:
    """A visitor's turn (``body`` of ``POST /agentbots/<agent_id>/completions``), the
    tenant's embed token ``token`` checked (``flask.g.tenant_id``, its tenant)."""
    end_user = embed.check_end_user(body.get("user_id"))
    _count_visitor(agent_id, end_user, token)
    req = turn_request(agent_id, body, invoke_from="embed")
    req.end_user = end_user
    req.release = None  # the page runs the latest release when there is one, else the draft
    req.services = None  # a visitor sets no headers for the tenant's MCP servers
    req.trace = False  # the page's stream shows no node event (sse_reply without return_trace)
    # An anonymous visitor's message and files are bounded like one form value, not
    # only by the request body limit: they go into the session's history and log.
    limit = turn_service().limits.max_value_bytes
    for what, text in (("the message", req.query), ("'files'", json.dumps(req.files or []))):
        size = len(text.encode("utf-8"))
        if size > limit:
            raise TooLarge(f"{what} is {size} bytes; the limit is {limit} (limits.max_value_bytes)")
    stream = flag(body.get("stream"), "stream", default=True)
    return _bot_reply(embed.EndUserTurn(turn_service().start(req, inline=not stream)), stream)


@bot_bp.post("/agentbots/<agent_id>/sessions/<session_id>/regenerate")
@spec.validate(json=VisitorBody, tags=["embed"])
def bot_regenerate(agent_id: str, session_id: str) -> ResponseReturnValue:
    """The page's "Regenerate": the end user's last answer asked for again."""
    body = json_body()
    end_user = embed.check_end_user(body.get("user_id"))
    _count_visitor(agent_id, end_user, bearer_token())
    req = TurnRequest(
        tenant_id=tenant_id(),
        agent_id=agent_id,
        session_id=session_id,
        invoke_from="embed",
        end_user=end_user,
        trace=False,  # the page's stream shows no node event
    )
    stream = flag(body.get("stream"), "stream", default=True)
    return _bot_reply(embed.EndUserTurn(turn_service().regenerate(req, inline=not stream)), stream)


def _count_visitor(agent_id: str, end_user: str, token: str | None) -> None:
    """One request of embed token ``token``'s visitor against the embed rate limit (429 when
    over); :class:`NotFound` when the token's tenant has no such agent, limit or not."""
    agent = agent_limits_of(tenant_id(), agent_id)
    if ratelimit.limited("embed", agent):  # else the key need not be made (a sha256)
        ratelimit.hit("embed", f"{hash_token(token or '')[:16]}:{end_user}", agent)


def _bot_reply(turn: embed.EndUserTurn, stream: bool) -> ResponseReturnValue:
    if stream:
        response = sse_reply(turn)
        status = 200
    else:
        response = blocking_reply(turn)
        status = response.status_code
    response.headers[SESSION_HEADER] = turn.session_id
    response.headers[TASK_HEADER] = turn.task_id
    return response, status


@bot_bp.post("/agentbots/<agent_id>/upload")
def bot_upload(agent_id: str) -> ResponseReturnValue:
    """The visitor's files (multipart ``file`` parts and a ``user_id`` field): usable by
    that visitor only."""
    allow_upload_body()
    end_user = embed.check_end_user(request.form.get("user_id"))
    get_agent(tenant_id(), agent_id)
    return upload_reply(agent_id, created_by=end_user, end_user=end_user)


@bot_bp.get("/agentbots/<agent_id>/sessions/<session_id>")
@spec.validate(query=VisitorQuery, tags=["embed"])
def bot_session(agent_id: str, session_id: str) -> ResponseReturnValue:
    end_user = embed.check_end_user(request.args.get("user_id"))
    page, page_size = transcript_page_args()
    return ok(embed.end_user_session(tenant_id(), agent_id, session_id, end_user, page, page_size))


@bot_bp.post("/agentbots/<agent_id>/sessions/<session_id>/cancel")
@spec.validate(json=VisitorBody, tags=["embed"])
def bot_cancel(agent_id: str, session_id: str) -> ResponseReturnValue:
    end_user = embed.check_end_user(json_body().get("user_id"))
    result = embed.cancel_end_user_turn(tenant_id(), agent_id, session_id, end_user)
    message = "cancel requested" if result["cancelled"] else "no answer is running; nothing to cancel"
    return ok(result, message=message)


# ---------------------------------------------------------------------- the snippet
@admin_bp.get("/agents/<agent_id>/embed")
@spec.validate(query=EmbedQuery, tags=["embed"])
def embed_snippet(agent_id: str) -> ResponseReturnValue:
    agent = get_agent(tenant_id(), agent_id)
    token = request.args.get("embed_token") or None
    if token is not None and tenant_for_token(token, "embed") != tenant_id():
        raise ArgumentError(
            "'embed_token' is not a valid embed token of your tenant; make one with "
            'POST /api/v1/system/tokens {"kind": "embed"}'
        )
    return ok(embed.snippet(request.host_url, agent, token))


@admin_bp.put("/agents/<agent_id>/embed")
@spec.validate(json=EmbedOrigins, tags=["embed"])
def set_embed_origins(agent_id: str) -> ResponseReturnValue:
    body = json_body()
    if "allowed_origins" not in body:
        raise ArgumentError('the body needs \'allowed_origins\': {"allowed_origins": ["https://your.site"]}')
    embed.set_origins(tenant_id(), agent_id, body["allowed_origins"])
    return ok(embed.snippet(request.host_url, get_agent(tenant_id(), agent_id)))


bp.register_blueprint(page_bp)
bp.register_blueprint(bot_bp)
bp.register_blueprint(admin_bp)
