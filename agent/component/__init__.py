"""Component registry: ``component_name`` → class.

The modules in :data:`COMPONENT_MODULES` are imported on first use (a plain list, so a
reader sees every type in one place and greps for it); each registers its classes with
:func:`register`. A new component type is a new module *and* a line in that list
(tests/agent/test_registry.py fails if a module is left out). Names are matched
case-insensitively (RAGFlow's DSL is not consistent about case) and a second class under
the same name is refused.
"""

from __future__ import annotations

import importlib

from agent.component.base import ComponentBase, ComponentParamBase

#: The modules under agent/component/ that define component types, imported on first use.
COMPONENT_MODULES: tuple[str, ...] = (
    "agent",
    "begin",
    "bing",
    "categorize",
    "code_exec",
    "data_operations",
    "duckduckgo",
    "exesql",
    "exit_loop",
    "google",
    "invoke",
    "iteration",
    "iteration_item",
    "list_operations",
    "llm",
    "loop",
    "loop_item",
    "message",
    "retrieval",
    "string_transform",
    "switch",
    "tavily",
    "user_fill_up",
    "variable_aggregator",
    "variable_assigner",
    "wikipedia",
    "yahoofinance",
)

_REGISTRY: dict[str, type[ComponentBase]] = {}
_loaded = False


def register(cls: type[ComponentBase]) -> type[ComponentBase]:
    """Class decorator adding a component type to the registry."""
    key = cls.component_name.lower()
    if not key:
        raise TypeError(f"{cls.__name__} has no component_name")
    if key in _REGISTRY and _REGISTRY[key] is not cls:
        raise TypeError(
            f"component {cls.component_name!r} is registered twice ({_REGISTRY[key].__module__}."
            f"{_REGISTRY[key].__name__} and {cls.__module__}.{cls.__name__}); give one another component_name"
        )
    _REGISTRY[key] = cls
    return cls


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for name in COMPONENT_MODULES:
        importlib.import_module(f"{__name__}.{name}")
    _loaded = True


def component_class(name: str) -> type[ComponentBase] | None:
    """The class registered under ``name``, or ``None``."""
    _load_all()
    return _REGISTRY.get(str(name).lower())


def component_names() -> list[str]:
    _load_all()
    return sorted(cls.component_name for cls in _REGISTRY.values())


__all__ = [
    "COMPONENT_MODULES",
    "ComponentBase",
    "ComponentParamBase",
    "register",
    "component_class",
    "component_names",
]
