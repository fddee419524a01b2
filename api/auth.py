"""Bearer-token authentication for the REST blueprints.

``Authorization: Bearer <api token>`` (a bare token without ``Bearer`` is accepted,
as RAGFlow does). The caller's tenant id ends up in ``flask.g.tenant_id``.
"""

from __future__ import annotations

from flask import g, request

from api import ratelimit
from api.errors import AuthError
from api.services.tokens import hash_token, tenant_for_token


def bearer_token() -> str | None:
    # Read from the WSGI environ, as request.headers would (without building that view).
    # Flask's globals are read through their objects here and on the rest of a request's
    # path (_get_current_object()): an attribute read through a werkzeug proxy is a failed
    # look-up first, an AttributeError made and dropped, about 7k instructions each.
    header = request._get_current_object().environ.get("HTTP_AUTHORIZATION", "").strip()  # type: ignore[attr-defined]
    if not header:
        return None
    parts = header.split()
    if len(parts) == 2 and parts[0].lower() == "bearer":
        return parts[1]
    if len(parts) == 1:
        return parts[0]
    return None


def require_api_token() -> None:
    """``before_request`` hook: refuse the request unless it carries a valid API token
    (and the token is within ``AGENTCANVAS_RATE_LIMIT_API``)."""
    token = bearer_token()
    if not token:
        raise AuthError(
            "missing API token: send 'Authorization: Bearer <token>' "
            "(make one with `agentcanvas token create`)"
        )
    tenant = tenant_for_token(token, "api")
    if tenant is None:
        raise AuthError("the API token is not valid (revoked, mistyped, or an embed token)")
    g._get_current_object().tenant_id = tenant  # type: ignore[attr-defined]
    if ratelimit.limited("api"):
        ratelimit.hit("api", hash_token(token)[:32])
