"""StringTransform: split and merge, DSL errors, failures and exception_method."""

from __future__ import annotations

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError
from tests.agent.dsl_helpers import answer, final, make_dsl, node, outputs_of, run

FORM = {"inputs": {"data": {"name": "Data", "type": "object", "optional": True}}}


def transform(**params):
    return node("StringTransform:T", "StringTransform", params)


def result(*nodes, query="", data=None):
    events = run(
        Canvas(make_dsl(*nodes, begin=FORM)), query, inputs={"data": data} if data is not None else None
    )
    assert final(events)["status"] == "succeeded", final(events)
    return outputs_of(events, "StringTransform:T")["result"]


# ---------------------------------------------------------------- split
@pytest.mark.parametrize(
    ("text", "delimiters", "expected"),
    [
        ("a,b,c", [","], ["a", "b", "c"]),
        ("a,b;c", [",", ";"], ["a", "b", "c"]),
        ("a,,b", [","], ["a", "", "b"]),
        ("one\r\ntwo\nthree", ["\n", "\r\n"], ["one", "two", "three"]),
        ("a.b|c", [".", "|"], ["a", "b", "c"]),
        ("no delimiter", [","], ["no delimiter"]),
        ("", [","], []),
    ],
)
def test_split_cuts_at_any_delimiter(text, delimiters, expected):
    assert (
        result(transform(method="split", split_ref="sys.query", delimiters=delimiters), query=text)
        == expected
    )


def test_split_reads_braced_references_and_numbers_as_text():
    assert result(transform(method="split", split_ref="{begin@data}", delimiters=["."]), data="3.25") == [
        "3",
        "25",
    ]


def test_split_result_feeds_later_components():
    events = run(
        Canvas(
            make_dsl(
                transform(method="split", split_ref="sys.query", delimiters=[","]),
                node("Message:M", "Message", {"content": ["second: {StringTransform:T@result.1}"]}),
            )
        ),
        "x,y,z",
    )
    assert answer(events) == "second: y"


# ---------------------------------------------------------------- merge
def test_merge_renders_the_script_and_joins_lists_with_the_first_delimiter():
    got = result(
        transform(method="merge", script="{sys.query}: {begin@data}", delimiters=[" + ", ","]),
        query="sum",
        data=[1, 2, 3],
    )
    assert got == "sum: 1 + 2 + 3"


def test_merge_reads_objects_as_json_and_inserts_values_literally():
    got = result(
        transform(method="merge", script="{begin@data} / {sys.query}", delimiters=[","]),
        query="{{ 7*7 }} \\1 {sys.query}",
        data={"k": "v"},
    )
    assert got == '{"k": "v"} / {{ 7*7 }} \\1 {sys.query}'


def test_merge_may_use_jinja_in_the_script():
    got = result(
        transform(
            method="merge", script="{% for x in [1, 2] %}{{ x }}-{% endfor %}{sys.query}", delimiters=[","]
        ),
        query="end",
    )
    assert got == "1-2-end"


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"method": "reverse"}, "StringTransform:T: method 'reverse' is not one of 'split', 'merge'"),
        (
            {"method": "split", "split_ref": "sys.query", "delimiters": []},
            "delimiters must be a non-empty list",
        ),
        (
            {"method": "split", "split_ref": "sys.query", "delimiters": [",", ""]},
            "delimiter 2 must be non-empty text",
        ),
        (
            {"method": "split", "split_ref": "sys.query", "delimiters": ","},
            "delimiters must be a non-empty list",
        ),
        ({"method": "split"}, "split needs split_ref"),
        ({"method": "split", "split_ref": "query"}, "split_ref 'query' is not a reference"),
        ({"method": "split", "split_ref": "LLM:Gone@content"}, "names unknown component 'LLM:Gone'"),
        ({"method": "merge", "script": ["a"]}, "script must be a text template"),
        ({"method": "merge", "script": "{{ broken"}, "is not valid jinja2"),
        ({"method": "merge", "script": "{Agent:Gone@content}"}, "names unknown component 'Agent:Gone'"),
    ],
)
def test_bad_params_are_dsl_errors(params, fragment):
    with pytest.raises(DSLError) as err:
        Canvas(make_dsl(transform(**params)))
    assert fragment in str(err.value)


def _split_data(**params):
    return make_dsl(
        transform(method="split", split_ref="begin@data", delimiters=[","], **params),
        node("Message:Ok", "Message", {"content": ["ok"]}, downstream=[]),
        node("Message:Fallback", "Message", {"content": ["fallback"]}, downstream=[]),
        begin=FORM,
    )


def test_splitting_a_list_fails_the_run_with_a_clear_message():
    data = final(run(Canvas(_split_data()), "q", inputs={"data": ["a", "b"]}))
    assert data["status"] == "failed"
    assert data["error"] == (
        "StringTransform:T: split needs text, but 'begin@data' holds a list; use ListOperations for lists"
    )


def test_exception_goto_and_comment_handle_a_failed_split():
    dsl = _split_data(exception_method="goto", exception_goto=["Message:Fallback"])
    events = run(Canvas(dsl), "q", inputs={"data": {"not": "text"}})
    assert answer(events) == "fallback"
    dsl = _split_data(exception_method="comment", exception_default_value=[])
    dsl["components"]["StringTransform:T"]["downstream"] = ["Message:Ok"]
    events = run(Canvas(dsl), "q", inputs={"data": {"not": "text"}})
    assert answer(events) == "ok"
    assert "holds an object" in outputs_of(events, "StringTransform:T")["_ERROR"]
