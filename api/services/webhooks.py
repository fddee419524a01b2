"""Webhook trigger: an agent whose Begin is in ``Webhook`` mode runs when
``/api/v1/agents/<id>/webhook`` is called (RAGFlow's params and replies).

Begin's webhook params (as RAGFlow's editor writes them):

* ``methods``: the HTTP methods accepted (all when empty);
* ``security``: ``auth_type`` ``token`` (``token: {token_header, token_value}``),
  ``basic`` (``basic_auth: {username, password}``) or ``none`` (only with
  ``allow_anonymous: true``; without a ``security`` object the webhook is refused, as
  RAGFlow does); ``max_body_size`` (``"10MB"``, ``"512KB"``; at most 10 MB);
  ``ip_whitelist`` (addresses or networks); ``jwt`` is refused as not supported;
* ``content_types``: the one Content-Type accepted (any when empty);
* ``schema``: ``{query, headers, body}``, each a JSON schema whose ``properties`` pick
  and type the fields Begin outputs (required ones must be there); a section without
  properties passes whole (headers without the credentials and cookies);
* ``execution_mode``: ``Immediately`` (the default: answer at once with
  ``response: {status, body_template}`` and run in the background) or anything else
  (run, then answer ``{"message", "success", "code"}``).

Calls are rate-limited per agent (:mod:`api.ratelimit`, ``AGENTCANVAS_RATE_LIMIT_WEBHOOK``
or the agent's own ``rate_limits``): 429 with ``Retry-After``. Each run is a new session of the agent (``sys.invoke_from`` ``webhook``). Begin's
outputs are ``method``, ``query``, ``headers`` and ``body``. Every real run — not only
test runs, as in RAGFlow — is logged with its events (``webhook_log``) and read back
through ``GET /agents/<id>/webhook/logs`` (RAGFlow's polling protocol: ``since_ts``,
``webhook_id``, ``next_since_ts``, ``finished``). Refused calls are not runs and are
not logged.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from api import ratelimit
from api.db import Agent, WebhookLog, db, now_ms
from api.errors import ApiError, ArgumentError, AuthError, Forbidden, NotFound, TooLarge
from api.services.turns import TurnRequest, TurnService

log = logging.getLogger("agentcanvas.webhook")

MAX_BODY_LIMIT = 10 * 1024 * 1024
_UNITS = {"kb": 1024, "mb": 1024 * 1024}
_SECRET_HEADERS = {"authorization", "cookie", "proxy-authorization"}
_KEEP_EVENTS = 200


@dataclass
class WebhookCall:
    """The parts of an HTTP request a webhook reads (the view fills it)."""

    method: str
    headers: dict[str, str]
    query: dict[str, str]
    content_type: str
    body: bytes
    remote_addr: str
    content_length: int | None = None
    extra: dict = field(default_factory=dict)


def webhook_params(dsl: dict) -> dict | None:
    """Begin's params if it is in webhook mode."""
    begin = (dsl.get("components") or {}).get("begin") or {}
    params = (begin.get("obj") or {}).get("params") or {}
    return params if str(params.get("mode", "")).lower() == "webhook" else None


def _max_body(security: dict) -> int:
    text = str(security.get("max_body_size") or "10MB").strip().lower()
    for suffix, factor in _UNITS.items():
        if text.endswith(suffix) and text[: -len(suffix)].strip().isdigit():
            limit = int(text[: -len(suffix)]) * factor
            break
    else:
        raise ArgumentError(f"max_body_size {security.get('max_body_size')!r} is not like '10MB' or '512KB'")
    if limit > MAX_BODY_LIMIT:
        raise ArgumentError("max_body_size exceeds the maximum allowed size (10MB)")
    return limit


def _same(given: str | None, expected: Any) -> bool:
    return (
        given is not None
        and isinstance(expected, str)
        and hmac.compare_digest(given.encode(), expected.encode())
    )


