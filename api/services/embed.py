"""Embedding an agent in another web site: end users, allowed origins, the bot's reads.

The embed page (``/embed/agents/<id>?auth=<embed token>``) talks to the embed routes
(``/api/v1/agentbots/<id>/...``) with an **embed token** of the agent's tenant. Each
browser is an anonymous **end user**: the page makes a random id of 128 bits or more,
keeps it in the browser and sends it as ``user_id``; a session made through the embed
routes is bound to (tenant, agent, that user) by the turn service
(:meth:`api.services.turns.TurnService.find_session` with ``end_user``).

**Allowed parent origins** (per agent, ``Agent.embed_origins``): the page is sent with
``Content-Security-Policy: frame-ancestors 'self' <origins>``, and the embed routes
answer CORS requests from those origins only. With none configured only this server
itself may frame the page: a site has to be named before it can embed the agent, so
an embed link copied elsewhere cannot be framed by another site (clickjacking).
``"*"`` allows every site.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from markupsafe import escape

from agent import docparse
from agent.canvas import Canvas
from agent.forms import public_form
from api.db import Agent, Session, write_transaction
from api.errors import ArgumentError
from api.services.agents import get_agent, runnable_version
from api.services.sessions import transcript
from api.services.turns import Turn, TurnResult, effective_status, turn_service

#: The end-user id the page makes: 16 random bytes as 32 hex digits; UUIDs and
#: base64url ids of 128 bits or more fit as well.
END_USER_PATTERN = re.compile(r"[A-Za-z0-9_-]{32,128}")
# A random id of this length shows many distinct characters; "0000…" or "aaaa…" is
# someone's placeholder, and a guessable end-user id exposes that user's sessions.
_MIN_DISTINCT_CHARS = 8
MAX_ORIGINS = 50
_HOST_PATTERN = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")
ANY_ORIGIN = "*"
#: Put in the snippet where the embed token goes when none was given.
TOKEN_PLACEHOLDER = "EMBED_TOKEN"
# What the page needs of a session (never the snapshot).
_HISTORY_FIELDS = (
    Session.id,
    Session.agent_id,
    Session.status,
    Session.pending_form,
    Session.lease_owner,
    Session.lease_expires,
)


def check_end_user(value: Any) -> str:
    """The body's ``user_id`` as an end-user id, or :class:`ArgumentError` saying what is wrong."""
    if value is None or value == "":
        raise ArgumentError(
            "'user_id' is required on the embed routes: a random id of at least 128 bits that the "
            "page keeps in the browser (e.g. 32 hex digits)"
        )
    if not isinstance(value, str):
        raise ArgumentError(f"'user_id' must be text, got {type(value).__name__}")
    if not END_USER_PATTERN.fullmatch(value):
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise ArgumentError(
            f"'user_id' {shown!r} is not an end-user id: use 32 to 128 letters, digits, '-' or '_' "
            f"(a random 128-bit id as 32 hex digits)"
        )
    if len(set(value)) < _MIN_DISTINCT_CHARS:
        raise ArgumentError(
            f"'user_id' {value[:40]!r} does not look random; make it from a secure random source "
            f"(crypto.getRandomValues), or anyone could guess it and read that user's conversation"
        )
    return value


