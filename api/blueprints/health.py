"""Health and metrics for operators, outside ``/api/v1`` and without a token.

* ``GET /healthz`` — the process answers (liveness): always 200 while it serves.
* ``GET /readyz`` — the database answers too (readiness): 200, or 503 with
  ``Retry-After`` while it cannot be reached (no driver text in the reply).
* ``GET /metrics`` — Prometheus text format, summed over every gunicorn worker
  (see :mod:`api.telemetry`).
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify
from peewee import PeeweeException

from api.db import db
from api.telemetry import metrics, render_metrics

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():  # noqa: ANN201 - a Flask view
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz():  # noqa: ANN201 - a Flask view
    try:
        with db.connection_context():
            db.execute_sql("SELECT 1").fetchone()
    except PeeweeException:
        metrics().db_errors.labels("readyz").inc()
        reply = jsonify({"status": "unavailable", "database": "not reachable"})
        reply.status_code = 503
        reply.headers["Retry-After"] = "5"
        return reply
    return jsonify({"status": "ok", "database": "ok"})


@bp.get("/metrics")
def prometheus_metrics() -> Response:
    body, content_type = render_metrics()
    return Response(body, content_type=content_type)
