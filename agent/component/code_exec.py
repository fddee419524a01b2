"""CodeExec: run a Python or JavaScript program in a sandbox (RAGFlow's CodeExec).

Params (RAGFlow's):
    lang: ``python`` (also ``python3``) or ``javascript`` (also ``nodejs``).
    script: the program. Python defines ``main(**arguments)``; JavaScript exports
        ``main(args)`` (``module.exports = { main }``), which may return a Promise.
    arguments: ``{name: value}`` passed to ``main``; a value that is a bare reference
        (``"YahooFinance:Q@report"``, ``"sys.query"``) or text with ``{references}``
        is resolved first.
    outputs: ``{name: {"type", "value"}}`` with exactly one output of the program's
        own (besides RAGFlow's system outputs such as ``attachments``): it receives
        ``main``'s return value, which must fit its ``type`` (``String``, ``Number``,
        ``Boolean``, ``Object``, ``Array<…>``, ``Any``; case as RAGFlow's editor writes it).

Outputs: that output, ``content`` (the value as text: JSON for objects and lists),
``actual_type``, and ``stdout``/``stderr`` of the program (cut at 64 KiB).

As an Agent tool the model writes ``lang`` and ``script`` itself (RAGFlow's
``execute_code``). The sandbox and its limits are :mod:`agent.sandbox`
(``tools.codeexec.*`` settings); a broken limit fails the component with a message
saying which.
"""

from __future__ import annotations

import json
from typing import Any

from agent import sandbox
from agent.component import register
from agent.component.tool import ToolComponent, ToolParam
from agent.errors import ComponentError
from agent.refs import Ref, find_refs
from agent.stream import LazyText

# RAGFlow's outputs that are not the program's own.
SYSTEM_OUTPUTS = frozenset(
    {"content", "actual_type", "attachments", "_ERROR", "_ARTIFACTS", "_ATTACHMENT_CONTENT", "raw_result"}
)
_SIMPLE_TYPES = {
    "string": "String",
    "number": "Number",
    "boolean": "Boolean",
    "object": "Object",
    "null": "Null",
}
_PRINT_CAP = 64 * 1024


class CodeExecParam(ToolParam):
    tool_inputs = {
        "lang": {
            "type": "string",
            "description": "The programming language of this piece of code.",
            "enum": ["python", "javascript"],
            "default": "python",
            "required": True,
        },
        "script": {
            "type": "string",
            "description": (
                "A piece of code in the right format. There MUST be a main function; in JavaScript "
                "it must be exported (module.exports = { main })."
            ),
            "default": 'def main(arg1: str, arg2: str) -> dict:\n    return {"result": arg1 + arg2}',
            "required": True,
        },
    }

    def __init__(self) -> None:
        super().__init__()
        self.arguments: Any = {}
        self.outputs = {
            "result": {"value": "", "type": "object"},
            "attachments": {"value": [], "type": "Array<String>"},
        }

    def check(self) -> None:
        sandbox.language_of(self.lang)
        if not isinstance(self.script, str) or not self.script.strip():
            raise ValueError("script is empty; write a program with a main function")
        if self.arguments in (None, ""):
            self.arguments = {}
        if not isinstance(self.arguments, dict):
            raise ValueError(f"arguments must be an object of name: value, got {self.arguments!r}")
        if not isinstance(self.outputs, dict):
            raise ValueError(f"outputs must be an object of name: {{type, value}}, got {self.outputs!r}")
        business_output(self.outputs)
        expected_type(self.outputs)


def business_output(outputs: dict) -> str:
    """The one output that receives ``main``'s value; ``ValueError`` if there is not one."""
    if len(outputs) == 1:
        (name,) = outputs
    else:
        names = [n for n in outputs if n not in SYSTEM_OUTPUTS]
        if len(names) != 1:
            raise ValueError(
                f"outputs must declare exactly one output for main()'s value (besides "
                f"{', '.join(sorted(SYSTEM_OUTPUTS))}), got {names!r}"
            )
        (name,) = names
    if not name.strip() or "." in name or name in SYSTEM_OUTPUTS - {"content"}:
        raise ValueError(f"output name {name!r} cannot hold main()'s value; choose another name")
    return name


def expected_type(outputs: dict) -> str:
    """The declared type of the business output, normalised (``Array<String>``); ``""`` for any."""
    meta = outputs[business_output(outputs)]
    declared = str(meta.get("type") or "") if isinstance(meta, dict) else ""
    return _normalise_type(declared)


