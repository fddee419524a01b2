"""The component registry: its explicit module list is complete and names stay unique."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import agent.component as components
from agent.component import COMPONENT_MODULES, component_class, component_names, register
from agent.component.base import ComponentBase


def _registered_by_module() -> dict[str, set[str]]:
    """Import every module in the package (not only the listed ones) and group the
    registered classes by the module that defines them."""
    for info in pkgutil.iter_modules(components.__path__):
        importlib.import_module(f"{components.__name__}.{info.name}")
    found: dict[str, set[str]] = {}
    for name in component_names():
        module, _, short = component_class(name).__module__.rpartition(".")
        if module == components.__name__:  # not the test-only types of tests/api/components.py
            found.setdefault(short, set()).add(name)
    return found


def test_every_module_that_defines_a_component_is_listed():
    missing = sorted(set(_registered_by_module()) - set(COMPONENT_MODULES))
    assert not missing, f"add {missing} to agent.component.COMPONENT_MODULES"


def test_every_listed_module_defines_a_component():
    stale = sorted(set(COMPONENT_MODULES) - set(_registered_by_module()))
    assert not stale, f"{stale} in COMPONENT_MODULES register no component"


def test_a_second_class_under_a_taken_name_is_refused_whatever_its_case():
    before = component_class("Message")

    class Impostor(ComponentBase):
        component_name = "message"

    with pytest.raises(TypeError, match=r"'message' is registered twice .*Impostor"):
        register(Impostor)
    assert component_class("Message") is before
