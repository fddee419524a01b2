"""Base classes every component builds on.

A component type is a :class:`ComponentBase` subclass with a ``...Param`` class
(defaults in ``__init__``, validation in ``check()``) and an ``_invoke()``. The public
:meth:`ComponentBase.invoke` does the bookkeeping every type shares: clearing the
previous outputs, retries, ``exception_method`` handling and timing.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from agent import jsonio
from agent.errors import Cancelled, ComponentError, DSLError, FormPause, LimitError
from agent.frozen import NotFreezable, freeze, refuse_change
from agent.memo import BoundedMemo
from agent.refs import Ref, find_refs, parse_ref

if TYPE_CHECKING:
    from agent.canvas import Canvas


class ComponentParamBase:
    """Params shared by every component (RAGFlow's common params).

    Subclasses set their own defaults in ``__init__`` after calling ``super()`` and
    validate in :meth:`check`, raising ``ValueError`` with a message that says what to
    fix; the loader adds the component id. Params the class does not know are kept as
    attributes too (RAGFlow's editor writes extra ones), never rejected.
    """

    def __init__(self) -> None:
        self.inputs: Any = {}
        self.outputs: Any = {}
        self.description = ""
        self.max_retries = 0
        self.delay_after_error = 2.0
        self.exception_method: str | None = None
        self.exception_default_value: Any = None
        self.exception_goto: list[str] | None = None

    def update(self, conf: dict) -> ComponentParamBase:
        # A private copy: check() may normalise params in place, and the DSL the
        # snapshot writes back must stay as it was given. Params are JSON data, so a
        # JSON round trip copies them (several times faster than deepcopy).
        for key, value in jsonio.loads(jsonio.dumps(conf)).items():
            setattr(self, key, value)
        return self

    def check(self) -> None:
        """Validate; raise ``ValueError`` naming the param and the fix."""

    def warn(self, message: str) -> None:
        """Note a load-time warning from :meth:`check`: something RAGFlow accepts at load
        and only meets at run time (the canvas reports it with the component id)."""
        self.__dict__.setdefault("_load_warnings", []).append(message)

    def check_common(self) -> None:
        self.check_nonnegative_int("max_retries")
        self.check_number("delay_after_error", minimum=0)
        method = self.exception_method
        if method not in (None, "", "comment", "goto", "default"):
            raise ValueError(f"exception_method {method!r} is not one of none, 'comment', 'goto'")
        if method == "goto":
            goto = self.exception_goto
            if not goto or not isinstance(goto, list):
                raise ValueError("exception_method 'goto' needs exception_goto, a list of component ids")

    # Small validators used by the subclasses' check().
    def check_nonnegative_int(self, name: str, maximum: int | None = None) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a whole number ≥ 0, got {value!r}")
        if maximum is not None and value > maximum:
            raise ValueError(f"{name} must be at most {maximum}, got {value!r}")

    def check_number(self, name: str, minimum: float | None = None, maximum: float | None = None) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if minimum is not None and value < minimum:
            raise ValueError(f"{name} must be ≥ {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            raise ValueError(f"{name} must be ≤ {maximum}, got {value!r}")

    def check_choice(self, name: str, choices: tuple | list) -> None:
        value = getattr(self, name)
        if value not in choices:
            raise ValueError(f"{name} {value!r} is not one of {', '.join(map(repr, choices))}")

    def check_list(self, name: str, allow_empty: bool = True) -> None:
        value = getattr(self, name)
        if not isinstance(value, list) or (not allow_empty and not value):
            raise ValueError(f"{name} must be a {'non-empty ' if not allow_empty else ''}list, got {value!r}")


# (component class, params JSON) -> (the checked params, read-only and shared; their load warnings)
_CHECKED = BoundedMemo(4096)
# param class -> its read-only variant (see _share)
_READ_ONLY: dict[type, type] = {}
_READ_ONLY_CLASSES: set[type] = set()


def checked_param(
    cls: type[ComponentBase],
    params: dict,
    label: str,
    warnings: list[str] | None = None,
    key: tuple | None = None,
) -> ComponentParamBase:
    """``cls``'s param object built from DSL ``params`` and validated.

    The warnings ``check()`` noted are added to ``warnings`` (each prefixed with
    ``label``). With ``key`` (``(cls, the params as JSON)``; worked out here when not
    given), the checked params are built once per process and the same object is
    handed to every canvas that loads the same params (every turn of every session of
    an agent): it is read-only (:mod:`agent.frozen`), so no session can change what
    another reads. Params ``check()`` turned into something other than JSON data are
    built and checked every time instead.

    Raises:
        DSLError: naming ``label`` (the component id) and what to fix.
    """
    if key is None:
        try:
            key = (cls, jsonio.dumps(params))
        except (TypeError, ValueError):
            key = None
    hit = _CHECKED.get(key) if key is not None else None
    if hit is not None:
        param, noted = hit
    else:
        param = cls.param_class().update(params)
        try:
            param.check_common()
            param.check()
        except ValueError as e:
            raise DSLError(f"{label}: {e}") from None
        noted = tuple(param.__dict__.pop("_load_warnings", []))
        if key is not None:
            try:
                param = _share(param)
            except NotFreezable:
                pass
            else:
                _CHECKED.put(key, (param, noted))
    if warnings is not None:
        warnings.extend(f"{label}: {w}" for w in noted)
    return param


def is_shared(param: ComponentParamBase) -> bool:
    """Whether ``param`` is the read-only object every canvas with these params shares."""
    return type(param) in _READ_ONLY_CLASSES


def _share(param: ComponentParamBase) -> ComponentParamBase:
    """A read-only copy of checked ``param``: its values frozen, its attributes fixed."""
    values = {name: freeze(value) for name, value in vars(param).items()}
    cls = type(param)
    read_only = _READ_ONLY.get(cls)
    if read_only is None:
        read_only = _READ_ONLY[cls] = type(
            cls.__name__, (cls,), {"__setattr__": refuse_change, "__delattr__": refuse_change}
        )
        _READ_ONLY_CLASSES.add(read_only)
    shared = object.__new__(read_only)
    shared.__dict__.update(values)
    return shared


class ComponentBase:
    """One node of a canvas.

    Class attributes:
        component_name: the DSL's ``component_name`` (matched case-insensitively).
        param_class: the ``...Param`` class.
        bare_ref_params: names of params holding a bare reference (no braces).
        is_form: the component may pause the run for user input.
        side_effect_free: the component only reads the run's state and computes: no
            network, database, file or process, nothing that waits. A server may run
            such components before it takes the session's lease (a turn made only of
            them commits once, see :mod:`api.services.turns`); it takes the lease
            before the first component that is not.

    Instance state that survives a snapshot: ``outputs`` (what references read) and
    ``data`` (the component's own bookkeeping, e.g. a form's partial answers).
    """

    component_name: ClassVar[str] = ""
    param_class: ClassVar[type[ComponentParamBase]] = ComponentParamBase
    bare_ref_params: ClassVar[tuple[str, ...]] = ()
    is_form: ClassVar[bool] = False
    side_effect_free: ClassVar[bool] = False
    #: The ``node_finished`` event waits until the component calls
    #: ``canvas.component_finished`` (a container whose body runs after it).
    finishes_later: ClassVar[bool] = False
    #: Attributes a component sets that its (shared, read-only) params alone decide,
    #: worked out once and then kept: a kept canvas's reload keeps them with the component.
    param_derived: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, canvas: Canvas, cpn_id: str, param: ComponentParamBase, entry: dict):
        # The canvas holds its components; a component reaches its canvas through a weak
        # proxy, so that a canvas is freed as soon as the last reference to it goes,
        # never left for the cyclic collector with its whole state (every turn's).
        try:
            self._canvas = weakref.proxy(canvas)
        except TypeError:  # a proxy already (a component an Agent builds for a tool)
            self._canvas = canvas
        self.id = cpn_id
        self._param = param
        self.entry = entry  # the DSL entry: downstream, upstream, parent_id
        self.clear()

    def clear(self) -> None:
        """Back to what the constructor made: everything a run or a snapshot set is gone."""
        self.outputs: dict[str, Any] = {}
        self.data: dict[str, Any] = {}
        self.inputs_seen: dict[str, Any] = {}
        self.usage: dict[str, int] | None = None
        self._next: list[str] | None = None
        self.error: str | None = None

    # -- wiring -----------------------------------------------------------------------
    @property
    def downstream(self) -> list[str]:
        return list(self.entry.get("downstream") or [])

    @property
    def upstream(self) -> list[str]:
        return list(self.entry.get("upstream") or [])

    @property
    def parent_id(self) -> str | None:
        return self.entry.get("parent_id") or None

    def possible_next(self) -> list[str]:
        """Every id this component may route to (for reachability checks)."""
        ids = list(self.downstream)
        if self._param.exception_method == "goto":
            ids += list(self._param.exception_goto or [])
        return ids

    def lenient_routes(self) -> dict[str, str]:
        """Targets of :meth:`possible_next` whose absence is only a load-time warning
        (``{id: which branch}``); the component fails when it takes such a branch."""
        return {}

    def fallback_next(self) -> list[str] | None:
        """Where to go when a failure is replaced by the default value; ``None`` means
        ``downstream``. A branching component names its else branch, so a failure
        never runs every branch."""
        return None

    def next_ids(self) -> list[str]:
        """Where the run goes after this component ran (``_next`` when it chose)."""
        return list(self._next) if self._next is not None else self.downstream

    def references(self) -> list[Ref]:
        """Every reference in the params, braced or bare (for load-time checks)."""
        refs = find_refs(vars(self._param))
        for name in self.bare_ref_params:
            refs.extend(_bare_refs(getattr(self._param, name, None)))
        return refs

    # -- running ----------------------------------------------------------------------
    def invoke(self, **kwargs: Any) -> Iterator[str] | None:
        """Run once: retries, ``exception_method`` and timing around ``_invoke``.

        The one retry loop (``max_retries`` more attempts, ``delay_after_error`` apart,
        waiting through ``canvas.sleep``, which obeys the turn's deadline and cancel).
        When ``_invoke`` returns a stream its first chunk is read here, so a stream that
        fails before showing anything is retried like any failure; once a chunk was
        shown, a failure goes to :meth:`handle_failure` (the canvas calls it).

        Returns ``None``, or an iterator of text chunks the canvas streams as
        ``message`` events. An LLM client's own retries of HTTP 429/5xx are a separate
        layer below this one (see :mod:`agent.llm.client`).
        """
        self.outputs = {}
        self.inputs_seen = {}
        self.usage = None
        self._next = None
        self.error = None
        retries = self._param.max_retries or 0  # a whole number (checked with the params)
        attempt = 0
        while True:
            try:
                chunks = self._invoke(**kwargs)
                return None if chunks is None else _started(chunks)
            except (FormPause, Cancelled, LimitError):
                raise
            except Exception as e:  # noqa: BLE001 - every failure is handled below
                if attempt < retries and getattr(e, "retryable", True):
                    attempt += 1
                    self._canvas.sleep(float(self._param.delay_after_error or 0))
                    continue
                return self.handle_failure(e)

    def handle_failure(self, e: Exception) -> None:
        """Apply ``exception_method`` to a failure, or raise it as a ``ComponentError``."""
        message = str(e) if isinstance(e, ComponentError) else f"{type(e).__name__}: {e}"
        method = self._param.exception_method
        if method == "goto":
            self.error = message
            self.outputs = {"_ERROR": message}
            self._next = list(self._param.exception_goto or [])
            return None
        if method in ("comment", "default"):
            self.error = message
            self.outputs = {"_ERROR": message, "content": self._param.exception_default_value}
            self._next = self.fallback_next()
            return None
        try:
            if isinstance(e, ComponentError):
                if message.split(": ", 1)[0] not in self._canvas.components:
                    e.args = (f"{self.id}: {message}", *e.args[1:])  # say which component failed
                raise e
            raise ComponentError(f"{self.id}: {message}") from e
        finally:
            # This frame is on the raised error's traceback: holding the error too, it
            # would make a cycle that keeps the error, and the canvas its frames hold,
            # alive until the cyclic collector runs.
            del e

    def _invoke(self, **kwargs: Any) -> Iterator[str] | None:
        raise NotImplementedError

    def output(self, key: str | None = None) -> Any:
        return self.outputs if key is None else self.outputs.get(key)

    def set_output(self, key: str, value: Any) -> None:
        self.outputs[key] = value

    def stream_done(self, text: str) -> None:
        """Called by the canvas after it streamed this component's chunks."""
        self.outputs["content"] = text

    def reset(self) -> None:
        """Forget outputs and bookkeeping (a new conversation)."""
        self.outputs = {}
        self.data = {}
        self._next = None
        self.error = None

    # -- helpers for subclasses -------------------------------------------------------
    def get_value(self, ref: str | Ref) -> Any:
        value = self._canvas.get_value(ref)
        return value

    def render(self, template: Any) -> str:
        return self._canvas.render(template)

    def render_value(self, template: Any) -> Any:
        return self._canvas.render_value(template)

    def fail(self, message: str, retryable: bool = True) -> ComponentError:
        """An error naming this component, to ``raise``; ``retryable=False`` for a
        failure that trying again cannot fix (``max_retries`` then does not wait)."""
        return ComponentError(f"{self.id}: {message}", retryable=retryable)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}>"


def _started(chunks: Iterator[str]) -> Iterator[str]:
    """``chunks`` with its first non-empty chunk already read (errors before it raise now)."""
    chunks = iter(chunks)
    for chunk in chunks:
        if chunk:
            return itertools.chain((chunk,), chunks)
    return iter(())


def _bare_refs(value: Any) -> list[Ref]:
    out: list[Ref] = []
    if isinstance(value, str):
        ref = parse_ref(value)
        if ref is not None:
            out.append(ref)
    elif isinstance(value, list):
        for v in value:
            out.extend(_bare_refs(v))
    elif isinstance(value, dict):
        for v in value.values():
            out.extend(_bare_refs(v))
    return out
