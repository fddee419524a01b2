"""Iteration: run a sub-flow once per element of a list (RAGFlow's Iteration).

DSL shape (as RAGFlow's editor writes it)::

    "Iteration:Each": {"obj": {"component_name": "Iteration", "params": {
        "items_ref": "begin@items",                      # bare reference to a list
        "outputs": {"lines": {"ref": "Message:Line@content", "type": "Array<string>"}}}},
      "downstream": ["Message:Summary"]},
    "IterationItem:Cur": {"obj": {"component_name": "IterationItem", "params": {}},
      "parent_id": "Iteration:Each", "downstream": ["Message:Line"]},
    "Message:Line": {..., "parent_id": "Iteration:Each", "downstream": []}

The body is every component whose ``parent_id`` is the Iteration. Its start is the one
``IterationItem`` child, which sets ``item`` and ``index`` (``result`` too, RAGFlow's
alias of ``item``) for each element. A body component with no ``downstream`` hands the
run back to the IterationItem (the canvas does that); when the elements are exhausted
the run continues at the Iteration's ``downstream``. An empty list goes straight on.

Params:
    items_ref: a bare reference (braces optional) to the list. JSON text holding a list
        is read as that list. Anything else fails the component with a clear error.
    variable: RAGFlow's alternative to ``items_ref`` (``{"input_mode": "constant" |
        "variable", "value": ...}``), used only when ``items_ref`` is empty. RAGFlow's
        misspelling ``veriable`` is read too.
    outputs: ``{name: {"ref": "cpn@var", ...}}`` — each becomes an output of the
        Iteration holding the list of that reference's value, one per element.

Outputs: each declared ``outputs`` name, and ``result`` (unless declared): per element,
the output of the body component that ended that pass — the first body component
without ``downstream`` that produced outputs, its ``content`` if it has one, else its
outputs. Body outputs are cleared before each pass, so a branch that did not run in a
pass reads empty in it instead of the previous pass's value.

Bookkeeping lives in ``data`` (the list as it was when the Iteration started, the next
index), so a run paused by a form inside the body resumes at the right element after
``Canvas(str(canvas))``. The list is read once: a body that changes the referenced
variable does not change what is iterated.
"""

from __future__ import annotations

import copy
import json
from typing import Any, ClassVar

from agent.component import register
from agent.component.base import ComponentBase, ComponentParamBase
from agent.errors import DSLError
from agent.refs import Ref, parse_ref, require_ref
from agent.stream import LazyText


def read_value(component: ComponentBase, ref: str | Ref) -> Any:
    """A reference's value (a streaming answer read whole), copied so later writes to the
    source do not change what the caller keeps."""
    value = component.get_value(ref)
    if isinstance(value, LazyText):
        return value.text
    return copy.deepcopy(value)


def public_outputs(outputs: dict) -> dict:
    """Outputs without the private ``_``-prefixed keys (``_ERROR``, ``_next``)."""
    return {
        k: (v.text if isinstance(v, LazyText) else v) for k, v in outputs.items() if not k.startswith("_")
    }


class ContainerComponent(ComponentBase):
    """What Iteration and Loop share: a body of child components (``parent_id`` = this id)
    entered through exactly one start child of type :attr:`start_type`.

    The run state of the current pass lives in ``data``: ``finished`` is set when the
    container is left, so that a body branch still queued after that does not start
    another pass.
    """

    start_type: ClassVar[str] = ""
    # Only the body's components may have effects: each is looked at on its own.
    side_effect_free = True
    # Its node_finished, with the collected outputs, goes out when the body is done.
    finishes_later = True

    def children(self) -> list[ComponentBase]:
        return [c for c in self._canvas.components.values() if c.parent_id == self.id]

    def descendants(self) -> list[ComponentBase]:
        """Children, their children, and so on (nested containers' bodies)."""
        found, todo, seen = [], [self.id], {self.id}
        while todo:
            pid = todo.pop()
            for c in self._canvas.components.values():
                if c.parent_id == pid and c.id not in seen:  # parent_id cycles end here
                    seen.add(c.id)
                    found.append(c)
                    todo.append(c.id)
        return found

    def _start_ids(self) -> list[str]:
        name = self.start_type.lower()
        return [c.id for c in self.children() if c.component_name.lower() == name]

    def start_id(self) -> str | None:
        """The start child's id; the canvas returns here when a body component ends."""
        starts = self._start_ids()
        return starts[0] if starts else None

    def possible_next(self) -> list[str]:
        starts = self._start_ids()
        if len(starts) != 1:
            raise DSLError(
                f"{self.id}: needs exactly one {self.start_type} child "
                f"(component_name {self.start_type!r} with parent_id {self.id!r}); found {len(starts)}"
            )
        return super().possible_next() + starts

    def exit_ids(self) -> list[str]:
        """Where the run goes when the container is done.

        Its ``downstream``; or, for a container without one inside another container's
        body, back to the outer start (the rule the canvas applies to body components).
        """
        if self.downstream:
            return self.downstream
        parent = self._canvas.components.get(self.parent_id or "")
        start = parent.start_id() if isinstance(parent, ContainerComponent) else None
        return [start] if start else []

    def finish(self) -> list[str]:
        """Mark the container left (its ``node_finished`` goes out now); returns :meth:`exit_ids`."""
        self.data["finished"] = True
        self._canvas.component_finished(self)
        return self.exit_ids()


