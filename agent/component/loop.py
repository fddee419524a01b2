"""Loop: run a sub-flow again and again until a condition holds (RAGFlow's Loop).

DSL shape (as RAGFlow's editor writes it)::

    "Loop:Retry": {"obj": {"component_name": "Loop", "params": {
        "loop_variables": [{"variable": "tries", "type": "number",
                            "input_mode": "constant", "value": 0}],
        "loop_termination_condition": [{"variable": "Loop:Retry@tries", "operator": "≥",
                                        "input_mode": "constant", "value": 3}],
        "logical_operator": "and",
        "maximum_loop_count": 10}},
      "downstream": ["Message:Done"]},
    "LoopItem:Pass": {"obj": {"component_name": "LoopItem", "params": {}},
      "parent_id": "Loop:Retry", "downstream": ["VariableAssigner:Count"]},
    ...

The body is every component whose ``parent_id`` is the Loop; it starts at the one
``LoopItem`` child. Before each pass the LoopItem checks the termination conditions and
the pass count; when either says stop, the run continues at the Loop's ``downstream``.
A body component with no ``downstream`` hands the run back to the LoopItem. An
``ExitLoop`` in the body leaves the Loop at once.

Params:
    loop_variables: ``[{"variable": name, "type", "input_mode", "value"}]``. Each is an
        output of the Loop, read as ``{Loop:X@name}`` and written by the body (e.g. a
        VariableAssigner on ``Loop:X@name``). ``input_mode`` ``constant``: ``value``
        converted to ``type`` (``number``, ``string``, ``boolean``, ``object``,
        ``array...``); ``variable``: ``value`` is a bare reference read when the Loop
        starts; anything else: the type's empty value (0, "", false, {}, []).
    loop_termination_condition: ``[{"variable": ref, "operator", "input_mode", "value"}]``
        compared with :func:`agent.conditions.compare` (the same operators as Switch);
        ``input_mode`` ``variable`` makes ``value`` a reference. No conditions: the loop
        runs until ``maximum_loop_count`` or an ExitLoop (RAGFlow would stop at once).
    logical_operator: ``and`` (every condition holds) or ``or`` (one does).
    maximum_loop_count: the most passes, a whole number ≥ 1 (default 10). The canvas
        step limit (``max_steps``) still bounds the turn.

Bookkeeping (the pass count) lives in ``data``, so a run paused by a form inside the
body resumes correctly after ``Canvas(str(canvas))``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from agent.component import register
from agent.component.base import ComponentParamBase
from agent.component.iteration import ContainerComponent, read_value
from agent.conditions import (
    LOGICAL_OPERATORS,
    canonical_operator,
    combine,
    compare,
    operator_error,
)
from agent.errors import DSLError
from agent.refs import Ref, parse_ref, require_ref
from agent.stream import LazyText
from agent.variables import empty_value, from_text, parse_type, value_fits

_NAME_RE = re.compile(r"^[A-Za-z0-9_\-]+$")


def _empty(vtype: Any) -> Any:
    """A loop variable's starting value when none is given: its type's empty value."""
    parsed = parse_type(vtype)
    return "" if parsed is None or parsed.kind == "any" else empty_value(parsed)


def _convert_constant(name: str, vtype: Any, value: Any) -> Any:
    """A constant loop variable's value in its declared type; ``ValueError`` if it does not fit."""
    parsed = parse_type(vtype)
    if parsed is None or parsed.kind == "any":
        return value
    if value is None or (value == "" and parsed.kind != "string"):
        return empty_value(parsed)
    try:
        value = from_text(parsed, value)
    except ValueError as e:
        raise ValueError(f"loop variable {name!r} has type {vtype} but value {value!r}: {e}") from None
    if not value_fits(parsed, value):
        raise ValueError(f"loop variable {name!r} has type {vtype} but value {value!r}")
    return value


def _incomplete(var: dict, mode: Any) -> str:
    """What a half-filled loop variable lacks (``""`` when it is complete)."""
    if var.get("variable") in (None, ""):
        return "it has no variable name"
    if mode == "variable" and var.get("value") in (None, ""):
        return f"variable {var['variable']!r} reads its value from a reference, but none is chosen"
    return ""


class LoopParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.loop_variables: list[dict] = []
        self.loop_termination_condition: list[dict] = []
        self.logical_operator = "and"
        self.maximum_loop_count = 10

    def check(self) -> None:
        self._check_variables()
        self._check_conditions()
        if self.logical_operator in (None, ""):
            self.logical_operator = "and"
        self.check_choice("logical_operator", LOGICAL_OPERATORS)
        count = self.maximum_loop_count
        if isinstance(count, float) and count.is_integer():
            count = self.maximum_loop_count = int(count)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"maximum_loop_count must be a whole number ≥ 1, got {count!r}")

    def _check_variables(self) -> None:
        self.check_list("loop_variables")
        seen = set()
        for n, var in enumerate(self.loop_variables, 1):
            where = f"loop_variables item {n}"
            if not isinstance(var, dict):
                raise ValueError(
                    f"{where} must be an object with 'variable', 'type', 'input_mode' and 'value'"
                )
            name = var.get("variable")
            mode = var.get("input_mode") or "constant"
            incomplete = _incomplete(var, mode)
            if incomplete:
                # RAGFlow's editor saves half-filled rows and fails only when the Loop runs.
                self.warn(f"{where} is incomplete ({incomplete}); the Loop fails when it runs")
                var["incomplete"] = incomplete
                continue
            if not isinstance(name, str) or not _NAME_RE.match(name):
                raise ValueError(
                    f"{where}: variable {name!r} must be a name of letters, digits, '_' or '-' "
                    f"(it is read as {{Loop:X@name}})"
                )
            if name in seen:
                raise ValueError(f"{where}: loop variable {name!r} is declared twice")
            seen.add(name)
            if mode == "variable":
                if parse_ref(var.get("value")) is None:
                    raise ValueError(
                        f"{where}: input_mode 'variable' needs value to be a reference like "
                        f"'begin@count', got {var.get('value')!r}"
                    )
            elif mode == "constant":
                var["value"] = _convert_constant(name, var.get("type"), var.get("value"))
            var["input_mode"] = mode

    def _check_conditions(self) -> None:
        self.check_list("loop_termination_condition")
        for n, cond in enumerate(self.loop_termination_condition, 1):
            where = f"loop_termination_condition item {n}"
            if not isinstance(cond, dict):
                raise ValueError(f"{where} must be an object with 'variable', 'operator' and 'value'")
            require_ref(cond.get("variable"), f"{where}: variable", "'Loop:X@count' or 'env.done'")
            operator = canonical_operator(cond.get("operator"))
            if operator is None:
                raise ValueError(f"{where}: {operator_error(cond.get('operator'))}")
            cond["operator"] = operator
            mode = cond.get("input_mode") or "constant"
            if mode not in ("constant", "variable"):
                raise ValueError(f"{where}: input_mode {mode!r} is not 'constant' or 'variable'")
            if mode == "variable" and parse_ref(cond.get("value")) is None:
                raise ValueError(
                    f"{where}: input_mode 'variable' needs value to be a reference, got {cond.get('value')!r}"
                )
            cond["input_mode"] = mode


@register
class Loop(ContainerComponent):
    """See the module docstring."""

    component_name = "Loop"
    param_class = LoopParam
    start_type = "LoopItem"

    def references(self) -> list[Ref]:
        refs = super().references()
        for var in self._param.loop_variables:
            if var.get("incomplete"):
                continue
            if var["input_mode"] == "variable":
                refs.append(parse_ref(var["value"]))
        for cond in self._param.loop_termination_condition:
            refs.append(parse_ref(cond["variable"]))
            if cond["input_mode"] == "variable":
                refs.append(parse_ref(cond["value"]))
        return refs

    def variable_names(self) -> list[str]:
        return [var["variable"] for var in self._param.loop_variables if not var.get("incomplete")]

    def possible_next(self) -> list[str]:
        # A condition on this Loop's own outputs must name a declared loop variable:
        # checked here because it is the load-time hook that sees the whole canvas.
        for n, cond in enumerate(self._param.loop_termination_condition, 1):
            ref = parse_ref(cond["variable"])
            if ref.scope == "cpn" and ref.name == self.id and ref.var not in self.variable_names():
                raise DSLError(
                    f"{self.id}: loop_termination_condition item {n} reads {ref.var!r}, which is not "
                    f"a loop variable; declared: {', '.join(map(repr, self.variable_names())) or 'none'}"
                )
        return super().possible_next()

    def _invoke(self, **kwargs: Any) -> None:
        for n, var in enumerate(self._param.loop_variables, 1):
            if var.get("incomplete"):
                raise self.fail(
                    f"loop_variables item {n} is incomplete ({var['incomplete']}); complete it in the Loop",
                    retryable=False,
                )
        for var in self._param.loop_variables:
            mode = var["input_mode"]
            if mode == "variable":
                value = read_value(self, var["value"])
            elif mode == "constant":
                value = copy.deepcopy(var["value"])
            else:
                value = _empty(var.get("type"))
            self.set_output(var["variable"], value)
        self.data = {"passes": 0}
        self._next = [self.start_id()]

    def should_stop(self) -> bool:
        """Whether the termination conditions hold now (never, when there are none)."""
        conditions = self._param.loop_termination_condition
        if not conditions:
            return False
        return combine((self._holds(c) for c in conditions), self._param.logical_operator)

    def _holds(self, cond: dict) -> bool:
        left = read_value(self, cond["variable"])
        right = cond.get("value")
        if cond["input_mode"] == "variable":
            right = read_value(self, right)
        elif isinstance(right, str):
            right = self.render_value(right)  # as Switch does: "{begin@limit}" works here too
            right = right.text if isinstance(right, LazyText) else right
        return compare(left, cond["operator"], "" if right is None else right)
