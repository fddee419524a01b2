"""The app's configuration: defaults, then ``conf/`` and ``AGENTCANVAS_*``, then a dict.

Flask-style upper-case keys. ``conf/service_conf.yaml`` (read with the environment
overrides by :func:`agent.settings.load_settings`) maps onto them like this:

========================  =====================================
key                       from
========================  =====================================
``DATABASE_URL``          ``database.url``
``LEASE_SECONDS``         ``server.lease_seconds``
``CANCEL_POLL_SECONDS``   ``server.cancel_poll_seconds``
``DB_MAX_CONNECTIONS``    ``server.db_max_connections``
``CANVAS_CACHE_ENTRIES``  ``server.canvas_cache_entries``
``CANVAS_CACHE_BYTES``    ``server.canvas_cache_bytes``
``MAX_CONTENT_LENGTH``    ``limits.max_body_bytes``
``PAGE_SIZE``             ``limits.page_size``
``MAX_TRANSCRIPT_BYTES``  ``session.max_transcript_bytes``
``KEEP_SNAPSHOTS``        ``session.keep_snapshots``
``SESSION_TTL_SECONDS``   ``session.ttl_seconds``
``SWEEP_BATCH``           ``session.sweep_batch``
``SWEEP_INTERVAL_SECONDS`` ``session.sweep_interval_seconds``
``MEMORY_TTL_SECONDS``    ``memory.ttl_seconds``
``AGENT_LIST_SHAPE``      ``agent.list_shape`` (``AGENTCANVAS_AGENT_LIST_SHAPE``)
``LIMITS``                ``limits`` (the fields of :class:`agent.limits.Limits`)
``SETTINGS``              everything, for services that read other sections
========================  =====================================
"""

from __future__ import annotations

import copy
from typing import Any

from agent.limits import Limits

DEFAULTS: dict[str, Any] = {
    # A relative SQLite path is under AGENTCANVAS_HOME (agent.settings.data_home).
    "DATABASE_URL": "sqlite:///agentcanvas.db",
    "DB_MAX_CONNECTIONS": 32,
    # How long a turn's claim on a session lasts without renewal; a crashed worker's
    # session is free again after this.
    "LEASE_SECONDS": 30,
    # How often a running turn looks at the database for a cancel request.
    "CANCEL_POLL_SECONDS": 0.5,
    # Per worker process: the canvases of the sessions whose last turn it ran, so that
    # their next turn there skips parsing the snapshot (api/services/canvas_cache.py);
    # at most this many sessions (0: off) and this much snapshot text (the parsed
    # canvases take about 7 times that in memory).
    "CANVAS_CACHE_ENTRIES": 1000,
    "CANVAS_CACHE_BYTES": 8 * 1024 * 1024,
    "MAX_CONTENT_LENGTH": 16 * 1024 * 1024,
    "PAGE_SIZE": 100,
    # The most bytes a session's message log may hold (its stored transcript).
    "MAX_TRANSCRIPT_BYTES": 16 * 1024 * 1024,
    # Earlier states kept per session for regenerate and undo (0: none).
    "KEEP_SNAPSHOTS": 10,
    # Idle-session lifetime (0: forever), the sweep's batch and pace, keyed memory's lifetime.
    "SESSION_TTL_SECONDS": 0,
    "SWEEP_BATCH": 500,
    "SWEEP_INTERVAL_SECONDS": 60,
    "MEMORY_TTL_SECONDS": 0,
    # GET /agents answers {"canvas": [...], "total": N} as current RAGFlow (ragflow-sdk >= 0.26);
    # "list" for the bare list that ragflow-sdk 0.22 reads.
    "AGENT_LIST_SHAPE": "canvas",
    "LIMITS": {},
    # The ``files`` section: store, directory, piece_bytes, max_files_per_request.
    "FILES": {},
    "SETTINGS": {},
    # Objects handed to every Canvas as ``services`` (e.g. an LLM client factory).
    "SERVICES": {},
}

