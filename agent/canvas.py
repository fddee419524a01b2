"""The Canvas: one DSL blob, run along its path, serialized back whole.

    canvas = Canvas(dsl)                  # str or dict; raises DSLError
    for event in canvas.run(query="hi"):  # events of docs/design.md §4
        ...
    text = str(canvas)                    # the whole snapshot; Canvas(text) continues

The snapshot is the DSL plus runtime state: ``path`` (what is pending), ``history``
(bounded), ``globals`` (``sys.*`` and the conversation variables ``env.*``),
``state`` (component outputs and bookkeeping that the pending path can still read)
and ``turn`` (the turn a paused form belongs to). Keys the runtime does not know are
kept as they are, so a RAGFlow export round-trips.

Turn semantics chosen here (see README "Runtime semantics"):

* A run that fails or is cancelled leaves the state exactly as it was before the
  run (so a paused form can be resumed again); the error is on the terminal event.
* At the end of a successful turn the path and the outputs are cleared, except
  Begin's (its inputs hold for the conversation), so the snapshot does not grow.
* A fan-out (several ``downstream``) runs the branches one after another; a
  component already waiting on the path is not queued twice (joins run once).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import re
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

from agent import files as agent_files
from agent import jsonio, telemetry
from agent.component import ComponentBase, component_class, component_names
from agent.component.base import ComponentParamBase, checked_param, is_shared
from agent.deadline import Deadline, unlimited
from agent.errors import (
    Cancelled,
    CanvasError,
    ComponentError,
    DSLError,
    FormPause,
    InputError,
    LimitError,
    SnapshotTooLarge,
    UsageError,
)
from agent.forms import check_answers, value_size
from agent.frozen import FrozenList
from agent.limits import Limits
from agent.memo import BoundedMemo
from agent.refs import Ref, descend, parse_ref, sole_ref
from agent.stream import LazyText
from agent.templates import check_template, render, render_stream, render_value
from agent.variables import declared_variables

log = logging.getLogger("agentcanvas.canvas")

SNAPSHOT_VERSION = 1
REQUIRED_KEYS = ("components", "path", "history", "retrieval")
DEFAULT_GLOBALS = {"sys.query": "", "sys.user_id": "", "sys.conversation_turns": 0, "sys.files": []}
_RUNTIME_KEYS = ("path", "history", "retrieval", "memory", "globals", "state", "turn")
#: ``[ID:n]``: how an answer cites the n-th chunk found in its turn.
CITATION_RE = re.compile(r"\[ID:\s*(\d+)\]")
#: Found chunks kept in the snapshot per turn.
MAX_RETRIEVAL_CHUNKS = 32


def _check_runtime_keys(dsl: dict) -> None:
    for key in ("path", "history"):
        if not isinstance(dsl[key], list):
            raise DSLError(f"{key!r} must be a list")
    if not isinstance(dsl["retrieval"], (list, dict)):
        # RAGFlow writes a list, or {"chunks": [], "doc_aggs": []}.
        raise DSLError("'retrieval' must be a list or an object")
    if not isinstance(dsl.get("globals"), dict):
        raise DSLError("'globals' must be an object")


class _Blueprint:
    """What a canvas works out from its components alone, shared by every canvas
    loaded from the same components (see :meth:`Canvas._build_components`).

    Attributes:
        params: ``{component id: (class, the read-only checked params)}``; ``None``
            for params that cannot be shared (checked by every canvas).
        warnings: the load warnings.
        refs: ``{component id: its references}``, filled as they are asked for.
        kept: ``{pending path: ids of the components whose outputs a pause keeps}``.
    """

    def __init__(self) -> None:
        self.params: dict[str, tuple[type[ComponentBase], ComponentParamBase | None]] = {}
        self.warnings: tuple[str, ...] = ()
        self.refs: dict[str, tuple[Ref, ...]] = {}
        self.kept: dict[tuple[str, ...], frozenset[str]] = {}


#: Pending paths per blueprint whose kept outputs are remembered.
MAX_KEPT_PATHS = 256
# The blueprints of the last few hundred DSLs: components' JSON and declared variables -> _Blueprint.
_BLUEPRINTS = BoundedMemo(256)


def _length(text: str | bytes) -> int:
    """The characters of ``text``, or of the text UTF-8 ``bytes`` encode."""
    return len(text) if isinstance(text, str) else len(text.decode("utf-8", "surrogateescape"))


def _too_long(text: str | bytes, limit: int) -> bool:
    """Whether ``text`` (see :func:`_length`) has more than ``limit`` characters; UTF-8 is
    decoded only when it has more than ``limit`` bytes (a character takes one or more)."""
    return len(text) > limit and _length(text) > limit


@functools.lru_cache(maxsize=1)
def _utc_text(second: int) -> str:
    """``sys.date``: the time as UTC text (worked out once a second)."""
    return datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


_time = time.time
_monotonic = time.monotonic


def _migrate(dsl: dict) -> dict:
    """Bring an older snapshot to :data:`SNAPSHOT_VERSION` (in place)."""
    version = dsl.get("v", 0)
    if not isinstance(version, int) or version > SNAPSHOT_VERSION:
        raise DSLError(
            f"snapshot format v={version!r} is newer than this agentcanvas understands "
            f"(v{SNAPSHOT_VERSION}); upgrade agentcanvas"
        )
    if version < 1:
        # v0 is a plain RAGFlow DSL: runtime keys may be missing; history may hold
        # more than we keep. Nothing else changes shape.
        dsl.setdefault("memory", [])
        dsl.setdefault("globals", {})
        dsl.setdefault("variables", {})
        dsl["v"] = 1
    return dsl


class Canvas:
    """A loaded canvas. See the module docstring.

    Args:
        dsl: the DSL or snapshot, as JSON text or a dict (the dict is copied).
        limits: run and size limits; defaults to docs/design.md §11's.
        services: objects the host provides to components (e.g. ``"llm"``,
            ``"memory_store"``); the runtime itself needs none.

    Attributes:
        cancel_check: a callable that says whether the run was cancelled; the run
            loop and every wait in a turn ask it (through ``deadline``).
        deadline: while a turn runs, its :class:`~agent.deadline.Deadline`
            (``max_seconds`` and the cancel flag); every component's waits obey it.
        sleep: how retries wait; by default ``deadline.sleep`` (wakes for a cancel,
            stops at the deadline). Tests may replace it.
        stop_before: for a run without trace (``run(trace=False)``), asked with each
            component before it runs: its ``node_started`` event is yielded only when
            this says so, the host's chance to act before the component runs (the turn
            service takes its lease there). ``None``: no ``node_started`` event.
        warnings: load-time warnings (e.g. unreachable components).
    """

    def __init__(
        self, dsl: str | bytes | dict, *, limits: Limits | None = None, services: dict | None = None
    ):
        self._start_fresh(limits, services)
        self._load(dsl)

    def _reload(
        self, parsed: dict, text: str | bytes, limits: Limits | None, services: dict | None
    ) -> Canvas:
        """This canvas (its components built from the same DSL) made equal to ``Canvas(text)``,
        ``parsed`` being the value ``text`` parses to (handed over): what
        :meth:`KeptCanvas.load` does, without parsing ``text`` or building the canvas anew.

        Everything a load sets is set again; a component is kept as an object only if a
        load would build it the same way (the base class's constructor, shared read-only
        params) and a run added nothing to it but what its params alone decide (its
        ``param_derived`` attributes), and is then cleared (what a run set is gone); any
        other is built anew, as a load builds it.
        """
        # keep() started the canvas fresh (without services) when it handed it over.
        self.limits = limits or Limits()
        self.services = dict(services or {})
        self._pristine, self._plain = text, True
        if _too_long(text, max(self.limits.max_dsl_bytes, self.limits.max_snapshot_bytes)):
            raise DSLError(f"the DSL is {_length(text)} bytes; the limit is {self.limits.max_dsl_bytes}")
        _check_runtime_keys(parsed)
        self.dsl = parsed
        # What a run added to a component is counted, not compared as sets (a set comparison
        # per component was a twentieth of a turn's canvas): the constructor's attributes
        # are all there (nothing removes them; clear() sets the run's ones again), so any
        # more, but for the class's param_derived ones (none of them the constructor's),
        # were added by a run.
        plain = len(_component_attrs())
        for cid, cpn in self.components.items():
            cls, param = type(cpn), cpn._param
            attrs = vars(cpn)
            added = len(attrs) - plain
            for name in cls.param_derived:
                added -= name in attrs
            if not added and cls.__init__ is ComponentBase.__init__ and is_shared(param):
                cpn.clear()  # its canvas (this one), id, params and DSL entry are the same
            else:
                if not is_shared(param):
                    param = checked_param(cls, cpn.entry["obj"].get("params") or {}, cid)
                self.components[cid] = cls(self, cid, param, cpn.entry)
        self.warnings = list(self._blueprint.warnings)
        self._take_state(parsed)
        return self

    def _start_fresh(self, limits: Limits | None, services: dict | None) -> None:
        """Everything a canvas holds that is not its snapshot (set before it is loaded)."""
        self.limits = limits or Limits()
        self.services: dict[str, Any] = dict(services or {})
        self.cancel_check: Callable[[], bool] | None = None
        self.stop_before: Callable[[ComponentBase], bool] | None = None
        self._file_markers: dict[str, dict] | None = None
        #: The form answers the last ``run()`` accepted, converted to their types.
        self.accepted_inputs: dict = {}
        #: The files the last ``run()`` took with its message (descriptors with a file service).
        self.accepted_files: list = []
        self.deadline: Deadline = unlimited()
        self.warnings: list[str] = []
        self._written: tuple[bytes | str, dict, bytes | str] | None = None

    # ------------------------------------------------------------------ loading
    def _load(self, dsl: str | bytes | dict, text: str | None = None) -> None:
        """Load ``dsl``; ``text``: the JSON text the dict ``dsl`` was parsed from (then
        ``dsl`` is taken over as it is, not copied)."""
        # The text a canvas was loaded from is the rollback point of its first run,
        # so a turn that succeeds never pays for a copy of the state.
        self._pristine: str | bytes | None = dsl if isinstance(dsl, (str, bytes)) else text
        # Whether the loaded values are plain JSON (see keep()).
        self._plain = text is not None
        if isinstance(self._pristine, (str, bytes)):
            if _too_long(self._pristine, max(self.limits.max_dsl_bytes, self.limits.max_snapshot_bytes)):
                raise DSLError(
                    f"the DSL is {_length(self._pristine)} bytes; the limit is {self.limits.max_dsl_bytes}"
                )
        if isinstance(dsl, (str, bytes)):
            try:
                dsl, self._plain = jsonio.loads_plain(dsl)
            except ValueError as e:
                raise DSLError(f"the DSL is not valid JSON: {e}") from None
        elif text is None:
            dsl = copy.deepcopy(dsl)
        if not isinstance(dsl, dict):
            raise DSLError(f"the DSL must be a JSON object, got {type(dsl).__name__}")
        if "dsl" in dsl and "components" not in dsl and isinstance(dsl["dsl"], dict):
            dsl = dsl["dsl"]  # a RAGFlow export wraps the DSL with title etc.
        missing = [k for k in REQUIRED_KEYS if k not in dsl]
        if missing:
            raise DSLError(f"the DSL lacks required key(s) {', '.join(map(repr, missing))}")
        dsl = _migrate(dsl)
        components = dsl["components"]
        if not isinstance(components, dict):
            raise DSLError("'components' must be an object of {id: component}")
        if len(components) > self.limits.max_components:
            raise DSLError(
                f"the DSL has {len(components)} components; the limit is {self.limits.max_components}"
            )
        _check_runtime_keys(dsl)
        self.variables = _declared_variables(dsl.get("variables"))

        self.dsl = dsl
        # (the components, their JSON): see _dumps(); a reload keeps it with the DSL.
        self._components_json: tuple[dict, bytes] | None = None
        # The history's JSON as the last dump wrote it (see _dumps()); kept by a reload too.
        self._history_written: _WrittenHistory | None = None
        self._build_components(components)
        self._take_state(dsl)

    def _take_state(self, dsl: dict) -> None:
        """The run's state from the loaded snapshot ``dsl`` (the components are built)."""
        self.path: list[str] = dsl["path"]
        for cid in self.path:
            if cid not in self.components:
                raise DSLError(f"'path' names unknown component {cid!r}")
        self.history: list = dsl["history"]
        self.retrieval: list | dict = dsl["retrieval"]
        # Per-node conversation memory {node_id: [entries]} (agent/memory.py). RAGFlow
        # writes a list of its own tool-call summaries here; nothing of it carries over.
        memory = dsl.get("memory")
        self.memory: dict = memory if isinstance(memory, dict) else {}
        # Keyed-memory writes of this turn {(node_id, key): [entries]}; the host
        # commits them with the turn (agent/memory.py). Never part of the snapshot.
        self.memory_writes: dict = {}
        # Ids of the RAGFlow Memories a Message asked this turn's exchange to be saved
        # into (its ``memory_ids``); the host saves it after a successful turn.
        self.memory_saves: list[str] = []
        self.globals: dict = dsl["globals"]
        self._default_globals()
        self._restore_component_state(dsl.get("state") or {})
        self.turn: dict | None = dsl.get("turn")

    def _default_globals(self) -> None:
        """Fill in the ``sys.*`` defaults and the declared variables' initial values."""
        g = self.globals
        for key, value in DEFAULT_GLOBALS.items():
            if key not in g:
                g[key] = copy.deepcopy(value)
        for name, var in self.variables.items():
            if f"env.{name}" not in g:
                g[f"env.{name}"] = copy.deepcopy(var.get("value"))

    def _build_components(self, components: dict) -> None:
        """The components, from the blueprint of these components when one is known.

        A session's snapshot carries the same components turn after turn, and every
        session of an agent the same ones: their checked params, load warnings and
        references are worked out once per process (for the last few hundred DSLs,
        keyed by the components' JSON text and the declared variables) and shared,
        read-only, by every canvas built from them. Each canvas still has its own
        component objects: what a run changes (outputs, bookkeeping) is never shared.
        """
        declared = sorted(k for k in self.dsl["globals"] if k.startswith("env.")) + sorted(self.variables)
        try:
            key = jsonio.dumps([components, declared])
        except (TypeError, ValueError):
            key = None
        blueprint = _BLUEPRINTS.get(key) if key is not None else None
        if blueprint is not None:
            self._blueprint = blueprint
            self.components = {}
            for cid, entry in components.items():
                cls, param = blueprint.params[cid]
                if param is None:  # not shareable: checked afresh
                    param = checked_param(cls, entry["obj"].get("params") or {}, cid)
                self.components[cid] = cls(self, cid, param, entry)
            self.warnings = list(blueprint.warnings)
            return
        self._blueprint = blueprint = _Blueprint()
        self.components = {}
        for cid, entry in components.items():
            cpn = self.components[cid] = self._build_component(cid, entry)
            blueprint.params[cid] = (type(cpn), cpn._param if is_shared(cpn._param) else None)
        if "begin" not in self.components:
            raise DSLError("the DSL has no 'begin' component; every canvas starts at id 'begin'")
        self._check_wiring()
        self._check_references()
        self._find_unreachable()
        blueprint.warnings = tuple(self.warnings)
        if key is not None:
            _BLUEPRINTS.put(key, blueprint)

    def _build_component(self, cid: str, entry: Any) -> ComponentBase:
        if not isinstance(entry, dict) or not isinstance(entry.get("obj"), dict):
            raise DSLError(f"{cid}: a component entry needs 'obj' with 'component_name' and 'params'")
        name = entry["obj"].get("component_name")
        cls = component_class(name) if isinstance(name, str) else None
        if cls is None:
            raise DSLError(
                f"{cid}: unknown component type {name!r}; known types: {', '.join(component_names())}"
            )
        params = entry["obj"].get("params") or {}
        if not isinstance(params, dict):
            raise DSLError(f"{cid}: 'params' must be an object")
        for key in ("downstream", "upstream"):
            if not isinstance(entry.get(key, []), list):
                raise DSLError(f"{cid}: {key!r} must be a list of component ids")
        return cls(self, cid, checked_param(cls, params, cid, self.warnings), entry)

    def references_of(self, cid: str) -> list[Ref]:
        """The references in component ``cid``'s params (worked out once per blueprint)."""
        refs = self._blueprint.refs.get(cid)
        if refs is None:
            refs = self._blueprint.refs[cid] = tuple(self.components[cid].references())
        return list(refs)

    def _check_wiring(self) -> None:
        for cid, cpn in self.components.items():
            for key in ("downstream", "upstream"):
                for other in cpn.entry.get(key) or []:
                    if other not in self.components:
                        raise DSLError(
                            f"{cid}: {key} names missing component {other!r}; add it or remove the link"
                        )
            lenient = cpn.lenient_routes()
            for other in cpn.possible_next():
                if other in self.components:
                    continue
                if other not in lenient:
                    raise DSLError(f"{cid}: routes to missing component {other!r}")
                # RAGFlow meets this only if the branch runs: a warning now, an error then.
                self.warnings.append(
                    f"{cid}: {lenient[other]} routes to missing component {other!r}; "
                    f"the run fails if that branch is taken"
                )
            parent = cpn.parent_id
            if parent is not None and parent not in self.components:
                raise DSLError(f"{cid}: parent_id names missing component {parent!r}")

    def _check_references(self) -> None:
        declared_env = {k for k in self.dsl["globals"] if k.startswith("env.")}
        declared_env |= {f"env.{n}" for n in self.variables}
        for cid, cpn in self.components.items():
            for ref in self.references_of(cid):
                if ref.scope == "cpn" and ref.name not in self.components:
                    raise DSLError(f"{cid}: reference {{{ref.text}}} names unknown component {ref.name!r}")
                if ref.scope == "env" and ref.name not in declared_env:
                    raise DSLError(
                        f"{cid}: reference {{{ref.text}}} names undeclared variable {ref.name!r}; "
                        f"declare it under 'variables'"
                    )
            for value in _strings(vars(cpn._param)):
                try:
                    check_template(value)
                except DSLError as e:
                    raise DSLError(f"{cid}: {e}") from None

    def _find_unreachable(self) -> None:
        children: dict[str, list[str]] = {}
        for cid, cpn in self.components.items():
            if cpn.parent_id:
                children.setdefault(cpn.parent_id, []).append(cid)
        seen, todo = set(), ["begin"]
        while todo:
            cid = todo.pop()
            if cid in seen:
                continue
            seen.add(cid)
            todo.extend(n for n in self.components[cid].possible_next() if n in self.components)
            todo.extend(children.get(cid, []))
        for cid in self.components:
            if cid not in seen:
                message = f"{cid}: no path from 'begin' reaches this component"
                self.warnings.append(message)
                log.warning(message)

    def _restore_component_state(self, state: dict) -> None:
        for cid, st in state.items():
            cpn = self.components.get(cid)
            if cpn is None:
                raise DSLError(f"snapshot state names unknown component {cid!r}")
            cpn.outputs = dict(st.get("outputs") or {})
            cpn.data = dict(st.get("data") or {})

    # ------------------------------------------------------------------ snapshot
    def to_dict(self) -> dict:
        """The whole snapshot as a JSON-ready dict."""
        out = dict(self.dsl)
        out["v"] = SNAPSHOT_VERSION
        out["path"] = self.path
        out["history"] = self.history
        out["retrieval"] = self.retrieval
        out["memory"] = self.memory
        out["globals"] = self.globals
        state = {}
        for cid, cpn in self.components.items():
            st = {}
            if cpn.outputs:
                st["outputs"] = {
                    k: (v.text if isinstance(v, LazyText) else v) for k, v in cpn.outputs.items()
                }
            if cpn.data:
                st["data"] = cpn.data
            if st:
                state[cid] = st
        out["state"] = state
        if self.turn:
            out["turn"] = self.turn
        else:
            out.pop("turn", None)
        return out

    def __str__(self) -> str:
        return self.dump()

    def dump(self, keepable: bool = False) -> str:
        """The snapshot's text (``str(canvas)``). ``keepable``: the state a run changes is
        written again on its own (a small part of the snapshot), so that :meth:`keep`
        can take it."""
        text = self.dump_utf8(keepable)
        if isinstance(text, str):
            return text
        decoded = text.decode("utf-8")
        if self._written is not None:
            self._written = (decoded, *self._written[1:])
        return decoded

    def dump_utf8(self, keepable: bool = False) -> bytes | str:
        """:meth:`dump`'s text as a database stores it: its UTF-8 bytes where orjson wrote
        it, without making the text (a non-ASCII text costs more to encode than to
        write); else the text, as the standard library wrote it (it may hold a lone
        surrogate, which UTF-8 cannot encode)."""
        snapshot = self.to_dict()
        self._written = None
        text, plain, rest = self._dumps(snapshot)
        if _too_long(text, self.limits.max_snapshot_bytes):
            raise SnapshotTooLarge(
                f"the session snapshot is {_length(text)} bytes; the limit is {self.limits.max_snapshot_bytes} "
                f"(lower history_size or the memory window, or raise max_snapshot_bytes)"
            )
        if keepable and plain:
            # For keep(): the snapshot, and the JSON of the state a run changes as the text
            # has it: the members after the components and the history, as written (the
            # DSL's other members among them parse to what the DSL holds), else on its own.
            if rest is None:
                rest = jsonio.dumps({k: snapshot[k] for k in _KEPT_AS_TEXT if k in snapshot})
            self._written = (text, snapshot, rest)
        return text

    def _dumps(self, snapshot: dict) -> tuple[bytes | str, bool, bytes | None]:
        """The text of ``snapshot`` (:meth:`to_dict`) as :func:`jsonio.dumps_plain` writes
        it, and whether orjson wrote it (then as its UTF-8 bytes). The JSON of the
        components is written once per canvas: a run never changes the DSL, so a kept
        canvas's next turns write the same components (a fifth of the snapshot); and the
        history's entries once each (see :func:`_history_json`), when the history follows
        the components.

        Returns:
            ``(text, plain, rest)``; ``rest``: the JSON object of the members other than
            the components and the history, when they were written apart, else ``None``.
        """
        if next(iter(snapshot)) != "components":  # written in their place by one call
            return self._dumps_whole(snapshot)
        components = snapshot["components"]
        written = self._components_json
        if written is None or written[0] is not components:
            inner = jsonio.dumps_utf8([components])  # at the depth they have in the snapshot
            if inner is None:
                return self._dumps_whole(snapshot)
            written = self._components_json = (components, inner[1:-1])
        rest = dict(snapshot)
        del rest["components"]
        history = b""
        if next(iter(rest), None) == "history":
            self._history_written = _history_json(rest["history"], self._history_written)
            if self._history_written is not None:
                history = self._history_written.text
                del rest["history"]
        tail = jsonio.dumps_utf8(rest)
        if tail is None:
            return self._dumps_whole(snapshot)
        # orjson writes an object as its members in order: the components first, then the rest's.
        parts = (b'{"components":', written[1], b',"history":' if history else b"", history)
        text = b"".join((*parts, b"," if len(tail) > 2 else b"", tail[1:]))
        return text, True, tail if history else None

    @staticmethod
    def _dumps_whole(snapshot: dict) -> tuple[bytes | str, bool, None]:
        """:meth:`_dumps` written by one call."""
        data = jsonio.dumps_utf8(snapshot)
        if data is not None:
            return data, True, None
        return (*jsonio.dumps_plain(snapshot), None)

    def keep(self, text: bytes | str) -> KeptCanvas | None:
        """This canvas as ``text`` holds it, ``text`` being its ``str()`` or its UTF-8 (just
        stored), to be loaded again without parsing ``text``: see :class:`KeptCanvas`. The canvas
        is handed over: it is not to be used after, but through the kept one's ``load()``.

        ``None`` when the canvas could differ from ``Canvas(text)``: ``text`` is not the
        last ``dump(keepable=True)`` or ``dump_utf8(keepable=True)`` of it, or that was not written by orjson (the
        standard library wrote it), or the canvas was loaded from JSON only the standard
        library reads (``NaN``...); or it holds a field this version does not know how
        to set again. The state a run changes is taken as its JSON (parsed again on
        load); the DSL and the history hold parsed JSON as they were loaded.
        """
        written = self._written
        if not self._plain or written is None or written[0] is not text:
            return None
        for entry in self.history[-2:]:  # the pair a run adds (built from text)
            if type(entry) is HistoryEntry:
                continue
            if (
                type(entry) is not list
                or len(entry) != 2
                or type(entry[0]) is not str
                or type(entry[1]) is not str
            ):
                return None
        attrs = vars(self)  # counted, not compared as sets (see _reload): nothing removes one
        if len(attrs) - ("_finished_late" in attrs) - ("_started_late" in attrs) != _loaded_attrs():
            return None
        _, snapshot, state = written
        kept = {**snapshot, "history": list(self.history)}
        self._start_fresh(self.limits, None)  # let go of the turn's services
        return KeptCanvas(text, self, kept, state)

    def _runtime_state(self) -> str | bytes:
        """A rollback point: the loaded text if nothing ran since, else a dump."""
        if self._pristine is not None:
            return self._pristine
        d = self.to_dict()
        return jsonio.dumps({k: d.get(k) for k in _RUNTIME_KEYS})

    def _restore_runtime_state(self, text: str | bytes) -> None:
        d, plain = jsonio.loads_plain(text)
        self._plain = self._plain and plain
        if "dsl" in d and "components" not in d:
            d = d["dsl"]
        self.path = d["path"]
        self.history = d["history"]
        self.retrieval = d["retrieval"]
        memory = d.get("memory")
        self.memory = memory if isinstance(memory, dict) else {}
        self.globals = d.get("globals") or {}
        self._default_globals()
        self.turn = d.get("turn")
        for cpn in self.components.values():
            cpn.outputs, cpn.data = {}, {}
        self._restore_component_state(d.get("state") or {})

    def reset(self) -> None:
        """Start a new conversation: path, history, outputs and variables back to the DSL's."""
        self.path = []
        self.history = []
        self.retrieval = []
        self.memory = {}
        self.memory_writes = {}
        self.memory_saves = []
        self.turn = None
        keep = {
            k: v
            for k, v in self.globals.items()
            if k in ("sys.user_id", "sys.conversation_id", "sys.agent_id")
        }
        self.globals = copy.deepcopy(DEFAULT_GLOBALS)
        self.globals.update(keep)
        for key in self.dsl["globals"]:
            if key.startswith("env."):
                self.globals.setdefault(key, None)
        for name, var in self.variables.items():
            self.globals[f"env.{name}"] = copy.deepcopy(var.get("value"))
        for cpn in self.components.values():
            cpn.reset()

    # ------------------------------------------------------------------ values
    def component(self, cid: str) -> ComponentBase:
        return self.components[cid]

    def get_value(self, ref: str | Ref) -> Any:
        """Resolve a reference (a :class:`Ref`, or text with or without braces)."""
        if isinstance(ref, str):
            parsed = parse_ref(ref)
            if parsed is None:
                raise ComponentError(f"{ref!r} is not a reference like {{cpn@var}}, {{sys.x}} or {{env.x}}")
            ref = parsed
        if ref.scope == "cpn":
            cpn = self.components.get(ref.name)
            if cpn is None:
                return None
            value = cpn.outputs.get(ref.var)
            if ref.path:
                if isinstance(value, LazyText):
                    value = value.text
                return descend(value, ref.path)
            return value
        if ref.name == "sys.history":
            value = [{"role": r, "content": c} for r, c in self.history]
        else:
            value = self.globals.get(ref.name)
        return descend(value, ref.path) if ref.path else value

    def set_value(self, ref: str | Ref, value: Any) -> None:
        """Write a variable: ``env.x``, ``sys.x`` or a component output (no sub-path)."""
        if isinstance(ref, str):
            parsed = parse_ref(ref)
            if parsed is None:
                raise ComponentError(f"{ref!r} is not a reference to a variable")
            ref = parsed
        if ref.path:
            raise ComponentError(f"cannot assign into {ref.text!r}; assign the whole variable")
        if ref.scope == "cpn":
            if ref.name not in self.components:
                raise ComponentError(f"{ref.text!r} names unknown component {ref.name!r}")
            self.components[ref.name].outputs[ref.var] = value
        else:
            self.globals[ref.name] = value

    def variable_type(self, name: str) -> str | None:
        """The declared type of conversation variable ``name`` (without ``env.``)."""
        var = self.variables.get(name)
        return var.get("type") if isinstance(var, dict) else None

    def render(self, template: Any) -> str:
        return render(template, self._text_value, self.deadline)

    def render_value(self, template: Any) -> Any:
        if isinstance(template, str) and "{" in template and sole_ref(template) is not None:
            return render_value(template, self.get_value)
        return render_value(template, self._text_value, self.deadline)

    def render_stream(self, template: Any) -> Iterator[str]:
        return render_stream(template, self._text_value, self.deadline)

    def _text_value(self, ref: Ref) -> Any:
        """A value as it reads inside text: files (a ``file`` field, ``sys.files``) read
        as their parsed text, as RAGFlow renders them into prompts (inside
        :meth:`files_as_markers`, documents as markers instead)."""
        value = self.get_value(ref)
        if not agent_files.is_file_list(value):
            return value
        service = self.services.get("files")
        if self._file_markers is not None and service is not None:
            parts = []
            for d in value:
                if agent_files.is_image(d):
                    parts.append(f"[image: {d.get('name')}]")
                else:
                    self._file_markers[str(d.get("id"))] = d
                    parts.append(agent_files.marker(d))
            return "\n\n".join(parts)
        return agent_files.render_files(value, service)

    @contextlib.contextmanager
    def files_as_markers(self) -> Iterator[dict[str, dict]]:
        """Render documents as markers (:data:`agent.files.MARKER_RE`), so that an LLM
        node can fit their text to its model's context; yields ``{id: descriptor}`` of
        the documents marked."""
        self._file_markers = marked = {}
        try:
            yield marked
        finally:
            self._file_markers = None

    def add_usage(self, usage: dict | None) -> None:
        """Add an LLM call's token usage to the running turn's total."""
        if not usage or self.turn is None:
            return
        total = self.turn.setdefault("usage", {})
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            total[key] = int(total.get(key, 0)) + int(usage.get(key, 0) or 0)

    # ------------------------------------------------------------------ references
    def add_references(self, chunks: list[dict]) -> list[int]:
        """Add chunks found this turn; returns the number each is cited by (``[ID:n]``).

        A chunk found twice in one turn keeps its first number. The chunks are kept
        with the turn (and, when it succeeds, in the snapshot's bounded ``retrieval``).
        """
        if self.turn is None:
            return list(range(len(chunks)))
        found = self.turn.setdefault("references", [])
        numbers = []
        for chunk in chunks:
            cid = chunk.get("id")
            known = next((i for i, c in enumerate(found) if cid and c.get("id") == cid), None)
            if known is None:
                found.append(_reference_chunk(chunk))
                known = len(found) - 1
            numbers.append(known)
        return numbers

    def turn_references(self) -> list[dict]:
        """The chunks found so far in this turn, in citation-number order."""
        return list((self.turn or {}).get("references") or [])

    def cited_reference(self, answer: str) -> dict | None:
        """``{chunks, doc_aggs}`` of exactly the chunks ``answer`` cites as ``[ID:n]``."""
        found = self.turn_references()
        if not found:
            return None
        cited: list[int] = []
        for m in CITATION_RE.finditer(answer or ""):
            n = int(m.group(1))
            if n < len(found) and n not in cited:
                cited.append(n)
        if not cited:
            return None
        chunks = [found[n] for n in sorted(cited)]
        aggs: dict[str, dict] = {}
        for chunk in chunks:
            agg = aggs.setdefault(
                chunk.get("document_id") or "",
                {
                    "doc_name": chunk.get("document_name") or "",
                    "doc_id": chunk.get("document_id") or "",
                    "count": 0,
                },
            )
            agg["count"] += 1
        return {"chunks": chunks, "doc_aggs": list(aggs.values())}

    def _keep_retrieval(self) -> None:
        """The turn's found chunks into the snapshot's ``retrieval``, bounded like history."""
        found = self.turn_references()
        if not found:
            return
        if not isinstance(self.retrieval, list):
            old = self.retrieval
            self.retrieval = (
                [old] if isinstance(old, dict) and (old.get("chunks") or old.get("doc_aggs")) else []
            )
        self.retrieval.append(
            {"message_id": self.turn.get("message_id", ""), "chunks": found[:MAX_RETRIEVAL_CHUNKS]}
        )
        overflow = len(self.retrieval) - self.limits.retrieval_size
        if overflow > 0:
            del self.retrieval[:overflow]

    # ------------------------------------------------------------------ forms
    def pending_form(self) -> ComponentBase | None:
        """The form component the run is paused at, if any (detected by type)."""
        if self.path and self.turn:
            cpn = self.components.get(self.path[0])
            if cpn is not None and cpn.is_form and cpn.data.get("pending"):
                return cpn
        return None

    # ------------------------------------------------------------------ running
    def run(
        self,
        query: str = "",
        user_id: str = "",
        inputs: dict | None = None,
        files: list | None = None,
        trace: bool = True,
        *,
        conversation_id: str | None = None,
        agent_id: str | None = None,
        invoke_from: str | None = None,
        webhook: dict | None = None,
        task_id: str | None = None,
        message_id: str | None = None,
        **ignored: Any,
    ) -> Iterator[dict]:
        """Run one turn (or resume a paused form); yields the events of docs/design.md §4.

        ``trace=False`` leaves out the ``node_finished`` events (their inputs and
        outputs made into JSON), for a caller that would drop them: a blocking turn;
        and the ``node_started`` events but those ``stop_before`` asks for.

        A new turn (not a resumed form) takes ``conversation_id``, ``agent_id`` and
        ``invoke_from`` into ``sys.*``, a ``webhook`` request as Begin's outputs, and its
        ``task_id`` and ``message_id`` (made up when not given); other keywords are ignored.
        The turn's keywords are named parameters: a keyword that lands in ``**`` costs a
        comparison with every parameter name first.

        Raises (before any state changes):
            InputError: ``inputs`` do not fit the pending form (or Begin's form).
            UsageError: ``inputs`` given with no form to take them.
        """
        if query is not None and not isinstance(query, str):
            raise UsageError(f"query must be text, got {type(query).__name__}")
        limit = self.limits.max_value_bytes
        # A text of n characters is at most 4n bytes: a short query needs no measuring.
        if files or (query and len(query) > limit // 4):
            oversized = _oversized({"query": query, "files": files}, limit)
            if oversized:
                raise InputError(_errors_message("the turn", oversized), oversized)
        pending = self.pending_form()
        if pending is not None:
            if files:
                raise UsageError(
                    "'files' go with a new message; a paused form takes files in its file fields"
                )
            form = pending.form()
            accepted, errors = check_answers(form, inputs, self.limits.max_value_bytes, self.resolve_files)
            self._check_file_totals(pending.file_fields(), accepted, [], errors)
            if errors:
                raise InputError(_errors_message(pending.id, errors), errors)
            return self._run(pending, accepted, trace)
        accepted, errors = {}, {}
        file_fields: frozenset[str] = frozenset()
        try:
            attached = self.resolve_files(files) if files else []
        except ValueError as e:
            attached, errors = [], {"files": str(e)}
        if inputs:
            begin = self.components["begin"]
            form = begin.form()
            if not form:
                raise UsageError("inputs were given but no form is pending and Begin declares no inputs")
            accepted, form_errors = check_answers(
                form, inputs, self.limits.max_value_bytes, self.resolve_files
            )
            errors.update(form_errors)
            file_fields = begin.file_fields()
        self._check_file_totals(file_fields, accepted, attached, errors)
        if errors:
            raise InputError(_errors_message("begin" if inputs else "the turn", errors), errors)
        files = attached if self.services.get("files") is not None else files
        ids = (conversation_id, agent_id, invoke_from, task_id, message_id)
        return self._run(None, accepted, trace, query or "", user_id, files, ids, webhook)

    # ------------------------------------------------------------------ files
    def resolve_files(self, refs: Any) -> list:
        """Descriptors for a ``files`` value or a ``file`` answer (ids or descriptors).

        With a file service (``services["files"]``) each file is looked up for this
        caller and checked against ``max_file_bytes``; without one the refs are kept
        as given. Raises ``ValueError`` with the reason (nothing is changed).
        """
        found = agent_files.file_refs(refs)
        service = self.services.get("files")
        if service is None or not found:
            return found
        descriptors = service.resolve(found)
        for d in descriptors:
            if int(d.get("size") or 0) > self.limits.max_file_bytes:
                raise ValueError(
                    f"{d.get('name')!r} is {d.get('size')} bytes; the limit is {self.limits.max_file_bytes} "
                    f"(max_file_bytes)"
                )
        return descriptors

    def _check_file_totals(
        self, file_fields: frozenset[str], accepted: dict, attached: list, errors: dict
    ) -> None:
        """Files per turn and per session, over everything this call brings in (``file_fields``:
        the keys of the answered form's file fields)."""
        if (not attached and not file_fields) or self.services.get("files") is None:
            return
        new = {"files": attached} if attached else {}
        for key, value in accepted.items():
            if key in file_fields and value:
                new[key] = value
        if not new:
            return
        earlier = len((self.turn or {}).get("files") or []) if self.pending_form() is not None else 0
        count = earlier + sum(len(v) for v in new.values())
        used = int(self.components["begin"].data.get("files_bytes") or 0)
        total = used + sum(int(d.get("size") or 0) for v in new.values() for d in v)
        for key in new:
            if count > self.limits.max_files_per_turn:
                errors.setdefault(
                    key,
                    f"{count} files in one turn; the limit is {self.limits.max_files_per_turn} "
                    f"(max_files_per_turn)",
                )
            elif total > self.limits.max_session_file_bytes:
                errors.setdefault(
                    key,
                    f"the session's files would reach {total} bytes; the limit is "
                    f"{self.limits.max_session_file_bytes} (max_session_file_bytes): start a new session",
                )

    def _take_files(self, accepted: dict, file_fields: frozenset[str], attached: list) -> None:
        """Record the files this call brought in: the turn's list, the session's total
        (``file_fields``: the keys of the answered form's file fields)."""
        if not attached and not file_fields:
            return
        new = list(attached)
        for key, value in accepted.items():
            if key in file_fields and isinstance(value, list):
                new.extend(value)
        new = [d for d in new if agent_files.is_descriptor(d)]
        if not new or self.turn is None:
            return
        have = self.turn.setdefault("files", [])
        known = {d.get("id") for d in have}
        have.extend(d for d in new if d.get("id") not in known)
        begin = self.components["begin"]
        begin.data["files_bytes"] = int(begin.data.get("files_bytes") or 0) + sum(
            int(d.get("size") or 0) for d in new
        )

    def turn_files(self) -> list[dict]:
        """The files of the running turn (attached and answered in forms), as descriptors."""
        return list((self.turn or {}).get("files") or [])

    def _event(self, name: str, data: dict, now: int | None = None) -> dict:
        """An event of docs/design.md §4; ``now``: its ``created_at`` when already read."""
        turn = self.turn
        event = {
            "event": name,
            "message_id": turn["message_id"] if turn else "",
            "created_at": int(_time()) if now is None else now,
            "task_id": turn["task_id"] if turn else "",
            "data": data,
        }
        session_id = self.globals.get("sys.conversation_id")
        if session_id:
            event["session_id"] = session_id
        return event

    def _start_turn(
        self, query: str, user_id: str, files: list | None, accepted: dict, ids: tuple, webhook: Any
    ) -> None:
        """``ids``: the turn's (conversation_id, agent_id, invoke_from, task_id, message_id)."""
        conversation_id, agent_id, invoke_from, task_id, message_id = ids
        message_id = str(message_id or uuid.uuid4())
        self.turn = {
            "message_id": message_id,
            "task_id": str(task_id or uuid.uuid4()),
            "query": query,
            "answer": "",
            "usage": {},
            "started_at": _time(),
        }
        g = self.globals
        turns = int(g.get("sys.conversation_turns") or 0) + 1
        g["sys.query"] = query
        if user_id:
            g["sys.user_id"] = user_id
        g["sys.files"] = list(files or [])
        g["sys.conversation_turns"] = turns
        g["sys.dialogue_count"] = turns
        g["sys.date"] = _utc_text(int(_time()))
        g["sys.message_id"] = message_id
        if conversation_id:
            g["sys.conversation_id"] = conversation_id
        if agent_id:
            g["sys.agent_id"] = agent_id
        if invoke_from:
            g["sys.invoke_from"] = invoke_from
        g.setdefault("sys.invoke_from", "api")
        begin = self.components["begin"]
        if accepted:
            begin.data["answers"] = {**begin.data.get("answers", {}), **accepted}
        if webhook is not None:
            begin.data["webhook"] = webhook  # the request that triggered a webhook run
        for cid, cpn in self.components.items():
            if cpn.outputs and cid != "begin":
                cpn.outputs = {}
        self.path = ["begin"]

    def _run(
        self,
        resume: ComponentBase | None,
        accepted: dict,
        trace: bool,
        query: str = "",
        user_id: str = "",
        files: list | None = None,
        ids: tuple = (None, None, None, None, None),
        webhook: Any = None,
    ) -> Iterator[dict]:
        """The run :meth:`run` returns: ``resume`` the paused form, or ``None`` for a new turn
        (see :meth:`_start_turn` for ``ids`` and ``webhook``)."""
        before = self._runtime_state()
        self._pristine = None
        self._finished_late: list[ComponentBase] = []
        self._started_late: dict[str, float] = {}
        self.accepted_inputs = dict(accepted)
        self.accepted_files = list(files or []) if resume is None else []
        started = _monotonic()
        deadline = self.deadline = Deadline(self.limits.max_seconds, cancelled=_CancelFlag(self))
        self.memory_writes = {}
        self.memory_saves = []
        if resume is None:
            self._start_turn(query, user_id, files, accepted, ids, webhook)
            if accepted or files:
                begin_files = self.components["begin"].file_fields() if accepted else frozenset()
                self._take_files(accepted, begin_files, files or [])
            yield self._event("workflow_started", {"inputs": accepted, "query": query})
        else:
            resume.data.setdefault("answers", {}).update(accepted)
            resume.data["resuming"] = True
            if accepted:
                self._take_files(accepted, resume.file_fields(), [])
        steps = 0
        i = 0
        max_steps = self.limits.max_steps
        components = self.components
        spans = telemetry.tracing_enabled()  # asked once a run: a span per node only when on
        try:
            while i < len(self.path):
                deadline.check()
                if steps >= max_steps:
                    raise self._too_many_steps(steps)
                steps += 1
                cid = self.path[i]
                cpn = components[cid]
                if cpn.is_form and not cpn.data.pop("resuming", False):
                    cpn.start_form()
                t0 = _monotonic()
                stop_before = self.stop_before
                if trace or (stop_before is not None and stop_before(cpn)):
                    now = int(_time())
                    yield self._event("node_started", self._node_data(cpn, now), now)
                try:
                    if spans:
                        with telemetry.node_span(cid, cpn.component_name):
                            yield from self._invoke(cpn, started)
                    else:  # _invoke without a generator for a component that streams nothing
                        chunks = cpn.invoke()
                        if chunks is not None:
                            yield from self._streamed(cpn, chunks, started)
                except FormPause:
                    self.path = self.path[i:]
                    yield self._pause(cpn)
                    return
                if cpn.finishes_later:
                    self._started_late[cid] = t0
                elif trace:
                    yield self._node_finished(cpn, t0)
                while self._finished_late:
                    done = self._finished_late.pop(0)
                    t_done = self._started_late.pop(done.id, None)
                    if trace:
                        yield self._node_finished(done, t_done)
                self._queue_next(cpn, i)
                i += 1
            yield from self._finish(started)
        except Cancelled:
            yield from self._end_failed(before, started, "cancelled", "the run was cancelled")
        except (CanvasError, Exception) as e:  # noqa: BLE001 - a component failure never escapes run()
            if not isinstance(e, CanvasError):
                log.exception("unexpected error in canvas run")
            _release_frames(e)
            yield from self._end_failed(before, started, "failed", str(e) or type(e).__name__, e)

    def _node_finished(self, cpn: ComponentBase, t0: float | None) -> dict:
        now = int(_time())
        data = self._node_data(cpn, now)
        data["inputs"] = cpn.inputs_seen
        data["outputs"] = _jsonable(cpn.outputs)
        data["error"] = cpn.error
        # A container resumed after a pause started in an earlier request: unknown.
        data["elapsed_time"] = round(_monotonic() - t0, 6) if t0 is not None else None
        if cpn.usage:
            data["usage"] = cpn.usage
        return self._event("node_finished", data, now)

    def component_finished(self, cpn: ComponentBase) -> None:
        """A container (Iteration, Loop) is done: its ``node_finished`` goes out now,
        with its collected outputs, rather than when it started its body."""
        self._finished_late.append(cpn)

    def _node_data(self, cpn: ComponentBase, now: int) -> dict:
        cid = cpn.id
        _, colon, name = cid.partition(":")
        return {
            "component_id": cid,
            "component_name": name if colon else cid,
            "component_type": cpn.component_name,
            "created_at": now,
        }

    def _invoke(self, cpn: ComponentBase, started: float) -> Iterator[dict]:
        """Run one component, streaming its chunks. Retries happen inside
        ``cpn.invoke()`` (the one retry loop); a stream that fails after its first
        chunk goes to the component's ``exception_method``."""
        chunks = cpn.invoke()
        if chunks is not None:
            yield from self._streamed(cpn, chunks, started)

    def _streamed(self, cpn: ComponentBase, chunks: Iterator[str], started: float) -> Iterator[dict]:
        """A component's stream as ``message`` events; a failure after its first chunk goes
        to the component's ``exception_method``."""
        try:
            yield from self._stream(cpn, chunks, started, [])
        except (Cancelled, LimitError, FormPause):
            raise
        except Exception as e:  # noqa: BLE001 - handed to the component's policy
            cpn.handle_failure(e)

    def _stream(
        self, cpn: ComponentBase, chunks: Iterator[str], started: float, parts: list[str]
    ) -> Iterator[dict]:
        first = True
        for chunk in chunks:
            if not chunk:
                continue
            self.deadline.check()
            if first and self.turn["answer"]:
                # Separate the answers of two Message components within one turn.
                self.turn["answer"] += "\n\n"
                yield self._event("message", {"content": "\n\n"})
            first = False
            parts.append(chunk)
            self.turn["answer"] += chunk
            yield self._event("message", {"content": chunk})
        cpn.stream_done("".join(parts))

    def _queue_next(self, cpn: ComponentBase, i: int) -> None:
        nxt = cpn.next_ids()
        if not nxt and cpn._next is None and cpn.parent_id:
            parent = self.components[cpn.parent_id]
            start = getattr(parent, "start_id", None)
            nxt = [start()] if callable(start) and start() else []
        path = self.path
        for nid in nxt:
            if nid not in self.components:
                raise ComponentError(f"{cpn.id}: routes to missing component {nid!r}")
            # Not queued twice: a component already waiting on the path runs once (joins).
            if nid not in path[i + 1 :]:
                path.append(nid)

    def sleep(self, seconds: float) -> None:
        """How retries wait (see the class docstring); a test may set its own."""
        self.deadline.sleep(seconds)

    def _too_many_steps(self, steps: int) -> LimitError:
        return LimitError(
            f"the turn ran {steps} components, the limit is {self.limits.max_steps} (max_steps); "
            f"a loop may never end"
        )

    def _pause(self, cpn: ComponentBase) -> dict:
        data = cpn.pause_data()
        self._prune_outputs()
        return self._event("user_inputs", data)

    def _finish(self, started: float) -> Iterator[dict]:
        turn = self.turn
        answer = turn["answer"]
        usage = turn.get("usage") or {}
        self.history.append(_history_entry("user", turn["query"]))
        self.history.append(_history_entry("assistant", answer))
        overflow = len(self.history) - self.limits.history_size
        if overflow > 0:
            del self.history[:overflow]
        self.path = []
        for cid, cpn in self.components.items():
            if cid != "begin":
                if cpn.outputs:
                    cpn.outputs = {}
                if cpn.data:
                    cpn.data = {}
        end = {"content": answer}
        reference = self.cited_reference(answer) if turn.get("references") else None
        if reference is not None:
            end["reference"] = reference
        if usage:
            end["usage"] = usage
        finished = {
            "status": "succeeded",
            "outputs": {"content": answer},
            "elapsed_time": round(_monotonic() - started, 6),
            "usage": usage,
        }
        events = [self._event("message_end", end), self._event("workflow_finished", finished)]
        if reference is not None:
            # ragflow-sdk reads it at the event's top level, current RAGFlow in ``data``: both.
            events[0]["reference"] = reference
        if turn.get("references"):
            self._keep_retrieval()
        self.turn = None
        yield from events

    def _end_failed(
        self, before: str, started: float, status: str, error: str, exc: BaseException | None = None
    ) -> Iterator[dict]:
        turn = self.turn
        self._restore_runtime_state(before)
        self.memory_writes = {}  # a failed turn commits no keyed memory either
        self.memory_saves = []
        paused_turn, self.turn = self.turn, turn
        try:
            data = {
                "status": status,
                "error": error,
                "content": error,
                "outputs": {},
                "elapsed_time": round(time.monotonic() - started, 6),
                "usage": (turn or {}).get("usage") or {},
            }
            if exc is not None:
                data["error_type"] = type(exc).__name__
            yield self._event("workflow_finished", data)
        finally:
            self.turn = paused_turn

    def _prune_outputs(self) -> None:
        """Keep only the outputs that components still on the pending path may read."""
        path = tuple(self.path)
        kept = self._blueprint.kept
        needed = kept.get(path)
        if needed is None:
            needed = self._outputs_needed_by(path)
            if len(kept) < MAX_KEPT_PATHS:  # a graph has few pause points; a bound all the same
                kept[path] = needed
        for cid, cpn in self.components.items():
            if cpn.outputs and cid not in needed:
                cpn.outputs = {}

    def _outputs_needed_by(self, path: tuple[str, ...]) -> frozenset[str]:
        """Ids of the components whose outputs the components reachable from ``path`` may read."""
        reachable, todo = set(), list(path)
        while todo:
            cid = todo.pop()
            if cid in reachable:
                continue
            reachable.add(cid)
            cpn = self.components[cid]
            todo.extend(n for n in cpn.possible_next() if n in self.components)
            todo.extend(c for c, o in self.components.items() if o.parent_id == cid)
            if cpn.parent_id:
                todo.append(cpn.parent_id)
        needed = {"begin"} | reachable
        for cid in reachable:
            needed.update(r.name for r in self.references_of(cid) if r.scope == "cpn")
        return frozenset(needed)


#: The snapshot keys a run changes, kept as their JSON by :meth:`Canvas.keep` (and
#: ``history``, kept as it is: pairs of text, plain JSON by construction).
_KEPT_AS_TEXT = tuple(k for k in _RUNTIME_KEYS if k != "history")


class HistoryEntry(FrozenList):
    """A ``[role, text]`` pair of the history, both text, as a turn adds it: read-only, so
    the JSON a dump wrote of it holds at the next dump (see :func:`_history_json`)."""

    __slots__ = ()
    refusal = "a history entry cannot be changed; put a new [role, text] list in its place"


def _history_entry(role: str, text: Any) -> list:
    return HistoryEntry((role, text)) if type(text) is str else [role, text]


class _WrittenHistory:
    """A history's JSON as a dump wrote it, for the next dump to reuse.

    Attributes:
        entries: the entries written, each a pair of text: the history's own
            :class:`HistoryEntry` objects, or read-only copies of its plain lists.
        text: their JSON, as orjson writes the history (UTF-8).
    """

    __slots__ = ("entries", "text")

    def __init__(self, entries: list, text: bytes):
        self.entries = entries
        self.text = text


def _history_json(history: Any, written: _WrittenHistory | None) -> _WrittenHistory | None:
    """``history``'s JSON: ``written`` (brought up to date in place), or written anew.

    A turn keeps all but a few entries: it adds a pair at the end, and drops the oldest
    past ``history_size``. Then the JSON of the entries ``written`` still has is reused,
    once ``history`` is checked to be them followed by the new ones, compared by value
    (a pair of text equal to a written one has its JSON; the written entries themselves
    compare at once); any other change writes the history anew.

    Returns:
        ``None`` when an entry is not a pair of text, or only the standard library writes
        it: the snapshot then writes the history as it writes the rest.
    """
    if type(history) is not list:
        return None
    if written is not None and history:
        entries = written.entries
        drop = _dropped(entries, history[0])
        kept = len(entries) - drop
        new = history[kept:]
        if not 0 < kept <= len(history) or not _pairs_of_text(new):
            pass
        elif not new and not drop:
            if entries == history:
                return written
        elif (text := jsonio.dumps_utf8(new)) is not None:
            # orjson writes the dropped entries as the written text starts, up to the first one kept.
            dropped = jsonio.dumps_utf8(entries[:drop]) if drop else None
            start = len(dropped) if dropped is not None else 1
            del entries[:drop]
            entries += _read_only(new)
            if entries == history:
                body = written.text[start:-1]
                written.text = b"".join((b"[", body, b",", text[1:]) if new else (b"[", body, b"]"))
                return written
    if not _pairs_of_text(history):
        return None
    text = jsonio.dumps_utf8(history)
    return None if text is None else _WrittenHistory(_read_only(history), text)


def _dropped(entries: list, first: Any) -> int:
    """How many of the written ``entries`` the history has lost from its start, ``first``
    being its first entry now.

    A kept canvas's history holds the very entries the last dump wrote, and a turn drops
    as many as it adds (a few): ``first`` is looked for as that object among the first
    :data:`_FEW_DROPPED` entries, then by value. By value alone, a conversation whose
    exchanges repeat (a form filled in again and again) read as one that lost and added
    nothing; that reading holds too, but the check that follows it then compared the
    whole history pair by pair (5.6 us a dump at 100 entries, against 3.5 found by
    identity: bench/http.py's intake turn, in process).
    """
    for drop, entry in enumerate(entries[:_FEW_DROPPED]):
        if entry is first:
            return drop
    drop = 0
    while drop < len(entries) and entries[drop] != first:
        drop += 1
    return drop


#: How far :func:`_dropped` looks for the history's first entry by identity.
_FEW_DROPPED = 8


def _pairs_of_text(entries: list) -> bool:
    for entry in entries:
        if type(entry) is not HistoryEntry and (
            type(entry) is not list
            or len(entry) != 2
            or type(entry[0]) is not str
            or type(entry[1]) is not str
        ):
            return False
    return True


def _read_only(entries: list) -> list:
    return [e if type(e) is HistoryEntry else HistoryEntry(e) for e in entries]


class _CancelFlag:
    """The running turn's cancel flag: the canvas's ``cancel_check`` (set while the turn
    runs), read through a weak reference so that the canvas's deadline does not keep
    the canvas alive (see :class:`~agent.component.base.ComponentBase`)."""

    __slots__ = ("_canvas",)

    def __init__(self, canvas: Canvas):
        self._canvas = weakref.ref(canvas)

    def __call__(self) -> bool:
        canvas = self._canvas()
        check = canvas.cancel_check if canvas is not None else None
        return check is not None and bool(check())


class KeptCanvas:
    """A canvas as its last turn left it, for the next turn in this process: loads,
    once, into a canvas equal to ``Canvas(text)`` without parsing ``text``.

    Made by :meth:`Canvas.keep` once ``text = canvas.dump_utf8(keepable=True)`` (or ``dump``)
    was stored. Holds that canvas, the snapshot's parsed DSL and history as it had them
    (never changed by a run: components' params are private copies) and the rest of the
    state as JSON text, parsed again on :meth:`load` (so the state the next run changes is fresh
    objects, as a load makes them); see :meth:`Canvas._reload`.

    Attributes:
        text: the snapshot (what ``Canvas(text)`` would load): its text, or its UTF-8.
    """

    __slots__ = ("_canvas", "_dsl", "_state", "text")

    def __init__(self, text: bytes | str, canvas: Canvas, dsl: dict, state: bytes | str):
        self.text = text
        self._canvas: Canvas | None = canvas
        self._dsl: dict | None = dsl
        self._state = state

    def load(self, *, limits: Limits | None = None, services: dict | None = None) -> Canvas:
        """The canvas (as ``Canvas(self.text, limits=..., services=...)``); only once."""
        canvas, dsl = self._canvas, self._dsl
        self._canvas = self._dsl = None
        if canvas is None or dsl is None:
            raise RuntimeError("a kept canvas is loaded once")
        dsl.update(jsonio.loads(self._state))  # the members the text has, in their places
        return canvas._reload(dsl, self.text, limits, services)


@functools.cache
def _probe() -> Canvas:
    """A loaded canvas of a Begin alone."""
    return Canvas({"components": {"begin": {"obj": {"component_name": "Begin", "params": {}}}}, **_EMPTY})


@functools.cache
def _component_attrs() -> frozenset[str]:
    """The attributes the base class's constructor gives a component."""
    return frozenset(vars(_probe().components["begin"]))


@functools.cache
def _loaded_attrs() -> int:
    """How many attributes a loaded canvas has (a run adds ``_finished_late`` and ``_started_late``)."""
    return len(vars(_probe()))


_EMPTY = {"path": [], "history": [], "retrieval": []}


def _release_frames(error: BaseException) -> None:
    """Let a failure go of the frames it was raised through (they hold the canvas and its
    components): the run ends with the error's message (the log line, if any, is
    written before), and a library's error may sit in a reference cycle (jinja2 keeps
    the error in its rewritten traceback) that would keep those frames, and the canvas,
    alive until the cyclic collector runs."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += (e.__cause__, e.__context__)


def _reference_chunk(chunk: dict) -> dict:
    """A found chunk as ``reference.chunks`` lists it (RAGFlow's field names)."""
    return {
        "id": chunk.get("id") or chunk.get("chunk_id") or "",
        "content": chunk.get("content") or "",
        "document_id": chunk.get("document_id") or chunk.get("doc_id") or "",
        "document_name": chunk.get("document_name") or chunk.get("docnm_kwd") or "",
        "dataset_id": chunk.get("dataset_id") or chunk.get("kb_id") or "",
        "image_id": chunk.get("image_id") or "",
        "positions": chunk.get("positions") or [],
        "similarity": chunk.get("similarity"),
        "term_similarity": chunk.get("term_similarity"),
        "vector_similarity": chunk.get("vector_similarity"),
    }


def _declared_variables(variables: Any) -> dict[str, dict]:
    try:
        return declared_variables(variables)
    except ValueError as e:
        raise DSLError(str(e)) from None


def _oversized(values: dict[str, Any], limit: int) -> dict[str, str]:
    """``{name: message}`` for each value over ``limit`` bytes (as text or JSON)."""
    errors = {}
    for name, value in values.items():
        if not value:
            continue
        size = value_size(value)
        if size > limit:
            errors[name] = f"{name} is {size} bytes; the limit is {limit} (max_value_bytes)"
    return errors


def _errors_message(cid: str, errors: dict[str, str]) -> str:
    detail = "; ".join(f"{k}: {v}" for k, v in errors.items())
    return f"{cid}: the form answers were rejected ({detail}); nothing was changed"


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


#: Values that are their own JSON-ready form (exact types: a subclass goes the long way).
_AS_IS = frozenset((str, int, float, bool, type(None)))


def _jsonable(value: Any) -> Any:
    """Outputs for a ``node_finished`` event; a stream still being read is left out."""
    if isinstance(value, dict):
        return {
            k: v if type(v) in _AS_IS else _jsonable(v)
            for k, v in value.items()
            if not (isinstance(v, LazyText) and not v.done)
        }
    if isinstance(value, LazyText):
        return value.text
    if isinstance(value, list):
        return [v if type(v) in _AS_IS else _jsonable(v) for v in value]
    return value
