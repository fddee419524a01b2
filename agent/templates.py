"""Rendering params that hold references, optionally with jinja2 syntax.

Values are *data*, never template source: a value holding backslashes, braces or
``{{ jinja }}`` is inserted literally. References are replaced by placeholders that
jinja2 fills from its context, so the only template source jinja2 ever compiles is
what the DSL's author wrote. jinja2 runs in its ``SandboxedEnvironment``.

A template without ``{{``/``{%`` skips jinja2 entirely (plain substitution, done with a
function so backslashes in values never act as regex group references).

Limits (docs/design.md §11: no template can exhaust a worker), through the sandbox's own hooks:

* ``*``, ``**``, ``+``, ``%`` and ``~`` are intercepted: a result that would be over
  :data:`MAX_OUTPUT` characters (or items), or a power over :data:`MAX_INT_BITS` bits,
  is refused *before* it is computed. Intercepted operators are never folded when
  jinja2 compiles, and filters are never run at compile time either (every filter is
  wrapped as a context filter), so compiling costs nothing whatever the template says;
  :func:`check_template` evaluates the constant parts itself, with the same limits,
  so ``{{ 'x' * 10**10 }}`` is a ``DSLError`` when the DSL is saved.
* ``range`` gives at most :data:`MAX_ITERATIONS` items, and every ``for`` loop of a
  render shares a budget of :data:`MAX_ITERATIONS` iterations.
* Growing filters and methods (``center``, ``indent``, ``wordwrap``, ``ljust``,
  ``zfill``, ``replace``, ``join``, ``format``...) refuse widths over
  :data:`MAX_WIDTH` and results over :data:`MAX_OUTPUT`.
* A render stops past :data:`MAX_OUTPUT` characters of output, and obeys the turn's
  deadline and cancel (checked every :data:`CHECK_EVERY` iterations and outputs).

Over a limit, a render raises :class:`~agent.errors.TemplateLimitError` naming it.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

from jinja2 import TemplateSyntaxError, nodes, pass_context
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment
from jinja2.utils import _PassArg
from jinja2.visitor import NodeTransformer

from agent.deadline import Deadline
from agent.errors import DSLError, TemplateLimitError
from agent.refs import REF_RE, Ref, _parse_body, sole_ref, to_text
from agent.stream import LazyText

Lookup = Callable[[Ref], Any]

#: The most characters (or list items) one value or one render's output may have.
MAX_OUTPUT = 1_000_000
#: The most iterations of all ``for`` loops in one render, and the longest ``range``.
MAX_ITERATIONS = 100_000
#: The widest a filter or method may pad or wrap (``center``, ``indent``, ``ljust``...).
MAX_WIDTH = 10_000
#: The largest integer a power may make.
MAX_INT_BITS = 4096
#: Deadline checks every this many loop iterations.
CHECK_EVERY = 256

_SIZED = (str, list, tuple)
_WIDE_FORMAT = re.compile(r"\d{5,}")
_GROWING_FILTERS = {"center", "indent", "wordwrap", "batch", "slice", "format", "replace", "join", "truncate"}
_GROWING_METHODS = {
    "center",
    "ljust",
    "rjust",
    "zfill",
    "expandtabs",
    "replace",
    "join",
    "format",
    "format_map",
}


class _Budget(threading.local):
    """The running render's deadline and iteration count (one render per thread at a time)."""

    deadline: Deadline | None = None
    iterations: int = 0


_budget = _Budget()


def _over(what: str, size: float, limit: int = MAX_OUTPUT) -> TemplateLimitError:
    return TemplateLimitError(
        f"the template's {what} would be {size:,.0f} long; the limit is {limit:,} (template limits)"
    )


