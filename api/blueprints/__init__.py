"""One blueprint per resource. Every module here that defines ``bp`` is registered.

A later feature (the embed page, the OpenAI-compatible endpoint) adds its module
here and is picked up without touching the app factory.
"""

from __future__ import annotations

import importlib
import pkgutil

from flask import Blueprint, Flask


def blueprints() -> list[Blueprint]:
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        bp = getattr(module, "bp", None)
        if isinstance(bp, Blueprint):
            found.append(bp)
    return found


def register_all(app: Flask) -> None:
    for bp in blueprints():
        app.register_blueprint(bp)
