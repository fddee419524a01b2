"""Component registry: ``component_name`` → class.

Every module in this package is imported on first use; a module registers its class
with :func:`register`. Names are matched case-insensitively (RAGFlow's DSL is not
consistent about case) and a second class under the same name is refused.
"""

from __future__ import annotations

import importlib
import pkgutil

from agent.component.base import ComponentBase, ComponentParamBase

_REGISTRY: dict[str, type[ComponentBase]] = {}
_loaded = False


def register(cls: type[ComponentBase]) -> type[ComponentBase]:
    """Class decorator adding a component type to the registry."""
    key = cls.component_name.lower()
    if not key:
        raise TypeError(f"{cls.__name__} has no component_name")
    if key in _REGISTRY and _REGISTRY[key] is not cls:
        raise TypeError(f"component {cls.component_name!r} is registered twice")
    _REGISTRY[key] = cls
    return cls


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")
    _loaded = True


def component_class(name: str) -> type[ComponentBase] | None:
    """The class registered under ``name``, or ``None``."""
    _load_all()
    return _REGISTRY.get(str(name).lower())


def component_names() -> list[str]:
    _load_all()
    return sorted(cls.component_name for cls in _REGISTRY.values())


__all__ = ["ComponentBase", "ComponentParamBase", "register", "component_class", "component_names"]
