"""One blueprint per resource, registered from the plain list in :func:`blueprints`.

A new resource is a new module here *and* a line in that list (tests/api/test_app.py
fails if a module's blueprint is left out).
"""

from __future__ import annotations

from flask import Blueprint, Flask


def blueprints() -> list[Blueprint]:
    """Every blueprint the app serves, in registration order."""
    # Imported here, not at the top: the blueprints import the services, which need
    # the api package (and its config) to be importable first, as in flaskr's create_app.
    from api.blueprints import (
        agents,
        completions,
        datasets,
        docs,
        embed,
        files,
        health,
        mcp,
        memories,
        memory,
        openai_compat,
        sessions,
        tasks,
        tokens,
        webhook,
    )

    return [
        agents.bp,
        completions.bp,
        datasets.bp,
        docs.bp,
        embed.bp,
        files.bp,
        health.bp,
        mcp.bp,
        memories.bp,
        memory.bp,
        openai_compat.bp,
        sessions.bp,
        tasks.bp,
        tokens.bp,
        webhook.bp,
    ]


def register_all(app: Flask) -> None:
    for bp in blueprints():
        app.register_blueprint(bp)