def check_call(params: dict, call: WebhookCall) -> None:
    """Method, size, address and authentication; raises the API error to answer."""
    methods = [str(m).upper() for m in params.get("methods") or []]
    if methods and call.method not in methods:
        raise ArgumentError(
            f"HTTP method {call.method!r} is not allowed for this webhook; allowed: {', '.join(methods)}"
        )
    security = params.get("security")
    if not isinstance(security, dict) or not security:
        raise Forbidden(
            "webhook security is required: set security.auth_type, or allow_anonymous for no authentication"
        )
    limit = _max_body(security)
    if (call.content_length or 0) > limit or len(call.body) > limit:
        raise TooLarge(f"the request body is larger than the webhook's max_body_size ({limit} bytes)")
    whitelist = security.get("ip_whitelist") or []
    if whitelist:
        try:
            address = ipaddress.ip_address(call.remote_addr)
            allowed = any(address in ipaddress.ip_network(str(rule), strict=False) for rule in whitelist)
        except ValueError:
            allowed = False
        if not allowed:
            raise Forbidden(f"address {call.remote_addr} is not in the webhook's ip_whitelist")
    auth_type = str(security.get("auth_type") or "none").lower()
    if auth_type == "none":
        if str(security.get("allow_anonymous", "")).strip().lower() not in ("1", "true", "yes", "on"):
            raise Forbidden("anonymous webhook access requires security.allow_anonymous to be true")
    elif auth_type == "token":
        token = security.get("token") or {}
        header = str(token.get("token_header") or "")
        if not header or not _same(call.headers.get(header.lower()), token.get("token_value")):
            raise AuthError("invalid token authentication for this webhook")
    elif auth_type == "basic":
        basic = security.get("basic_auth") or {}
        user, password = _basic_credentials(call.headers.get("authorization"))
        if not (_same(user, basic.get("username")) and _same(password, basic.get("password"))):
            raise AuthError("invalid Basic authentication for this webhook")
    else:
        raise ArgumentError(f"auth_type {auth_type!r} is not supported; use token, basic or none")


def _basic_credentials(header: str | None) -> tuple[str | None, str | None]:
    if not header or not header.lower().startswith("basic "):
        return None, None
    try:
        user, _, password = base64.b64decode(header[6:].strip()).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return None, None
    return user, password


def _parse_body(call: WebhookCall, expected: Any) -> Any:
    ctype = call.content_type
    if expected and ctype and ctype != expected:
        raise ArgumentError(f"Content-Type must be {expected!r}, got {ctype!r}")
    if not call.body:
        return {}
    if ctype == "application/x-www-form-urlencoded":
        from urllib.parse import parse_qsl

        return dict(parse_qsl(call.body.decode("utf-8", errors="replace")))
    try:
        return json.loads(call.body)
    except ValueError:
        if ctype == "application/json":
            raise ArgumentError("the request body is not valid JSON") from None
        return call.body.decode("utf-8", errors="replace")


def _cast(value: Any, kind: str, where: str) -> Any:
    """RAGFlow's conversion of text to a schema type."""
    if not isinstance(value, str) or kind in ("string", "", None):
        return value
    text = value.strip()
    try:
        if kind == "boolean" and text.lower() in ("true", "1", "false", "0"):
            return text.lower() in ("true", "1")
        if kind in ("number", "integer"):
            return int(text) if text.lstrip("-").isdigit() else float(text)
        if kind == "object" or kind.startswith("array"):
            return json.loads(text)
    except ValueError:
        pass
    raise ArgumentError(f"{where} {value!r} is not a {kind}")