def _normalise_type(declared: str) -> str:
    text = declared.strip()
    low = text.lower()
    if low in ("", "any"):
        return ""
    if low in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[low]
    if low.startswith("array<") and low.endswith(">"):
        inner = _normalise_type(text[6:-1])
        return f"Array<{inner or 'Any'}>"
    if low == "array":
        return "Array<Any>"
    raise ValueError(f"output type {declared!r} is not one of String, Number, Boolean, Object, Array<…>, Any")


def type_of(value: Any) -> str:
    """RAGFlow's name for a JSON value's type (``Array<Number>``...)."""
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "Boolean"
    if isinstance(value, (int, float)):
        return "Number"
    if isinstance(value, str):
        return "String"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        kinds = {type_of(v) for v in value}
        return f"Array<{kinds.pop()}>" if len(kinds) == 1 else "Array<Any>"
    return "Any"


def fits(expected: str, value: Any) -> bool:
    if expected in ("", "Any", "Array<Any>") and (expected != "Array<Any>" or isinstance(value, list)):
        return True
    if expected.startswith("Array<"):
        return isinstance(value, list) and all(fits(expected[6:-1], v) for v in value)
    return type_of(value) == expected


def as_text(value: Any) -> str:
    """RAGFlow's ``content`` of a value: text as is, JSON for objects and lists."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True)
    return json.dumps(value)


@register
class CodeExec(ToolComponent):
    """See the module docstring."""

    component_name = "CodeExec"
    param_class = CodeExecParam
    tool_name = "execute_code"
    tool_description = (
        "Runs a Python or JavaScript program in a sandbox (no network, no files of the server) and "
        "returns what its main function returns, as JSON. Python: def main() -> dict: ... ; "
        "JavaScript: async function main(args) { ... } module.exports = { main };"
    )
    settings_name = "codeexec"

    def references(self) -> list[Ref]:
        refs = super().references()
        for value in self._param.arguments.values():
            ref = self._bare_ref(value)
            if ref is not None:
                refs.append(ref)
        return refs

    def tool_arguments(self, given: dict) -> dict:
        # The program is code, never a template: taken as written.
        return {
            "lang": given.get("lang") or self._param.lang,
            "script": given.get("script") or self._param.script,
        }

    def _program_arguments(self, given: dict) -> dict:
        out = {}
        for name, value in self._param.arguments.items():
            if given.get(name) not in (None, ""):
                out[name] = given[name]
                continue
            ref = self._bare_ref(value)
            if ref is not None:
                value = self.get_value(ref)
            elif isinstance(value, str) and find_refs(value):
                value = self.render(value)
            out[name] = value.text if isinstance(value, LazyText) else value
        return out

    def _invoke(self, **kwargs: Any) -> None:
        program = self.tool_arguments(kwargs)
        arguments = self._program_arguments(kwargs)
        self.inputs_seen = {"lang": program["lang"], "arguments": arguments}
        try:
            language = sandbox.language_of(program["lang"])
        except ValueError as e:
            raise self.fail(str(e), retryable=False) from None
        if not isinstance(program["script"], str) or not program["script"].strip():
            raise self.fail("script is empty; write a program with a main function", retryable=False)
        limits = sandbox.SandboxLimits.from_mapping(self.settings())
        try:
            result = sandbox.run_program(
                language, program["script"], arguments, deadline=self._canvas.deadline, limits=limits
            )
        except sandbox.SandboxError as e:
            self.set_output("stdout", e.stdout[:_PRINT_CAP])
            self.set_output("stderr", e.stderr[:_PRINT_CAP])
            raise ComponentError(f"{self.id}: {e}", retryable=False) from None
        name = business_output(self._param.outputs)
        expected = expected_type(self._param.outputs)
        if not fits(expected, result.value):
            raise self.fail(
                f"main() returned {type_of(result.value)}, but output {name!r} is declared {expected}; "
                f"return a {expected} or change the output's type",
                retryable=False,
            )
        self.set_output(name, result.value)
        self.set_output("actual_type", type_of(result.value))
        if name != "content":
            self.set_output("content", as_text(result.value))
        self.set_output("stdout", result.stdout[:_PRINT_CAP])
        self.set_output("stderr", result.stderr[:_PRINT_CAP])
