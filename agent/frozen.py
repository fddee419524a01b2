"""Read-only JSON values: what every session of an agent shares.

A component's checked params are worked out once per process for the same DSL
params and then shared by every canvas that loads them, in every session and
thread (:func:`agent.component.base.checked_param`). Shared, they must not change:
:func:`freeze` copies a value into lists and dicts that refuse to be changed
(``TypeError`` naming the fix) and still read as ``list`` and ``dict`` everywhere
(``isinstance``, JSON, iteration). Copies (``list(x)``, ``dict(x)``, ``x.copy()``,
slices, ``copy.deepcopy``, pickling) are ordinary, changeable values.
"""

from __future__ import annotations

from typing import Any, NoReturn

_SCALARS = (str, int, float, bool, type(None))


class NotFreezable(TypeError):
    """The value holds something other than JSON data (it cannot be shared safely)."""


def refuse_change(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(getattr(type(self), "refusal", _SHARED_REFUSAL))


_SHARED_REFUSAL = (
    "component params are shared by every session of an agent and cannot be changed; "
    "work on a copy (list(x), dict(x), copy.deepcopy(x))"
)


class FrozenList(list):
    """A ``list`` that refuses every change (``TypeError``: the class's ``refusal``, if it has one)."""

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = refuse_change
    append = extend = insert = pop = remove = clear = sort = reverse = refuse_change

    def __copy__(self) -> list:
        return list(self)

    def __deepcopy__(self, memo: dict) -> list:
        return [_thaw(v) for v in self]

    def __reduce__(self) -> tuple:
        return (list, (list(self),))


class FrozenDict(dict):
    """A ``dict`` that refuses every change."""

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = refuse_change
    pop = popitem = setdefault = update = clear = refuse_change

    def __copy__(self) -> dict:
        return dict(self)

    def __deepcopy__(self, memo: dict) -> dict:
        return {k: _thaw(v) for k, v in self.items()}

    def __reduce__(self) -> tuple:
        return (dict, (dict(self),))


def freeze(value: Any) -> Any:
    """A read-only copy of JSON data ``value`` (scalars, lists, dicts, tuples).

    Raises:
        NotFreezable: ``value`` holds anything else (a set, an object...).
    """
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        items = [freeze(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else FrozenList(items)
    if isinstance(value, dict):
        return FrozenDict((k, freeze(v)) for k, v in value.items())
    raise NotFreezable(f"{type(value).__name__} is not JSON data")


def _thaw(value: Any) -> Any:
    """An ordinary, changeable deep copy of a frozen value."""
    if isinstance(value, list):
        return [_thaw(v) for v in value]
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_thaw(v) for v in value)
    return value
