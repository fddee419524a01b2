"""The REST API: ``create_app(config=None)`` builds the Flask app (:mod:`api.app`).

Importing a part of the package (``api.db``, ``api.services.tokens``, ``api.cli``...)
does not import the web app: ``create_app``, ``stop_background`` and ``App`` are taken
from :mod:`api.app` when first asked for. So a command that needs only the database
(``agentcanvas token create``, ``agent import``, ``sweep``...) starts without Flask's
routes, the blueprints and the OpenAPI description.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from api.app import App, create_app, stop_background

__all__ = ["App", "create_app", "stop_background"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from api import app

        return getattr(app, name)
    raise AttributeError(f"module 'api' has no attribute {name!r}")
