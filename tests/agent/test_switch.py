"""Switch: every operator, and/or, the else branch, references, DSL errors, failures."""

from __future__ import annotations

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError
from tests.agent.dsl_helpers import answer, final, make_dsl, node, outputs_of, ran, run, run_dsl

UNSAFE = "{{ ''.__class__.__mro__ }}"


def switch(conditions, end=("Message:No",), **params):
    return node(
        "Switch:S",
        "Switch",
        {"conditions": conditions, "end_cpn_ids": list(end), **params},
        downstream=["Message:Yes", "Message:No"],
    )


def branches(*extra):
    return (
        node("Message:Yes", "Message", {"content": ["yes"]}, downstream=[]),
        node("Message:No", "Message", {"content": ["no"]}, downstream=[]),
        *extra,
    )


def cond(*items, logic="and", to=("Message:Yes",)):
    return {"logical_operator": logic, "items": list(items), "to": list(to)}


def item(cpn_id, operator, value=""):
    return {"cpn_id": cpn_id, "operator": operator, "value": value}


def route(left, operator, value, **variables):
    """Which branch the Switch takes for ``env.x <operator> value``."""
    declared = {"x": {"type": "any", "value": left}}
    declared.update({k: {"type": "any", "value": v} for k, v in variables.items()})
    dsl = make_dsl(switch([cond(item("env.x", operator, value))]), *branches(), variables=declared)
    _, events = run_dsl(dsl, "q")
    assert final(events)["status"] == "succeeded", final(events)
    return answer(events)


@pytest.mark.parametrize(
    ("left", "operator", "value", "expected"),
    [
        # contains / not contains: text ignores case; lists hold elements; objects hold keys
        ("Hello World", "contains", "world", "yes"),
        ("Hello World", "contains", "planet", "no"),
        (["red", "Green"], "contains", "green", "yes"),
        (["red", "green"], "contains", "blue", "no"),
        ({"k": 1}, "contains", "k", "yes"),
        (None, "contains", "a", "no"),
        ("Hello World", "not contains", "planet", "yes"),
        ("Hello World", "not contains", "WORLD", "no"),
        (["a"], "not contains", "b", "yes"),
        # start with / end with, ignoring case
        ("Invoice 42", "start with", "invoice", "yes"),
        ("Invoice 42", "start with", "42", "no"),
        ("report.PDF", "end with", ".pdf", "yes"),
        ("report.pdf", "end with", ".doc", "no"),
        # empty / not empty: None, "", [], {} are empty; 0 and false are values
        (None, "empty", "", "yes"),
        ("", "empty", "", "yes"),
        ([], "empty", "", "yes"),
        ({}, "empty", "", "yes"),
        (0, "empty", "", "no"),
        (False, "empty", "", "no"),
        ("x", "empty", "", "no"),
        ("x", "not empty", "", "yes"),
        (0, "not empty", "", "yes"),
        ([], "not empty", "", "no"),
        # = / ≠ (and !=): a number on the left compares the right as a number
        (5, "=", "5", "yes"),
        (5, "=", "5.0", "yes"),
        (5, "=", "6", "no"),
        (5, "=", "five", "no"),
        ("abc", "=", "abc", "yes"),
        ("abc", "=", "ABC", "no"),
        (True, "=", "true", "yes"),
        (False, "=", "true", "no"),
        (5, "≠", "6", "yes"),
        (5, "≠", "5", "no"),
        (5, "!=", "6", "yes"),
        ("a", "!=", "a", "no"),
        (5, "≠", "five", "yes"),
        # ordering: numbers (numeric text too); text vs text alphabetically; else false
        (10, ">", "9", "yes"),
        (9, ">", "10", "no"),
        ("10", ">", "9", "yes"),
        (2.5, "<", "3", "yes"),
        (3, "<", "3", "no"),
        (3, "≥", "3", "yes"),
        (2, "≥", "3", "no"),
        (3, ">=", "3", "yes"),
        (3, "≤", "3", "yes"),
        (4, "≤", "3", "no"),
        (3, "<=", "3", "yes"),
        ("2024-05-01", ">", "2023-12-31", "yes"),
        ("apple", "<", "banana", "yes"),
        # a right value that is not a number with an ordering operator: false, no error
        (5, ">", "abc", "no"),
        (5, "<", "abc", "no"),
        (5, "≥", "", "no"),
        (None, "<", "3", "no"),
    ],
)
def test_every_operator(left, operator, value, expected):
    assert route(left, operator, value) == expected