# ---------------------------------------------------------------------- origins
def normalize_origin(value: Any) -> str:
    """``scheme://host[:port]`` (lower-cased, default port dropped), or ``*``."""
    if not isinstance(value, str) or not value.strip():
        raise ArgumentError(f"an allowed origin must be text like 'https://example.com', got {value!r}")
    text = value.strip()
    if text == ANY_ORIGIN:
        return text
    try:
        parts = urlsplit(text)
    except ValueError as exc:
        raise ArgumentError(f"allowed origin {value!r} is not a URL ({exc})") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ArgumentError(
            f"allowed origin {value!r} must be http(s)://host[:port], e.g. 'https://example.com'"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ArgumentError(
            f"allowed origin {value!r} must be only scheme, host and port (no path, query or user), "
            f"e.g. {parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"
        )
    try:
        port = parts.port
    except ValueError:
        raise ArgumentError(f"allowed origin {value!r} has a bad port") from None
    scheme = parts.scheme.lower()
    host = parts.hostname.lower()
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ArgumentError(f"allowed origin {value!r} has a bad IPv6 address") from None
        host = f"[{host}]"
    elif not _HOST_PATTERN.fullmatch(host):
        # The origin goes into a response header (frame-ancestors): only plain host
        # names, so nothing can add a directive or a header of its own.
        raise ArgumentError(
            f"allowed origin {value!r} has a bad host name: use letters, digits, '-' and '.' "
            f"(an international name in its xn-- form)"
        )
    default = {"http": 80, "https": 443}[scheme]
    return f"{scheme}://{host}" if port in (None, default) else f"{scheme}://{host}:{port}"


def normalize_origins(values: Any) -> list[str]:
    """A list of allowed origins, each checked (:func:`normalize_origin`), duplicates dropped."""
    if not isinstance(values, list):
        raise ArgumentError(
            f"'allowed_origins' must be a list like ['https://example.com'], got {type(values).__name__}"
        )
    if len(values) > MAX_ORIGINS:
        raise ArgumentError(f"'allowed_origins' has {len(values)} entries; the limit is {MAX_ORIGINS}")
    return list(dict.fromkeys(normalize_origin(v) for v in values))


def origins_of(agent: Agent) -> list[str]:
    """The agent's allowed parent origins (empty: only this server)."""
    if not agent.embed_origins:
        return []
    try:
        stored = json.loads(agent.embed_origins)
    except ValueError:
        return []
    return [o for o in stored if isinstance(o, str)] if isinstance(stored, list) else []


def set_origins(tenant_id: str, agent_id: str, origins: Any) -> list[str]:
    """Replace the agent's allowed parent origins; returns them as stored."""
    get_agent(tenant_id, agent_id)
    clean = normalize_origins(origins)
    with write_transaction():
        Agent.update(embed_origins=json.dumps(clean) if clean else None).where(
            (Agent.id == agent_id) & (Agent.tenant_id == tenant_id)
        ).execute()
    return clean


def frame_ancestors(origins: list[str]) -> str:
    """The ``frame-ancestors`` source list for these allowed origins."""
    if ANY_ORIGIN in origins:
        return ANY_ORIGIN
    return " ".join(["'self'", *origins])


def cors_origin(agent_id: str, origin: str | None) -> str | None:
    """The ``Access-Control-Allow-Origin`` value for a request from ``origin``, or ``None``.

    Read without a tenant: a CORS preflight carries no token. It tells only what the
    page's ``frame-ancestors`` header tells anyone already.
    """
    if not origin:
        return None
    try:
        wanted = normalize_origin(origin)
    except ArgumentError:
        return None
    row = Agent.select(Agent.embed_origins).where(Agent.id == agent_id).first()
    if row is None:
        return None
    allowed = origins_of(row)
    return origin if (ANY_ORIGIN in allowed or wanted in allowed) else None


# ---------------------------------------------------------------------- snippet
def page_url(base_url: str, agent_id: str, embed_token: str | None) -> str:
    return f"{base_url.rstrip('/')}/embed/agents/{agent_id}?auth={embed_token or TOKEN_PLACEHOLDER}"


def snippet(base_url: str, agent: Agent, embed_token: str | None = None) -> dict:
    """What ``GET /agents/<id>/embed`` answers: the page URL and the iframe to paste."""
    url = page_url(base_url, agent.id, embed_token)
    origins = origins_of(agent)
    iframe = (
        f'<iframe src="{escape(url)}" title="{escape(agent.title)}" '
        f'style="width: 100%; height: 600px; border: 0;" allow="clipboard-write"></iframe>'
    )
    out = {
        "url": url,
        "iframe": iframe,
        "allowed_origins": origins,
        "frame_ancestors": frame_ancestors(origins),
    }
    notes = []
    if embed_token is None:
        notes.append(
            f"replace {TOKEN_PLACEHOLDER} with an embed token (POST /api/v1/system/tokens "
            f'{{"kind": "embed"}} or `agentcanvas token create --embed`), or pass ?embed_token=...'
        )
    if not origins:
        notes.append(
            "no parent origins are allowed yet, so only this server can frame the page: "
            'PUT this route {"allowed_origins": ["https://your.site"]}'
        )
    if notes:
        out["notes"] = notes
    return out


# ---------------------------------------------------------------------- the bot's reads
def bot_info(tenant_id: str, agent_id: str, limits: Any) -> dict:
    """``GET /agentbots/<id>/inputs``: ``{title, avatar, prologue, mode, inputs}`` and limits,
    of the version the page runs (the latest release when there is one, else the draft)."""
    agent, _, dsl = runnable_version(tenant_id, agent_id, None)
    canvas = Canvas(dsl, limits=limits)
    begin = canvas.component("begin")
    return {
        "title": agent.title,
        "avatar": None,
        "prologue": begin.prologue(),
        "mode": begin.mode,
        "inputs": public_form(begin.form()),
        "max_value_bytes": limits.max_value_bytes,
        # What the page may upload: it refuses other files in words before sending them.
        "max_file_bytes": limits.max_file_bytes,
        "max_files_per_turn": limits.max_files_per_turn,
        "file_types": list(docparse.SUPPORTED_EXTENSIONS),
    }


def end_user_session(
    tenant_id: str, agent_id: str, session_id: str, end_user: str, page: int = 1, page_size: int = 100
) -> dict:
    """An end user's own session for the page to show again after a reload.

    ``message`` is one page of the conversation (page 1: the most recent messages),
    without the answers a regenerate took back. ``form`` is the form still waiting
    (the fields last asked for), or ``None``.
    """
    get_agent(tenant_id, agent_id)
    row = turn_service().find_session(tenant_id, agent_id, session_id, end_user, fields=_HISTORY_FIELDS)
    messages, total = transcript(row.id, page, page_size, abandoned=False)
    status = effective_status(row)
    form = None
    if row.pending_form:
        # The form was asked by the last message, whichever page was asked for.
        last = messages if page == 1 else transcript(row.id, 1, 1, abandoned=False)[0]
        asked = last[-1] if last else None
        if asked is not None and asked["role"] == "assistant" and asked.get("form"):
            form = {"component_id": asked.get("component_id"), "inputs": asked["form"]}
    return {
        "id": row.id,
        "agent_id": row.agent_id,
        "status": status,
        "pending_form": row.pending_form,
        "form": form,
        "message": messages,
        "messages_page": page,
        "messages_page_size": page_size,
        "messages_total": total,
    }


def cancel_end_user_turn(tenant_id: str, agent_id: str, session_id: str, end_user: str) -> dict:
    """Cancel the running turn of an end user's own session (the page's stop button)."""
    service = turn_service()
    get_agent(tenant_id, agent_id)
    row = service.find_session(
        tenant_id, agent_id, session_id, end_user, fields=(Session.id, Session.task_id)
    )
    if not row.task_id:
        return {"session_id": row.id, "task_id": None, "cancelled": False}
    return service.request_cancel(tenant_id, row.task_id)


# ---------------------------------------------------------------------- failures
#: What an anonymous end user reads when a turn fails. The whole error names internal
#: things (provider URLs, hosts, component ids); it stays on the session
#: (``last_error``) for the agent's owner to read over the management API.
_PUBLIC_FAILURES = {
    "LLMTimeout": "The assistant took too long to answer. Please try again.",
    "LLMError": "The assistant's language service is not available right now. Please try again later.",
}
_PUBLIC_FAILURE = "The assistant could not finish this answer. Please try again; if it keeps failing, tell the site's owner."


def public_failure(event: dict) -> dict:
    """A failed turn's ending event without internal detail; other events as they are."""
    data = event.get("data") or {}
    if event.get("event") != "workflow_finished" or data.get("status") != "failed":
        return event
    text = _PUBLIC_FAILURES.get(str(data.get("error_type")), _PUBLIC_FAILURE)
    return {**event, "data": {**data, "error": text, "content": text}}


class EndUserTurn:
    """A running turn as an anonymous end user sees it (failures without internal detail).

    Offers what :func:`api.blueprints.completions.sse_reply` and ``blocking_reply`` read.
    """

    def __init__(self, turn: Turn):
        self._turn = turn
        self.session_id = turn.session_id
        self.task_id = turn.task_id

    def events(self) -> Iterator[dict]:
        for event in self._turn.events():
            yield public_failure(event)

    def wait(self) -> TurnResult:
        result = self._turn.wait()
        if result.status != "failed":
            return result
        final = public_failure(result.final_event)
        return dataclasses.replace(result, final_event=final, error=final["data"]["error"])