_FROM_SETTINGS = {
    "DATABASE_URL": ("database", "url"),
    "LEASE_SECONDS": ("server", "lease_seconds"),
    "CANCEL_POLL_SECONDS": ("server", "cancel_poll_seconds"),
    "DB_MAX_CONNECTIONS": ("server", "db_max_connections"),
    "CANVAS_CACHE_ENTRIES": ("server", "canvas_cache_entries"),
    "CANVAS_CACHE_BYTES": ("server", "canvas_cache_bytes"),
    "MAX_CONTENT_LENGTH": ("limits", "max_body_bytes"),
    "PAGE_SIZE": ("limits", "page_size"),
    "MAX_TRANSCRIPT_BYTES": ("session", "max_transcript_bytes"),
    "KEEP_SNAPSHOTS": ("session", "keep_snapshots"),
    "SESSION_TTL_SECONDS": ("session", "ttl_seconds"),
    "SWEEP_BATCH": ("session", "sweep_batch"),
    "SWEEP_INTERVAL_SECONDS": ("session", "sweep_interval_seconds"),
    "MEMORY_TTL_SECONDS": ("memory", "ttl_seconds"),
    "AGENT_LIST_SHAPE": ("agent", "list_shape"),
}
AGENT_LIST_SHAPES = ("canvas", "list")


def from_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The app keys found in ``load_settings()``'s result."""
    out: dict[str, Any] = {"SETTINGS": copy.deepcopy(settings)}
    for key, (section, name) in _FROM_SETTINGS.items():
        value = (settings.get(section) or {}).get(name)
        if value not in (None, ""):
            out[key] = value
    limits = settings.get("limits") or {}
    if isinstance(limits, dict):
        out["LIMITS"] = dict(limits)
    # AGENTCANVAS_MAX_FILE_BYTES (docs/design.md's name) arrives as section "max", key "file_bytes".
    max_file_bytes = (
        (settings.get("max") or {}).get("file_bytes") if isinstance(settings.get("max"), dict) else None
    )
    if max_file_bytes not in (None, ""):
        out.setdefault("LIMITS", {})["max_file_bytes"] = max_file_bytes
    files = settings.get("files") or {}
    if isinstance(files, dict):
        out["FILES"] = dict(files)
    return out


def merge(config: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Apply ``overrides`` onto ``config``; ``LIMITS`` and ``SETTINGS`` merge key by key."""
    for key, value in overrides.items():
        if key in ("LIMITS", "FILES", "SETTINGS", "SERVICES") and isinstance(value, dict):
            config[key] = {**(config.get(key) or {}), **value}
        else:
            config[key] = value


def check(config: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming a setting that cannot work."""
    for key in (
        "LEASE_SECONDS",
        "CANCEL_POLL_SECONDS",
        "MAX_CONTENT_LENGTH",
        "PAGE_SIZE",
        "DB_MAX_CONNECTIONS",
        "MAX_TRANSCRIPT_BYTES",
        "SWEEP_BATCH",
    ):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"setting {key} must be a positive number, got {value!r}")
    interval = config.get("SWEEP_INTERVAL_SECONDS")
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < 0:
        raise ValueError(f"setting SWEEP_INTERVAL_SECONDS must be a number, 0 or more, got {interval!r}")
    for key in (
        "KEEP_SNAPSHOTS",
        "SESSION_TTL_SECONDS",
        "MEMORY_TTL_SECONDS",
        "CANVAS_CACHE_ENTRIES",
        "CANVAS_CACHE_BYTES",
    ):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"setting {key} must be a whole number, 0 or more, got {value!r}")
    if config.get("AGENT_LIST_SHAPE") not in AGENT_LIST_SHAPES:
        raise ValueError(
            f"setting AGENT_LIST_SHAPE (AGENTCANVAS_AGENT_LIST_SHAPE) must be one of "
            f"{', '.join(AGENT_LIST_SHAPES)}, got {config.get('AGENT_LIST_SHAPE')!r}"
        )
    if not isinstance(config.get("LIMITS"), dict):
        raise ValueError(f"setting LIMITS must be a mapping of limit names, got {config.get('LIMITS')!r}")


def canvas_limits(config: dict[str, Any]) -> Limits:
    return Limits.from_mapping(config.get("LIMITS"))
