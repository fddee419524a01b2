"""Rendering params that hold references, optionally with jinja2 syntax.

Values are *data*, never template source: a value holding backslashes, braces or
``{{ jinja }}`` is inserted literally. References are replaced by placeholders that
jinja2 fills from its context, so the only template source jinja2 ever compiles is
what the DSL's author wrote. jinja2 runs in its ``SandboxedEnvironment``.

A template without ``{{``/``{%`` skips jinja2 entirely (plain substitution, done with a
function so backslashes in values never act as regex group references).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

from jinja2 import TemplateSyntaxError
from jinja2.sandbox import SandboxedEnvironment

from agent.errors import DSLError
from agent.refs import REF_RE, Ref, _parse_body, sole_ref, to_text
from agent.stream import LazyText

Lookup = Callable[[Ref], Any]

_env = SandboxedEnvironment(autoescape=False, keep_trailing_newline=True)


def uses_jinja(template: str) -> bool:
    return "{{" in template or "{%" in template


@lru_cache(maxsize=512)
def _compile(template: str):
    """Compile an author's template with references turned into ``__ref[i]``."""
    refs: list[str] = []

    def placeholder(m) -> str:
        refs.append(m.group(1))
        return "{{ __ref[" + str(len(refs) - 1) + "] }}"

    source = REF_RE.sub(placeholder, template)
    try:
        return _env.from_string(source), tuple(refs)
    except TemplateSyntaxError as e:
        raise DSLError(f"template {template[:60]!r} is not valid jinja2: {e.message}") from None


def check_template(template: str) -> None:
    """Raise ``DSLError`` if the template's jinja2 syntax is broken (load-time check)."""
    if isinstance(template, str) and uses_jinja(template):
        _compile(template)


def render(template: Any, lookup: Lookup) -> str:
    """Render a template string to text."""
    return "".join(render_stream(template, lookup))


def render_value(template: Any, lookup: Lookup) -> Any:
    """A param's value: the raw value for exactly one reference, else rendered text.

    Non-string params (numbers, lists, dicts) are returned as they are.
    """
    if not isinstance(template, str):
        return template
    ref = sole_ref(template)
    if ref is not None:
        value = lookup(ref)
        return value.text if isinstance(value, LazyText) else value
    if "{" not in template:
        return template
    return render(template, lookup)


def render_stream(template: Any, lookup: Lookup) -> Iterator[str]:
    """Render, yielding literal text and the chunks of streamed (``LazyText``) values."""
    if template is None:
        return
    if not isinstance(template, str):
        yield to_text(template)
        return
    if uses_jinja(template):
        compiled, names = _compile(template)
        values = []
        for name in names:
            value = lookup(_parse_body(name))
            values.append(value.text if isinstance(value, LazyText) else to_text(value))
        yield compiled.render(__ref=values)
        return
    pos = 0
    for m in REF_RE.finditer(template):
        if m.start() > pos:
            yield template[pos : m.start()]
        value = lookup(_parse_body(m.group(1)))
        if isinstance(value, LazyText):
            yield from value
        else:
            text = to_text(value)
            if text:
                yield text
        pos = m.end()
    if pos < len(template):
        yield template[pos:]
