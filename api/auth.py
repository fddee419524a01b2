"""Bearer-token authentication for the REST blueprints.

``Authorization: Bearer <api token>`` (a bare token without ``Bearer`` is accepted,
as RAGFlow does). The caller's tenant id ends up in ``flask.g.tenant_id``.
"""

from __future__ import annotations

from flask import g, request

from api import ratelimit
from api.errors import AuthError
from api.services.tokens import hash_token, tenant_for_token


def bearer_token(environ: dict | None = None) -> str | None:
    """The token of the request's ``Authorization`` header (the current request's, or the
    one ``environ`` describes)."""
    # Read from the WSGI environ, as request.headers would (without building that view).
    # Flask's globals are read through their objects here and on the rest of a request's
    # path (_get_current_object()): an attribute read through a werkzeug proxy is a failed
    # look-up first, an AttributeError made and dropped, about 7k instructions each.
    if environ is None:
        environ = request._get_current_object().environ  # type: ignore[attr-defined]
    header = environ.get("HTTP_AUTHORIZATION", "").strip()
    if not header:
        return None
    parts = header.split()
    if len(parts) == 2 and parts[0].lower() == "bearer":
        return parts[1]
    if len(parts) == 1:
        return parts[0]
    return None


def authenticate(environ: dict) -> str:
    """The tenant of the request ``environ`` describes, whose API token must be valid (and
    within ``AGENTCANVAS_RATE_LIMIT_API``: the request counts against it)."""
    token = bearer_token(environ)
    if not token:
        raise AuthError(
            "missing API token: send 'Authorization: Bearer <token>' "
            "(make one with `agentcanvas token create`)"
        )
    tenant = tenant_for_token(token, "api")
    if tenant is None:
        raise AuthError("the API token is not valid (revoked, mistyped, or an embed token)")
    if ratelimit.limited("api"):
        ratelimit.hit("api", hash_token(token)[:32])
    return tenant


def require_api_token() -> None:
    """``before_request`` hook: refuse the request unless it carries a valid API token
    (see :func:`authenticate`); the tenant goes to ``flask.g.tenant_id``."""
    tenant = authenticate(request._get_current_object().environ)  # type: ignore[attr-defined]
    g._get_current_object().tenant_id = tenant  # type: ignore[attr-defined]
