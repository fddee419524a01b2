"""Templates cannot exhaust a worker (docs/design.md §11, issue 8 point 1).

Constant expressions are refused when the DSL is loaded (jinja2 would otherwise fold
them while compiling); what only shows at run time is refused before it is computed;
every render has bounded output and loop iterations and obeys the turn's cancel.
"""

from __future__ import annotations

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError
from agent.templates import MAX_ITERATIONS, MAX_OUTPUT
from tests.agent.dsl_helpers import answer, final, make_dsl, node, run


def message(template: str) -> dict:
    return make_dsl(node("Message:Out", "Message", {"content": [template]}))


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{{ 'x' * 10**10 }}", "repetition would be 10,000,000,000 long"),
        ("{{ 'x' * 150000000 }}", "repetition would be 150,000,000 long"),
        ("{{ [0] * 10**9 }}", "repetition"),
        ("{{ 9 ** 999999 }}", "power"),
        ("{{ 'x'|center(10**9) }}", "center(1000000000) is wider than"),
        ("{{ 'x'.ljust(10**9) }}", "ljust(1000000000) is wider than"),
        ("{{ '%0999999999d' % 1 }}", "%-format width"),
        ("{{ ('ab' ~ 'c' * 600000) ~ ('d' * 600000) }}", "joined text"),
        ("{% for i in range(10**8) %}{% endfor %}", "range() of 100,000,000 items"),
    ],
)
def test_constant_bombs_are_refused_when_the_dsl_is_loaded(template, says):
    with pytest.raises(DSLError) as err:
        Canvas(message(template))
    assert str(err.value).startswith("Message:Out: template")
    assert says in str(err.value) and "template limits" in str(err.value)


@pytest.mark.parametrize(
    ("template", "says"),
    [
        # each doubles a string held in a namespace: 2**40 characters if nothing stops it
        (
            "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
            "{% endfor %}{{ ns.s|length }}",
            "joined text (~)",
        ),
        ("{% set n = 10 %}{{ 'x' * (10 ** n) }}", "repetition"),
        ("{% set s = 'x' * 1000 %}{{ s.replace('x', s).replace('x', s) }}", "replacement"),
        (
            "{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}",
            "loops ran more than",
        ),
        ("{% set s = 'x' * 900000 %}{{ s }}{{ s }}", "output would be 1,800,000 long"),
    ],
)
def test_bombs_that_show_only_when_rendering_end_the_turn_with_a_clear_error(template, says):
    events = run(Canvas(message(template)), "10")
    ending = final(events)
    assert ending["status"] == "failed"
    assert ending["error"].startswith("Message:Out: ") and says in ending["error"], ending["error"]


def test_ordinary_templates_still_render():
    template = (
        "{{ 'hello' ~ ' ' }}{sys.query} {{ 3 * 4 }} {{ 2 ** 10 }} "
        "{% for i in range(3) %}{{ i }}{% endfor %} {{ 'a,b'|replace(',', ';') }} "
        "{{ ['a', 'b']|join('-') }} {{ 'x'|center(5) }}|"
    )
    assert answer(run(Canvas(message(template)), "you")) == "hello you 12 1024 012 a;b a-b   x  |"


def test_limits_are_a_few_mb():
    assert MAX_OUTPUT <= 4_000_000 and MAX_ITERATIONS <= 1_000_000


def test_a_render_obeys_a_cancel():
    canvas = Canvas(message("{% for i in range(90000) %}{{ i }}{% endfor %}"))
    asked = []

    def cancel() -> bool:
        asked.append(1)
        return len(asked) > 2  # the run loop asks twice before the Message renders

    canvas.cancel_check = cancel
    assert final(run(canvas, "go"))["status"] == "cancelled"
