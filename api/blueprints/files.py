"""Files in conversations: ``POST /api/v1/agents/<id>/upload`` and
``GET /api/v1/agents/attachments/<id>/download`` (API token). The embed page's
``POST /api/v1/agentbots/<id>/upload`` lives with the other embed routes
(:mod:`api.blueprints.embed`) and shares :func:`upload_reply`."""

from __future__ import annotations

import io

from flask import Blueprint, current_app, request, send_file
from flask.typing import ResponseReturnValue

from api.auth import require_api_token
from api.http import ok, tenant_id
from api.services import files
from api.services.agents import get_agent

bp = Blueprint("files", __name__, url_prefix="/api/v1")
bp.before_request(require_api_token)


def file_settings() -> files.FileSettings:
    return files.FileSettings.from_config(current_app.config)


def allow_upload_body() -> None:
    """Upload routes take bodies up to every file at its limit (docs/design.md §13), not the
    JSON routes' limit. Call before the form is read."""
    request.max_content_length = file_settings().upload_body_limit()


def upload_reply(agent_id: str, created_by: str, end_user: str | None) -> ResponseReturnValue:
    """Store the request's ``file`` parts; one file answers its descriptor, several a list
    (as RAGFlow's route does)."""
    settings = file_settings()
    allow_upload_body()
    uploads = list(request.files.getlist("file"))
    saved = files.save_uploads(
        uploads,
        tenant_id=tenant_id(),
        agent_id=agent_id,
        created_by=created_by,
        end_user=end_user,
        settings=settings,
    )
    return ok(saved[0] if len(saved) == 1 else saved)


@bp.post("/agents/<agent_id>/upload")
def upload(agent_id: str) -> ResponseReturnValue:
    allow_upload_body()
    get_agent(tenant_id(), agent_id)
    return upload_reply(agent_id, created_by=tenant_id(), end_user=None)


@bp.get("/agents/attachments/<file_id>/download")
def download(file_id: str) -> ResponseReturnValue:
    row = files.find_file(tenant_id(), file_id)
    data = files.read_part(row, "data", file_settings())
    return send_file(io.BytesIO(data), mimetype=row.mime_type, as_attachment=True, download_name=row.name)
