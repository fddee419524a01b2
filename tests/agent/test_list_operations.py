"""ListOperations: nth/head/tail, filter, sort, drop_duplicates; DSL errors; failures."""

from __future__ import annotations

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError
from tests.agent.dsl_helpers import answer, final, make_dsl, node, outputs_of, run

FORM = {"inputs": {"items": {"name": "Items", "type": "object", "optional": True}}}
ITEMS = ["a", "b", "c", "d"]


def list_op(**params):
    return node("ListOperations:L", "ListOperations", {"query": "begin@items", **params})


def outputs(items, query="q", **params):
    """The outputs of one ListOperations run over ``items`` (a Begin input)."""
    events = run(Canvas(make_dsl(list_op(**params), begin=FORM)), query, inputs={"items": items})
    assert final(events)["status"] == "succeeded", final(events)
    return outputs_of(events, "ListOperations:L")


def result(items, **params):
    return outputs(items, **params)["result"]


def failure(items, **params):
    events = run(Canvas(make_dsl(list_op(**params), begin=FORM)), "q", inputs={"items": items})
    data = final(events)
    assert data["status"] == "failed", data
    assert data["error"].startswith("ListOperations:L: ")
    return data["error"]


# ---------------------------------------------------------------- nth / head / tail
@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (1, ["a"]),
        (3, ["c"]),
        (-1, ["d"]),
        (-4, ["a"]),
        (0, []),
        (5, []),
        (-5, []),
        ("2", ["b"]),
        (2.0, ["b"]),
    ],
)
def test_nth_counts_from_one_and_from_the_end(n, expected):
    assert result(ITEMS, operations="nth", n=n) == expected


@pytest.mark.parametrize(
    ("operations", "n", "expected"),
    [
        ("head", 2, ["a", "b"]),
        ("topN", 3, ["a", "b", "c"]),
        ("head", 9, ITEMS),
        ("head", 0, []),
        ("tail", 2, ["c", "d"]),
        ("tail", 9, ITEMS),
        ("tail", -1, []),
    ],
)
def test_head_and_tail(operations, n, expected):
    assert result(ITEMS, operations=operations, n=n) == expected


@pytest.mark.parametrize(
    ("operations", "n"), [("nth", 0), ("nth", 5), ("nth", -5), ("head", 0), ("head", 5), ("tail", 5)]
)
def test_strict_makes_an_out_of_range_n_an_error(operations, n):
    error = failure(ITEMS, operations=operations, n=n, strict=True)
    assert f"{operations}: n={n} is outside the list of 4 items (strict is on)" in error


def test_first_and_last_outputs():
    out = outputs(ITEMS, operations="head", n=3)
    assert (out["first"], out["last"]) == ("a", "c")
    out = outputs(ITEMS, operations="nth", n=9)
    assert out == {"result": [], "first": None, "last": None}


# ---------------------------------------------------------------- filter
@pytest.mark.parametrize(
    ("items", "flt", "expected"),
    [
        (["apple", "Banana", "cherry"], {"operator": "contains", "value": "AN"}, ["Banana"]),
        (["apple", "Banana", "cherry"], {"operator": "not contains", "value": "a"}, ["cherry"]),
        (["apple", "Banana", "cherry"], {"operator": "start with", "value": "b"}, ["Banana"]),
        (["apple", "Banana", "cherry"], {"operator": "end with", "value": "RY"}, ["cherry"]),
        ([1, 5, 10, "x"], {"operator": ">", "value": "4"}, [5, 10]),
        ([1, 5, 10], {"operator": "≤", "value": "5"}, [1, 5]),
        ([1, 5, 10], {"operator": "=", "value": "5"}, [5]),
        ([1, 5, 10], {"operator": "!=", "value": "5"}, [1, 10]),
        (["a", "", None, []], {"operator": "not empty", "value": ""}, ["a"]),
        (["q", "other"], {"operator": "=", "value": "{sys.query}"}, ["q"]),
    ],
)
def test_filter_keeps_the_items_for_which_the_condition_holds(items, flt, expected):
    assert result(items, operations="filter", filter=flt) == expected


