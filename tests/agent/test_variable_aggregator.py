"""VariableAggregator: per group the first non-empty value; DSL errors."""

from __future__ import annotations

import json

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError
from tests.agent.dsl_helpers import answer, final, make_dsl, node, outputs_of, run

FORM = {
    "inputs": {
        "a": {"name": "A", "type": "object", "optional": True},
        "b": {"name": "B", "type": "object", "optional": True},
    }
}


def aggregator(*groups):
    return node("VariableAggregator:A", "VariableAggregator", {"groups": list(groups)})


def group(name, *refs, vtype="string"):
    return {"group_name": name, "type": vtype, "variables": [{"value": r} for r in refs]}


def aggregate(a, b, query="q"):
    """The ``out`` group over ``begin@a``, ``begin@b``, ``sys.query``."""
    dsl = make_dsl(aggregator(group("out", "begin@a", "{begin@b}", "sys.query")), begin=FORM)
    inputs = {k: v for k, v in (("a", a), ("b", b)) if v is not None}
    events = run(Canvas(dsl), query, inputs=inputs)
    assert final(events)["status"] == "succeeded", final(events)
    return outputs_of(events, "VariableAggregator:A")["out"]


@pytest.mark.parametrize(
    ("a", "b", "query", "expected"),
    [
        ({"x": 1}, "second", "q", {"x": 1}),
        (None, "second", "q", "second"),
        ("", "second", "q", "second"),
        ([], "second", "q", "second"),
        ({}, [1], "q", [1]),
        (None, None, "the query", "the query"),
        (None, None, "", None),
        # 0 and false are values, not empty
        (0, "second", "q", 0),
        (False, "second", "q", False),
    ],
)
def test_the_first_non_empty_value_wins(a, b, query, expected):
    # Begin's object fields take JSON text, so the values travel as JSON.
    got = aggregate(None if a is None else json.dumps(a), None if b is None else json.dumps(b), query)
    assert got == expected


def test_each_group_is_its_own_output():
    dsl = make_dsl(
        aggregator(group("first", "begin@a", "sys.query"), group("second", "begin@b", "sys.query")),
        node(
            "Message:M",
            "Message",
            {"content": ["{VariableAggregator:A@first}|{VariableAggregator:A@second}"]},
        ),
        begin=FORM,
    )
    events = run(Canvas(dsl), "fallback", inputs={"a": '"A"'})
    assert answer(events) == "A|fallback"


def test_joins_the_branch_that_ran():
    # Only one branch of the Switch runs; the aggregator picks whichever produced a value.
    dsl = make_dsl(
        node(
            "Switch:S",
            "Switch",
            {
                "conditions": [
                    {
                        "logical_operator": "and",
                        "items": [{"cpn_id": "sys.query", "operator": "contains", "value": ","}],
                        "to": ["StringTransform:Commas"],
                    }
                ],
                "end_cpn_ids": ["StringTransform:Spaces"],
            },
            downstream=["StringTransform:Commas", "StringTransform:Spaces"],
        ),
        node(
            "StringTransform:Commas",
            "StringTransform",
            {"method": "split", "split_ref": "sys.query", "delimiters": [","]},
            downstream=["VariableAggregator:A"],
        ),
        node(
            "StringTransform:Spaces",
            "StringTransform",
            {"method": "split", "split_ref": "sys.query", "delimiters": [" "]},
            downstream=["VariableAggregator:A"],
        ),
        aggregator(group("words", "StringTransform:Commas@result", "StringTransform:Spaces@result")),
        node("Message:M", "Message", {"content": ["{VariableAggregator:A@words}"]}),
    )
    canvas = Canvas(dsl)
    assert answer(run(canvas, "a,b")) == '["a", "b"]'
    assert answer(run(canvas, "c d e")) == '["c", "d", "e"]'


def test_a_group_with_no_value_reads_empty():
    dsl = make_dsl(
        aggregator(group("out", "begin@a", "begin@b")),
        node("Message:M", "Message", {"content": ["[{VariableAggregator:A@out}]"]}),
        begin=FORM,
    )
    assert answer(run(Canvas(dsl), "q")) == "[]"


@pytest.mark.parametrize(
    ("groups", "fragment"),
    [
        ([], "VariableAggregator:A: groups must be a non-empty list"),
        ([group("", "sys.query")], "group 1 has no group_name"),
        ([group("g", "sys.query"), group("g", "sys.query")], "group 2: group_name 'g' is used twice"),
        ([group("g")], "group 'g': variables must be a non-empty list"),
        ([group("g", "sys.query", "plain text")], "group 'g', variable 2: 'plain text' is not a reference"),
        ([group("g", "LLM:Gone@content")], "reference {LLM:Gone@content} names unknown component 'LLM:Gone'"),
        (["g"], "group 1 must be an object"),
    ],
)
def test_bad_groups_are_dsl_errors(groups, fragment):
    with pytest.raises(DSLError) as err:
        Canvas(make_dsl(aggregator(*groups)))
    assert fragment in str(err.value)


def test_plain_reference_strings_are_accepted_as_variables():
    dsl = make_dsl(
        aggregator({"group_name": "g", "variables": ["begin@a", "sys.query"]}),
        node("Message:M", "Message", {"content": ["{VariableAggregator:A@g}"]}),
        begin=FORM,
    )
    assert answer(run(Canvas(dsl), "q")) == "q"
