"""``/api/v1/system/tokens``: the caller's tenant's tokens."""

from __future__ import annotations

from flask import Blueprint
from flask.typing import ResponseReturnValue
from pydantic import Field

from api.auth import require_api_token
from api.http import field, json_body, ok, tenant_id
from api.openapi import Body, spec
from api.services import tokens

bp = Blueprint("tokens", __name__, url_prefix="/api/v1")
bp.before_request(require_api_token)


@bp.get("/system/tokens")
def list_tokens() -> ResponseReturnValue:
    return ok([tokens.token_json(t) for t in tokens.list_tokens(tenant_id())])


class TokenBody(Body):
    kind: str | None = Field(default=None, description="api (default) or embed")


@bp.post("/system/tokens")
@spec.validate(json=TokenBody, tags=["tokens"])
def create_token() -> ResponseReturnValue:
    body = json_body(required=False)
    kind = field(body, "kind", str, default="api")
    plain, row = tokens.create_token(tenant_id(), kind)
    return ok(tokens.token_json(row, plain), message="success; the token is shown only now")


@bp.delete("/system/tokens/<token>")
def revoke_token(token: str) -> ResponseReturnValue:
    tokens.revoke_token(token, tenant_id())
    return ok(True)