def container_of(child: ComponentBase, kind: type[ContainerComponent]) -> ContainerComponent | None:
    """``child``'s parent if it is a ``kind``, else ``None``."""
    parent = child._canvas.components.get(child.parent_id or "")
    return parent if isinstance(parent, kind) else None


class IterationParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.items_ref = ""
        self.variable: dict = {}

    def check(self) -> None:
        if not isinstance(self.items_ref, str):
            raise ValueError(f"items_ref must be a reference like 'begin@items', got {self.items_ref!r}")
        # RAGFlow's IterationParam spells it "veriable".
        if not self.variable and isinstance(getattr(self, "veriable", None), dict):
            self.variable = self.veriable
        if not isinstance(self.variable, dict):
            raise ValueError(
                f"variable must be an object with 'input_mode' and 'value', got {self.variable!r}"
            )
        if self.items_ref.strip():
            if parse_ref(self.items_ref) is None:
                raise ValueError(
                    f"items_ref {self.items_ref!r} is not a reference; use one like "
                    f"'begin@items', 'LLM:A@structured.items' or 'env.list'"
                )
        elif not self.variable or "value" not in self.variable:
            raise ValueError("items_ref is empty; set it to a reference to a list, e.g. 'begin@items'")
        elif self.variable.get("input_mode") == "variable":
            require_ref(self.variable.get("value"), "variable.value", "'begin@items'")
        if self.outputs in (None, []):
            self.outputs = {}
        if not isinstance(self.outputs, dict):
            raise ValueError("outputs must be an object of {name: {'ref': 'cpn@var'}}")
        for name, spec in self.outputs.items():
            if isinstance(spec, dict) and spec.get("ref"):
                require_ref(spec["ref"], f"outputs.{name}.ref", "'Message:Line@content'")


@register
class Iteration(ContainerComponent):
    """See the module docstring."""

    component_name = "Iteration"
    param_class = IterationParam
    bare_ref_params = ("items_ref",)
    start_type = "IterationItem"

    def references(self) -> list[Ref]:
        refs = super().references()
        var = self._param.variable
        if not self._param.items_ref.strip() and var.get("input_mode") == "variable":
            refs.append(parse_ref(var["value"]))
        refs.extend(parse_ref(ref) for _, ref in self.collected_refs())
        return refs

    def collected_refs(self) -> list[tuple[str, str]]:
        """``(output name, reference)`` for each declared output collected per element."""
        return [
            (name, spec["ref"])
            for name, spec in self._param.outputs.items()
            if isinstance(spec, dict) and spec.get("ref")  # the editor leaves "" for an unset ref
        ]

    def _items(self) -> tuple[str, Any]:
        """``(where the items come from, the items)``."""
        if self._param.items_ref.strip():
            return self._param.items_ref, read_value(self, self._param.items_ref)
        var = self._param.variable
        if var.get("input_mode") == "variable":
            return var["value"], read_value(self, var["value"])
        return "variable.value", copy.deepcopy(var.get("value"))

    def _invoke(self, **kwargs: Any) -> None:
        source, items = self._items()
        if isinstance(items, str):
            try:
                parsed = json.loads(items)
            except ValueError:
                parsed = None
            if isinstance(parsed, list):
                items = parsed
        if not isinstance(items, list):
            shown = repr(items) if len(repr(items)) <= 80 else repr(items)[:77] + "..."
            raise self.fail(
                f"items_ref {source!r} is {type(items).__name__} {shown}, not a list; "
                f"point items_ref at a list (a Begin 'object' field, an LLM's structured list, ...)"
            )
        self.inputs_seen = {"items": items}
        self.data = {"items": items, "next": 0}
        self.set_output("result", [])
        for name, _ in self.collected_refs():
            self.set_output(name, [])
        if not items:
            self._next = self.finish()
            return
        self._next = [self.start_id()]

    def collect_pass(self) -> None:
        """Append what the pass that just ended produced to the collected outputs."""
        declared = dict(self.collected_refs())
        for name, ref in declared.items():
            self.outputs.setdefault(name, []).append(read_value(self, ref))
        if "result" not in declared:
            self.outputs.setdefault("result", []).append(copy.deepcopy(self._pass_result()))

    def _pass_result(self) -> Any:
        start = self.start_id()
        ends = [c for c in self.children() if c.id != start and not c.downstream]
        for cpn in ends:
            outputs = public_outputs(cpn.outputs)
            if outputs:
                return outputs["content"] if "content" in outputs else outputs
        if not ends:  # an empty body: the element itself
            return self._canvas.components[start].outputs.get("item")
        return None

    def clear_body(self) -> None:
        """Forget the body's outputs before the next pass (see the module docstring)."""
        start = self.start_id()
        for cpn in self.descendants():
            if cpn.id != start:
                cpn.outputs = {}