def _guarded_binop(op: str, left: Any, right: Any) -> Any:
    """``left op right`` if its result stays within the limits; else ``TemplateLimitError``."""
    if op == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, _SIZED) and isinstance(times, int) and not isinstance(times, bool):
                if len(seq) * max(times, 0) > MAX_OUTPUT:
                    raise _over("repetition", len(seq) * times)
        if (
            _is_int(left)
            and _is_int(right)
            and abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS
        ):
            raise _over("product", abs(left).bit_length() + abs(right).bit_length(), MAX_INT_BITS)
        return left * right
    if op == "**":
        if _is_int(left) and _is_int(right) and abs(left) > 1 and right > 0:
            if right * math.log2(abs(left)) > MAX_INT_BITS:
                raise _over("power (in bits)", right * math.log2(abs(left)), MAX_INT_BITS)
        return left**right
    if op == "+":
        if isinstance(left, _SIZED) and isinstance(right, _SIZED) and len(left) + len(right) > MAX_OUTPUT:
            raise _over("concatenation", len(left) + len(right))
        return left + right
    if op == "%":
        if isinstance(left, str) and _WIDE_FORMAT.search(left):
            raise TemplateLimitError(f"a %-format width over {MAX_WIDTH:,} is refused (template limits)")
        result = left % right
        if isinstance(result, str) and len(result) > MAX_OUTPUT:
            raise _over("formatted text", len(result))
        return result
    raise SecurityError(f"operator {op!r} is not allowed")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_widths(name: str, args: tuple, kwargs: dict) -> None:
    for value in (*args, *kwargs.values()):
        if _is_int(value) and abs(value) > MAX_WIDTH:
            raise TemplateLimitError(f"{name}({value}) is wider than {MAX_WIDTH:,} (template limits)")
        if isinstance(value, str) and name in ("format", "format_map") and _WIDE_FORMAT.search(value):
            raise TemplateLimitError(f"a format width over {MAX_WIDTH:,} is refused (template limits)")


def _check_growth(name: str, subject: Any, args: tuple) -> None:
    """Refuse ``replace`` and ``join`` whose result would be over the limit (computed cheaply)."""
    if name == "replace" and isinstance(subject, str) and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        grows = (subject.count(old) if old else len(subject) + 1) * max(0, len(new) - len(old))
        if len(subject) + grows > MAX_OUTPUT:
            raise _over("replacement", len(subject) + grows)
    if name == "join" and isinstance(subject, str) and args and isinstance(args[0], (list, tuple)):
        items = args[0]
        size = sum(len(i) if isinstance(i, str) else 8 for i in items) + len(subject) * len(items)
        if size > MAX_OUTPUT:
            raise _over("joined text", size)


def _guard_iteration() -> None:
    _budget.iterations += 1
    if _budget.iterations > MAX_ITERATIONS:
        raise TemplateLimitError(
            f"the template's loops ran more than {MAX_ITERATIONS:,} times (template limits)"
        )
    if _budget.iterations % CHECK_EVERY == 0 and _budget.deadline is not None:
        _budget.deadline.check()


def _iter_guard(iterable: Any) -> Iterator[Any]:
    """What every ``for`` loop iterates: the items, counted against the render's budget."""
    for item in iterable:
        _guard_iteration()
        yield item


def _bounded_range(*args: int) -> range:
    items = range(*args)
    if len(items) > MAX_ITERATIONS:
        raise TemplateLimitError(
            f"range() of {len(items):,} items; the limit is {MAX_ITERATIONS:,} (template limits)"
        )
    return items


def _concat(*parts: Any) -> str:
    texts = [p if isinstance(p, str) else to_text(p) for p in parts]
    size = sum(map(len, texts))
    if size > MAX_OUTPUT:
        raise _over("joined text (~)", size)
    return "".join(texts)