def test_a_referenced_value_keeps_its_type_and_text_is_rendered():
    # {env.limit} is the raw number 18; "{env.unit}s" is rendered text
    assert route(20, "≥", "{env.limit}", limit=18) == "yes"
    assert route(17, "≥", "{env.limit}", limit=18) == "no"
    assert route("10 items", "=", "10 {env.unit}s", unit="item") == "yes"
    assert route(["x", "y"], "contains", "{env.pick}", pick="y") == "yes"


def test_the_first_condition_that_holds_wins_and_and_or_combine_items():
    dsl = make_dsl(
        node(
            "Switch:S",
            "Switch",
            {
                "conditions": [
                    cond(
                        item("sys.query", "contains", "a"),
                        item("sys.query", "contains", "b"),
                        to=["Message:AB"],
                    ),
                    cond(
                        item("sys.query", "contains", "a"),
                        item("sys.query", "contains", "c"),
                        logic="or",
                        to=["Message:AorC"],
                    ),
                    cond(item("sys.query", "not empty"), to=["Message:Any"]),
                ],
                "end_cpn_ids": ["Message:Else"],
            },
            downstream=["Message:AB", "Message:AorC", "Message:Any", "Message:Else"],
        ),
        *(
            node(f"Message:{n}", "Message", {"content": [n]}, downstream=[])
            for n in ("AB", "AorC", "Any", "Else")
        ),
    )
    canvas = Canvas(dsl)
    assert answer(run(canvas, "ab")) == "AB"
    assert answer(run(canvas, "a")) == "AorC"
    assert answer(run(canvas, "c")) == "AorC"
    assert answer(run(canvas, "zzz")) == "Any"
    assert answer(run(canvas, "")) == "Else"


def test_only_the_chosen_branch_runs_and_next_is_an_output():
    dsl = make_dsl(switch([cond(item("sys.query", "=", "go"))]), *branches())
    canvas = Canvas(dsl)
    events = run(canvas, "go")
    assert ran(events) == ["begin", "Switch:S", "Message:Yes"]
    assert outputs_of(events, "Switch:S")["_next"] == ["Message:Yes"]
    events = run(canvas, "stop")
    assert ran(events) == ["begin", "Switch:S", "Message:No"]
    assert outputs_of(events, "Switch:S")["_next"] == ["Message:No"]


@pytest.mark.parametrize("cpn_id", ["begin@age", "{begin@age}", " { begin@age } "])
def test_cpn_id_is_a_bare_reference_with_optional_braces(cpn_id):
    dsl = make_dsl(
        switch([cond(item(cpn_id, ">", "17"))]),
        *branches(),
        begin={"inputs": {"age": {"name": "Age", "type": "integer"}}},
    )
    canvas = Canvas(dsl)
    assert answer(run(canvas, "", inputs={"age": 30})) == "yes"
    assert answer(run(canvas, "", inputs={"age": 12})) == "no"


def test_switch_on_a_form_answer_after_resuming():
    dsl = make_dsl(
        node("UserFillUp:Ask", "UserFillUp", {"inputs": {"plan": {"name": "Plan", "type": "line"}}}),
        switch([cond(item("UserFillUp:Ask@plan", "=", "pro"))]),
        *branches(),
    )
    canvas = Canvas(dsl)
    assert final(run(canvas, "hi"))["inputs"]["plan"]["type"] == "line"
    canvas = Canvas(str(canvas))
    assert answer(run(canvas, inputs={"plan": "pro"})) == "yes"


def test_branch_targets_count_as_reachable():
    # Message:Yes and Message:No are linked only through the Switch's conditions.
    dsl = make_dsl(
        node("Message:Intro", "Message", {"content": ["intro"]}),
        switch([cond(item("sys.query", "=", "loop"))], end=["Message:No"]),
        node("Message:Yes", "Message", {"content": ["yes"]}, downstream=[]),
        node("Message:No", "Message", {"content": ["no"]}, downstream=[]),
    )
    dsl["components"]["Switch:S"]["downstream"] = []
    canvas = Canvas(dsl)
    assert canvas.warnings == []
    assert answer(run(canvas, "loop")) == "intro\n\nyes"


