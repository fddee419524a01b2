"""``GET /api/v1/docs``: the OpenAPI document as a page for people (no script, no CDN)."""

from __future__ import annotations

from flask import Blueprint, render_template
from flask.typing import ResponseReturnValue

from api.openapi import operations, spec

bp = Blueprint("docs", __name__)


@bp.get("/api/v1/docs")
def api_docs() -> ResponseReturnValue:
    document = spec.spec
    return render_template("api_docs.html", info=document.get("info", {}), groups=operations(document))