# ---------------------------------------------------------------- sort / drop_duplicates
@pytest.mark.parametrize(
    ("items", "params", "expected"),
    [
        ([3, 1, 2], {}, [1, 2, 3]),
        ([3, 1, 2], {"sort_method": "desc"}, [3, 2, 1]),
        (["b", "C", "a"], {}, ["C", "a", "b"]),
        ([2, None, "b", 1, "a"], {}, [1, 2, "a", "b", None]),
        ([2, None, "b", 1, "a"], {"sort_method": "desc"}, ["b", "a", 2, 1, None]),
        (
            [{"n": "x", "age": 30}, {"n": "y", "age": 20}, {"n": "z", "age": 30}],
            {"sort_by": "age, n", "sort_method": "desc"},
            [{"n": "z", "age": 30}, {"n": "x", "age": 30}, {"n": "y", "age": 20}],
        ),
        (
            [{"age": 3}, {"other": 1}, {"age": 1}],
            {"sort_by": "age"},
            [{"age": 1}, {"age": 3}, {"other": 1}],
        ),
        ([{"b": 2}, {"a": 1}], {}, [{"a": 1}, {"b": 2}]),
    ],
)
def test_sort(items, params, expected):
    assert result(items, operations="sort", **params) == expected


def test_drop_duplicates_keeps_the_first_of_equal_items():
    items = [1, "1", 1, {"a": 1, "b": 2}, {"b": 2, "a": 1}, [1], [1], None, None]
    assert result(items, operations="drop_duplicates") == [1, "1", {"a": 1, "b": 2}, [1], None]


def test_the_result_feeds_later_components():
    dsl = make_dsl(
        list_op(operations="tail", n=2),
        node("Message:M", "Message", {"content": ["{ListOperations:L@first} and {ListOperations:L@last}"]}),
        begin=FORM,
    )
    assert answer(run(Canvas(dsl), "q", inputs={"items": ITEMS})) == "c and d"


def test_a_missing_list_is_empty():
    assert outputs(None, operations="head", n=2) == {"result": [], "first": None, "last": None}


# ---------------------------------------------------------------- errors
def test_a_value_that_is_not_a_list_fails_the_run():
    error = failure({"a": 1}, operations="head", n=1)
    assert error == "ListOperations:L: 'begin@items' holds dict {'a': 1}, not a list"


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"query": ""}, "ListOperations:L: query is empty"),
        ({"query": "items"}, "query 'items' is not a reference"),
        ({"query": "LLM:Gone@content"}, "reference {LLM:Gone@content} names unknown component 'LLM:Gone'"),
        ({"operations": "shuffle"}, "operations 'shuffle' is not one of 'nth', 'head'"),
        ({"operations": "head", "n": "two"}, "n must be a whole number for head, got 'two'"),
        ({"operations": "nth", "n": 1.5}, "n must be a whole number for nth, got 1.5"),
        ({"operations": "nth", "n": 1, "strict": "maybe"}, "strict must be true or false, got 'maybe'"),
        ({"operations": "sort", "sort_method": "random"}, "sort_method 'random' is not one of 'asc', 'desc'"),
        ({"operations": "sort", "sort_by": ["a"]}, "sort_by must be comma-separated keys"),
        (
            {"operations": "filter", "filter": {"operator": "like", "value": "a"}},
            "filter: unknown operator 'like'",
        ),
        ({"operations": "filter", "filter": "a"}, "filter must be an object {operator, value}"),
        ({"operations": "filter", "filter": {"operator": "=", "value": "{env.nope}"}}, "undeclared variable"),
    ],
)
def test_bad_params_are_dsl_errors(params, fragment):
    with pytest.raises(DSLError) as err:
        Canvas(make_dsl(list_op(**params), begin=FORM))
    assert fragment in str(err.value)


def test_exception_goto_and_comment():
    def dsl(**params):
        return make_dsl(
            list_op(operations="nth", n=9, strict=True, **params),
            node("Message:Ok", "Message", {"content": ["ok"]}, downstream=[]),
            node("Message:Fallback", "Message", {"content": ["fallback"]}, downstream=[]),
            begin=FORM,
        )

    events = run(
        Canvas(dsl(exception_method="goto", exception_goto=["Message:Fallback"])),
        "q",
        inputs={"items": ITEMS},
    )
    assert final(events)["status"] == "succeeded" and answer(events) == "fallback"
    events = run(Canvas(dsl(exception_method="comment")), "q", inputs={"items": ITEMS})
    assert final(events)["status"] == "succeeded" and answer(events) == "ok"
    assert "n=9 is outside the list" in outputs_of(events, "ListOperations:L")["_ERROR"]