# ---------------------------------------------------------------- DSL errors at load
def _load_error(conditions=None, end=("Message:No",), **params):
    conditions = conditions if conditions is not None else [cond(item("sys.query", "=", "x"))]
    with pytest.raises(DSLError) as err:
        Canvas(make_dsl(switch(conditions, end=end, **params), *branches()))
    return str(err.value)


@pytest.mark.parametrize(
    ("conditions", "fragment"),
    [
        ([], "Switch:S: conditions must be a non-empty list"),
        (
            [cond(item("sys.query", "=", "x")), cond(item("sys.query", "like", "x"))],
            "Switch:S: condition 2, item 1: unknown operator 'like'",
        ),
        ([cond(item("sys.query", "=", "x"), to=())], "Switch:S: condition 1 has an empty 'to'"),
        (
            [cond(item("sys.query", "=", "x")), cond(item("sys.query", "=", "y"), logic="xor")],
            "Switch:S: condition 2: logical_operator 'xor' is not 'and' or 'or'",
        ),
        ([cond()], "Switch:S: condition 1 has no items"),
        ([cond(item("", "=", "x"))], "condition 1, item 1: cpn_id '' is not a reference"),
        ([cond(item("age", "=", "x"))], "condition 1, item 1: cpn_id 'age' is not a reference"),
        (["x"], "Switch:S: condition 1 must be an object"),
        (
            [cond(item("LLM:Gone@content", "=", "x"))],
            "Switch:S: reference {LLM:Gone@content} names unknown component 'LLM:Gone'",
        ),
        ([cond(item("env.nope", "=", "x"))], "Switch:S: reference {env.nope} names undeclared variable"),
        (
            [cond(item("sys.query", "=", "{Agent:Gone@content}"))],
            "Switch:S: reference {Agent:Gone@content} names unknown component",
        ),
    ],
)
def test_bad_conditions_are_dsl_errors_naming_the_condition(conditions, fragment):
    assert fragment in _load_error(conditions)


def test_the_else_branch_is_required_and_must_exist():
    assert "end_cpn_ids (the else branch) is empty" in _load_error(end=())
    # As RAGFlow, a branch to a missing component loads (tests/agent/test_leniency.py).
    canvas = Canvas(make_dsl(switch([cond(item("sys.query", "=", "x"))], end=["Message:Gone"]), *branches()))
    assert canvas.warnings[0].startswith(
        "Switch:S: the else branch (end_cpn_ids) routes to missing component"
    )


def test_a_value_that_only_looks_like_a_reference_is_text():
    assert route("me@example.com", "=", "me@example.com") == "yes"


# ---------------------------------------------------------------- failures at run time
def _failing_switch(**params):
    return make_dsl(
        switch([cond(item("sys.query", "=", UNSAFE))], **params),
        *branches(node("Message:Fallback", "Message", {"content": ["fallback"]}, downstream=[])),
    )


def test_a_failure_ends_the_run_failed_with_the_message():
    canvas = Canvas(_failing_switch())
    before = str(canvas)
    data = final(run(canvas, "q"))
    assert data["status"] == "failed"
    assert data["error"].startswith("Switch:S:") and "unsafe" in data["error"]
    assert str(canvas) == before


def test_exception_goto_routes_to_the_fallback():
    events = run(Canvas(_failing_switch(exception_method="goto", exception_goto=["Message:Fallback"])), "q")
    assert final(events)["status"] == "succeeded"
    assert answer(events) == "fallback"
    assert "unsafe" in outputs_of(events, "Switch:S")["_ERROR"]


def test_exception_comment_takes_the_else_branch_not_every_branch():
    events = run(Canvas(_failing_switch(exception_method="comment", exception_default_value="n/a")), "q")
    assert final(events)["status"] == "succeeded"
    assert ran(events).count("Message:Yes") == 0
    assert "Message:No" in ran(events)
    assert outputs_of(events, "Switch:S")["content"] == "n/a"
    assert "unsafe" in outputs_of(events, "Switch:S")["_ERROR"]


@pytest.mark.parametrize(
    ("left", "operator", "right", "holds"),
    [
        ("5", "=", 5, True),
        ("5.0", "=", 5, True),
        ("five", "=", 5, False),
        ("5", "≠", 5, False),
        (7, "=", "7", True),
        ("x", "=", "x", True),
    ],
)
def test_equality_reads_numeric_text_against_a_number_from_either_side(left, operator, right, holds):
    from agent.conditions import compare

    assert compare(left, operator, right) is holds