class _LimitedEnvironment(SandboxedEnvironment):
    """The sandbox with the module's limits (see the module docstring)."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        return _guarded_binop(operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja2's signature
        name = getattr(__obj, "__name__", "")
        subject = getattr(__obj, "__self__", None)
        if isinstance(subject, _SIZED) and name in _GROWING_METHODS:
            _check_widths(name, args, kwargs)
            _check_growth(name, subject, args)
        return SandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs)

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        return _Guards().visit(super()._parse(source, name, filename))


class _Guards(NodeTransformer):
    """Every ``for`` loop iterates through ``__iter_guard``; every ``~`` is ``__concat``."""

    def visit_For(self, node: nodes.For) -> nodes.Node:  # noqa: N802 - jinja2's visitor names
        self.generic_visit(node)
        node.iter = nodes.Call(nodes.Name("__iter_guard", "load"), [node.iter], [], None, None)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:  # noqa: N802 - jinja2's visitor names
        self.generic_visit(node)
        return nodes.Call(nodes.Name("__concat", "load"), list(node.nodes), [], None, None)


def _check_filter(name: str, value: Any, args: tuple, kwargs: dict) -> None:
    _check_widths(name, args, kwargs)
    if name == "replace":
        _check_growth("replace", value, args)
    elif name == "join" and isinstance(value, (list, tuple)):
        separator = str(args[0]) if args else str(kwargs.get("d", ""))
        _check_growth("join", separator, (value,))


def _wrap_filter(name: str, func: Callable) -> Callable:
    """The filter as a context filter (so jinja2 never runs it while compiling), with limits."""
    growing = name in _GROWING_FILTERS
    passes = _PassArg.from_obj(func)

    @pass_context
    def wrapped(context: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        if growing:
            _check_filter(name, value, args, kwargs)
        if passes is _PassArg.context:
            result = func(context, value, *args, **kwargs)
        elif passes is _PassArg.eval_context:
            result = func(context.eval_ctx, value, *args, **kwargs)
        elif passes is _PassArg.environment:
            result = func(context.environment, value, *args, **kwargs)
        else:
            result = func(value, *args, **kwargs)
        if isinstance(result, _SIZED) and len(result) > MAX_OUTPUT:
            raise _over(f"|{name} result", len(result))
        return result

    return wrapped


_env = _LimitedEnvironment(autoescape=False, keep_trailing_newline=True)
_env.globals["range"] = _bounded_range
_env.globals["__iter_guard"] = _iter_guard
_env.globals["__concat"] = _concat
_env.filters = {name: _wrap_filter(name, func) for name, func in _env.filters.items()}


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
        tree = _env.parse(source)
    except TemplateSyntaxError as e:
        raise DSLError(f"template {template[:60]!r} is not valid jinja2: {e.message}") from None
    try:
        _check_constants(tree)
    except TemplateLimitError as e:
        raise DSLError(f"template {template[:60]!r} is refused: {e}") from None
    return _env.from_string(tree), tuple(refs)


def _check_constants(tree: nodes.Template) -> None:
    """Evaluate the template's constant expressions with the render's limits.

    jinja2 never computes them while compiling (see the module docstring); this is
    what refuses ``{{ 'x' * 10**10 }}`` when the DSL is saved rather than when it runs.
    """
    for node in tree.find_all((nodes.BinExpr, nodes.Filter, nodes.Call)):
        try:
            _constant(node)
        except nodes.Impossible:
            pass


def _constant(node: nodes.Node) -> Any:
    """The value of a constant expression, computed within the limits; ``Impossible`` else."""
    if isinstance(node, nodes.Const):
        return node.value
    if isinstance(node, (nodes.List, nodes.Tuple)):
        items = [_constant(n) for n in node.items]
        return items if isinstance(node, nodes.List) else tuple(items)
    if isinstance(node, nodes.Neg):
        return -_constant(node.node)
    if isinstance(node, nodes.BinExpr):
        left, right = _constant(node.left), _constant(node.right)
        if node.operator in _LimitedEnvironment.intercepted_binops:
            return _guarded_binop(node.operator, left, right)
        try:
            return nodes.BinExpr.as_const(nodes.BinExpr(nodes.Const(left), nodes.Const(right)))
        except Exception:  # noqa: BLE001 - not computable now: the render will say
            raise nodes.Impossible() from None
    if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name) and node.node.name == "__concat":
        return _concat(*[_constant(n) for n in node.args])
    if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name) and node.node.name == "range":
        return _bounded_range(*[_constant(n) for n in node.args])
    if (
        isinstance(node, nodes.Call)
        and isinstance(node.node, nodes.Getattr)
        and node.node.attr in _GROWING_METHODS
    ):
        subject = _constant(node.node.node)
        args = tuple(_constant(n) for n in node.args)
        _check_widths(node.node.attr, args, {k.key: _constant(k.value) for k in node.kwargs})
        _check_growth(node.node.attr, subject, args)
    if isinstance(node, nodes.Filter) and node.node is not None and node.name in _GROWING_FILTERS:
        args = tuple(_constant(n) for n in node.args)
        kwargs = {k.key: _constant(k.value) for k in node.kwargs}
        try:
            value = _constant(node.node)
        except nodes.Impossible:
            value = None
        _check_filter(node.name, value, args, kwargs)
    raise nodes.Impossible()


def check_template(template: str) -> None:
    """Raise ``DSLError`` if the template's jinja2 syntax is broken or a constant part of
    it is over the limits (load-time check)."""
    if isinstance(template, str) and uses_jinja(template):
        _compile(template)


def _render_jinja(compiled: Any, values: list, deadline: Deadline | None) -> str:
    """Render within the limits: output size, loop budget, the deadline."""
    saved = (_budget.deadline, _budget.iterations)
    _budget.deadline, _budget.iterations = deadline, 0
    try:
        out: list[str] = []
        size = 0
        for n, piece in enumerate(compiled.generate(__ref=values), 1):
            size += len(piece)
            if size > MAX_OUTPUT:
                raise _over("output", size)
            out.append(piece)
            if deadline is not None and n % CHECK_EVERY == 0:
                deadline.check()
        return "".join(out)
    finally:
        _budget.deadline, _budget.iterations = saved


def render(template: Any, lookup: Lookup, deadline: Deadline | None = None) -> str:
    """Render a template string to text (within ``deadline``, if given)."""
    if type(template) is str and "{" not in template:
        return template  # no reference and no jinja2: the text as it is
    return "".join(render_stream(template, lookup, deadline))


def render_value(template: Any, lookup: Lookup, deadline: Deadline | None = None) -> Any:
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
    return render(template, lookup, deadline)


def render_stream(template: Any, lookup: Lookup, deadline: Deadline | None = None) -> Iterator[str]:
    """Render, yielding literal text and the chunks of streamed (``LazyText``) values."""
    if template is None:
        return
    if not isinstance(template, str):
        yield to_text(template)
        return
    if "{" not in template:  # no reference and no jinja2
        if template:
            yield template
        return
    if uses_jinja(template):
        compiled, names = _compile(template)
        values = []
        for name in names:
            value = lookup(_parse_body(name))
            values.append(value.text if isinstance(value, LazyText) else to_text(value))
        yield _render_jinja(compiled, values, deadline)
        return
    ready: list[str] = []  # text known now goes out as one chunk
    for piece in _pieces(template):
        if isinstance(piece, str):
            ready.append(piece)
            continue
        value = lookup(piece)
        if isinstance(value, LazyText):
            if ready:
                yield "".join(ready)
                ready = []
            yield from value
        else:
            ready.append(to_text(value))
    text = "".join(ready)
    if text:
        yield text


@lru_cache(maxsize=1024)
def _pieces(template: str) -> tuple[str | Ref, ...]:
    """A template without jinja2 syntax as its literal text and its references, in order."""
    pieces: list[str | Ref] = []
    pos = 0
    for m in REF_RE.finditer(template):
        if m.start() > pos:
            pieces.append(template[pos : m.start()])
        pieces.append(_parse_body(m.group(1)))
        pos = m.end()
    if pos < len(template):
        pieces.append(template[pos:])
    return tuple(pieces)