def _fits(value: Any, kind: str) -> bool:
    if kind in ("number", "integer"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    checks = {"string": str, "boolean": bool, "object": dict}
    if kind in checks:
        return isinstance(value, checks[kind])
    if kind and kind.startswith("array"):
        return isinstance(value, list)
    return True


def extract(section: Any, schema: Any, name: str) -> Any:
    """The fields ``schema`` declares, typed; the whole section without properties."""
    props = (schema or {}).get("properties") if isinstance(schema, dict) else None
    if not props:
        return section
    data = section if isinstance(section, dict) else {}
    if name == "headers":
        data = {k.lower(): v for k, v in data.items()}
    out = {}
    for key, spec in props.items():
        kind = (spec or {}).get("type") or ""
        lookup = key.lower() if name == "headers" else key
        if lookup not in data:
            if key in (schema.get("required") or []):
                raise ArgumentError(f"{name} is missing required field {key!r}")
            out[key] = None
            continue
        value = _cast(data[lookup], kind, f"{name}.{key}")
        if not _fits(value, kind):
            raise ArgumentError(f"{name}.{key} must be a {kind}")
        out[key] = value
    return out


def request_payload(params: dict, call: WebhookCall) -> dict:
    """Begin's outputs for this call: method, query, headers, body (by the schema)."""
    security = params.get("security") or {}
    token_header = str((security.get("token") or {}).get("token_header") or "").lower()
    headers = {k: v for k, v in call.headers.items() if k not in _SECRET_HEADERS and k != token_header}
    schema = params.get("schema") or {}
    return {
        "method": call.method,
        "query": extract(call.query, schema.get("query"), "query"),
        "headers": extract(headers, schema.get("headers"), "headers"),
        "body": extract(_parse_body(call, params.get("content_types")), schema.get("body"), "body"),
    }


def trigger(turns: TurnService, agent_id: str, call: WebhookCall, app: Any) -> tuple[int, Any, str]:
    """Check the call and run the agent; ``(status, body, content type)`` to answer."""
    agent = Agent.get_or_none(Agent.id == agent_id)
    if agent is None:
        raise NotFound(f"agent {agent_id!r} not found")
    ratelimit.hit("webhook", agent.id, agent)  # AGENTCANVAS_RATE_LIMIT_WEBHOOK, or the agent's own
    params = webhook_params(json.loads(agent.dsl))
    if params is None:
        raise ArgumentError("the webhook is not configured for this agent: set its Begin's mode to 'Webhook'")
    check_call(params, call)
    payload = request_payload(params, call)
    immediate = str(params.get("execution_mode") or "Immediately").lower() == "immediately"
    response = params.get("response") or {}
    if immediate:
        status = response.get("status", 200)
        if not isinstance(status, int) and not (isinstance(status, str) and status.isdigit()):
            raise ArgumentError(f"response.status {status!r} is not an HTTP status")
        if not 200 <= int(status) <= 399:
            raise ArgumentError(f"response.status {status} must be between 200 and 399")
    entry = WebhookLog.create(
        agent_id=agent.id, tenant_id=agent.tenant_id, method=call.method, remote_addr=call.remote_addr[:64]
    )
    req = TurnRequest(
        tenant_id=agent.tenant_id,
        agent_id=agent.id,
        user_id="webhook",
        invoke_from="webhook",
        session_name="webhook",
        webhook=payload,
    )
    try:
        turn = turns.start(req)  # in a worker thread: every event reaches the log
    except ApiError as e:
        _finish(entry.id, "", [], "failed", str(e))
        raise
    if immediate:
        threading.Thread(
            target=_follow, args=(app, entry.id, turn), name="agentcanvas-webhook", daemon=True
        ).start()
        body_text = response.get("body_template") or ""
        try:
            return int(status), json.loads(body_text) if body_text else None, "application/json"
        except ValueError:
            return int(status), body_text, "text/plain"
    events = list(turn.events())
    result = turn.wait()
    _finish(entry.id, turn.session_id, events, result.status, result.error or "")
    if result.status == "succeeded":
        return 200, {"message": result.answer, "success": True, "code": 200}, "application/json"
    return 400, {"message": result.error or result.status, "success": False, "code": 400}, "application/json"


def _follow(app: Any, log_id: str, turn: Any) -> None:
    """Read a background run's events and log them when it ends."""
    with app.app_context():
        try:
            events = list(turn.events())
            result = turn.wait()
            status, error = result.status, result.error or ""
        except Exception as e:  # noqa: BLE001 - logged as a failed run
            log.exception("webhook run failed")
            events, status, error = [], "failed", str(e)
        with db.connection_context():
            _finish(log_id, turn.session_id, events, status, error)


def _finish(log_id: str, session_id: str, events: list[dict], status: str, error: str) -> None:
    row = WebhookLog.get_by_id(log_id)
    start = row.start_ms / 1000
    # Event times a poller can page by: after the run's start, in order.
    kept = [
        {"ts": start + (i + 1) / 1e6, "event": e.get("event"), "data": e.get("data")}
        for i, e in enumerate(events[-_KEEP_EVENTS:])
    ]
    WebhookLog.update(
        session_id=session_id or "",
        status=status,
        error=error[:2000],
        events=json.dumps(kept, ensure_ascii=False, default=str),
        end_ms=now_ms(),
    ).where(WebhookLog.id == log_id).execute()


def logs(tenant_id: str, agent_id: str, since_ts: float | None, webhook_id: str | None) -> dict:
    """RAGFlow's polling reply: the next run after ``since_ts``, then its events."""
    agent = Agent.get_or_none((Agent.id == agent_id) & (Agent.tenant_id == tenant_id))
    if agent is None:
        raise NotFound(f"agent {agent_id!r} not found")
    if since_ts is None:
        return {"webhook_id": None, "events": [], "next_since_ts": time.time(), "finished": False}
    if webhook_id is None:
        row = (
            WebhookLog.select()
            .where((WebhookLog.agent_id == agent_id) & (WebhookLog.start_ms > int(since_ts * 1000)))
            .order_by(WebhookLog.start_ms, WebhookLog.id)
            .first()
        )
        if row is None:
            return {"webhook_id": None, "events": [], "next_since_ts": since_ts, "finished": False}
        return {
            "webhook_id": row.id,
            "events": [],
            "next_since_ts": row.start_ms / 1000 - 0.0005,
            "finished": False,
        }
    row = WebhookLog.get_or_none((WebhookLog.id == webhook_id) & (WebhookLog.agent_id == agent_id))
    if row is None:
        return {"webhook_id": webhook_id, "events": [], "next_since_ts": since_ts, "finished": True}
    events = [e for e in json.loads(row.events or "[]") if (e.get("ts") or 0) > since_ts]
    next_ts = max([since_ts, *(e["ts"] for e in events if e.get("ts"))])
    finished = row.status != "running"
    if finished:
        events.append(
            {
                "ts": (row.end_ms or now_ms()) / 1000,
                "event": "finished",
                "success": row.status == "succeeded",
                "error": row.error or None,
                "elapsed_time": ((row.end_ms or row.start_ms) - row.start_ms) / 1000,
            }
        )
    return {
        "webhook_id": row.id,
        "events": events,
        "next_since_ts": next_ts,
        "finished": finished,
        "status": row.status,
        "session_id": row.session_id,
    }


def recent_runs(tenant_id: str, agent_id: str, limit: int = 20) -> list[dict]:
    """The latest runs, newest first (``GET …/webhook/logs?recent=true``)."""
    rows = (
        WebhookLog.select()
        .where((WebhookLog.agent_id == agent_id) & (WebhookLog.tenant_id == tenant_id))
        .order_by(WebhookLog.start_ms.desc())
        .limit(limit)
    )
    return [
        {
            "webhook_id": r.id,
            "method": r.method,
            "status": r.status,
            "error": r.error or None,
            "session_id": r.session_id,
            "start_ts": r.start_ms / 1000,
            "end_ts": r.end_ms / 1000 if r.end_ms else None,
        }
        for r in rows
    ]
