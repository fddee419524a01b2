"""DataOperations: every operation on objects and lists of objects; DSL errors; failures."""

from __future__ import annotations

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError
from tests.agent.dsl_helpers import answer, final, make_dsl, node, outputs_of, run

FORM = {
    "inputs": {
        "data": {"name": "Data", "type": "object", "optional": True},
        "more": {"name": "More", "type": "object", "optional": True},
        "text": {"name": "Text", "type": "paragraph", "optional": True},
    }
}
PEOPLE = [
    {"name": "Ann", "age": 31, "city": "Oslo"},
    {"name": "Bob", "age": 25, "city": "Lima"},
    {"name": "Cy", "age": "40", "city": "Oslo"},
]


def data_op(**params):
    params.setdefault("query", ["begin@data"])
    return node("DataOperations:D", "DataOperations", params)


def run_op(question="q", inputs=None, **params):
    return run(Canvas(make_dsl(data_op(**params), begin=FORM)), question, inputs=inputs)


def result(data, question="q", more=None, **params):
    inputs = {"data": data}
    if more is not None:
        inputs["more"] = more
    events = run_op(question, inputs, **params)
    assert final(events)["status"] == "succeeded", final(events)
    return outputs_of(events, "DataOperations:D")["result"]


def failure(inputs, **params):
    data = final(run_op("q", inputs, **params))
    assert data["status"] == "failed", data
    assert data["error"].startswith("DataOperations:D: ")
    return data["error"]


def test_select_keys():
    got = result(PEOPLE, operations="select_keys", select_keys=["name", "zip"])
    assert got == [{"name": "Ann"}, {"name": "Bob"}, {"name": "Cy"}]


@pytest.mark.parametrize("spelling", ["literal_eval", "literal eval", "recursive_eval"])
def test_literal_eval_turns_literal_text_into_values(spelling):
    data = {
        "n": "42",
        "f": " 2.5 ",
        "t": "true",
        "none": "None",
        "json": '{"a": [1, "x"]}',
        "py": "{'b': (1, 2), 3: {4, 5}, 'c': b'x'}",
        "list": ["[1, 2]", "plain"],
        "text": "hello world",
        "broken": "[1, 2",
        "code": "__import__('os').getcwd()",
        "kept": 7,
    }
    (got,) = result(data, operations=spelling)
    assert got == {
        "n": 42,
        "f": 2.5,
        "t": True,
        "none": None,
        "json": {"a": [1, "x"]},
        "py": {"b": [1, 2], "3": [4, 5], "c": "x"},
        "list": [[1, 2], "plain"],
        "text": "hello world",
        "broken": "[1, 2",
        "code": "__import__('os').getcwd()",
        "kept": 7,
    }


def test_combine_merges_objects_and_collects_repeated_keys():
    got = result(
        {"a": 1, "tags": ["x"]},
        more=[{"a": 2, "b": "only"}, {"a": 3, "tags": ["y", "z"]}],
        operations="combine",
        query=["begin@data", "{begin@more}"],
    )
    assert got == {"a": [1, 2, 3], "tags": ["x", "y", "z"], "b": "only"}


@pytest.mark.parametrize(
    ("rules", "names"),
    [
        ([{"key": "city", "operator": "=", "value": "Oslo"}], ["Ann", "Cy"]),
        ([{"key": "city", "operator": "equals", "value": "Lima"}], ["Bob"]),
        ([{"key": "city", "operator": "≠", "value": "Oslo"}], ["Bob"]),
        ([{"key": "name", "operator": "contains", "value": "N"}], ["Ann"]),
        ([{"key": "name", "operator": "starts with", "value": "b"}], ["Bob"]),
        ([{"key": "name", "operator": "end with", "value": "y"}], ["Cy"]),
        ([{"key": "age", "operator": ">", "value": "30"}], ["Ann", "Cy"]),
        (
            [
                {"key": "age", "operator": ">", "value": "30"},
                {"key": "city", "operator": "=", "value": "{sys.query}"},
            ],
            ["Ann", "Cy"],
        ),
        ([{"key": "zip", "operator": "empty", "value": ""}], []),
    ],
)
def test_filter_values_keeps_objects_matching_every_rule(rules, names):
    got = result(PEOPLE, question="Oslo", operations="filter_values", filter_values=rules)
    assert [p["name"] for p in got] == names


def test_append_or_update_sets_keys_from_literals_and_references():
    got = result(
        [{"name": "Ann", "n": 1}],
        question="hello",
        operations="append or update",
        updates=[
            {"key": "n", "value": 2},
            {"key": "said", "value": "{sys.query}"},
            {"key": "note", "value": "{begin@text}!"},
            {"key": "raw", "value": "{begin@more}"},
        ],
        more={"x": [1]},
    )
    assert got == [{"name": "Ann", "n": 2, "said": "hello", "note": "!", "raw": {"x": [1]}}]


def test_remove_keys():
    assert result(PEOPLE[:1], operations="remove_keys", remove_keys=["age", "nope"]) == [
        {"name": "Ann", "city": "Oslo"}
    ]


def test_rename_keys():
    got = result(
        PEOPLE[:1],
        operations="rename_keys",
        rename_keys=[{"old_key": "name", "new_key": "full_name"}, {"old_key": "gone", "new_key": "x"}],
    )
    assert got == [{"full_name": "Ann", "age": 31, "city": "Oslo"}]


def test_json_text_is_read_as_an_object_and_missing_values_are_skipped():
    events = run_op(
        "q",
        {"text": '[{"a": 1, "b": 2}]'},
        query=["begin@data", "begin@text"],
        operations="select_keys",
        select_keys=["a"],
    )
    assert final(events)["status"] == "succeeded"
    assert outputs_of(events, "DataOperations:D")["result"] == [{"a": 1}]


def test_the_result_feeds_later_components():
    dsl = make_dsl(
        data_op(operations="select_keys", select_keys=["name"]),
        node("Message:M", "Message", {"content": ["{DataOperations:D@result.1.name}"]}),
        begin=FORM,
    )
    assert answer(run(Canvas(dsl), "q", inputs={"data": PEOPLE})) == "Bob"


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("inputs", "fragment"),
    [
        ({"data": [{"a": 1}, 5]}, "'begin@data' item 1 is int 5, not an object"),
        ({"text": "just text"}, "'begin@text' holds str 'just text', not an object or a list of objects"),
        ({"text": "{broken"}, "'begin@text' holds text that is not valid JSON"),
    ],
)
def test_values_that_are_not_objects_fail_the_run(inputs, fragment):
    error = failure(inputs, query=["begin@data", "begin@text"], operations="remove_keys", remove_keys=["a"])
    assert fragment in error


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"query": []}, "DataOperations:D: query must name the object(s) to work on"),
        ({"query": ["profile"]}, "query 1: 'profile' is not a reference"),
        ({"query": ["LLM:Gone@structured"]}, "reference {LLM:Gone@structured} names unknown component"),
        ({"operations": "explode"}, "operations 'explode' is not one of 'select_keys'"),
        ({"operations": "select_keys", "select_keys": [1]}, "select_keys must be a list of key names"),
        ({"operations": "remove_keys", "remove_keys": {"a": 1}}, "remove_keys must be a list of key names"),
        ({"operations": "rename_keys", "rename_keys": []}, "rename_keys must be a non-empty list"),
        ({"operations": "rename_keys", "rename_keys": [{"old_key": "a"}]}, "rename_keys 1 has no 'new_key'"),
        ({"operations": "rename_keys", "rename_keys": [{"new_key": "a"}]}, "rename_keys 1 has no 'old_key'"),
        ({"operations": "append_or_update", "updates": [{"value": 1}]}, "updates 1 has no 'key'"),
        (
            {"operations": "filter_values", "filter_values": [{"key": "a", "operator": "like", "value": 1}]},
            "filter_values 1: unknown operator 'like'",
        ),
        ({"operations": "filter_values", "filter_values": ["a"]}, "filter_values 1 must be an object"),
        (
            {"operations": "append_or_update", "updates": [{"key": "a", "value": "{Agent:Gone@content}"}]},
            "names unknown component 'Agent:Gone'",
        ),
    ],
)
def test_bad_params_are_dsl_errors(params, fragment):
    with pytest.raises(DSLError) as err:
        Canvas(make_dsl(data_op(**params), begin=FORM))
    assert fragment in str(err.value)


def test_the_older_inputs_param_is_read_when_query_is_empty():
    dsl = make_dsl(
        node(
            "DataOperations:D",
            "DataOperations",
            {"inputs": ["begin@data"], "operations": "select keys", "select_keys": ["city"]},
        ),
        begin=FORM,
    )
    events = run(Canvas(dsl), "q", inputs={"data": PEOPLE[:1]})
    assert outputs_of(events, "DataOperations:D")["result"] == [{"city": "Oslo"}]


def test_exception_goto_and_comment():
    def dsl(**params):
        return make_dsl(
            data_op(operations="remove_keys", remove_keys=["a"], **params),
            node("Message:Ok", "Message", {"content": ["ok"]}, downstream=[]),
            node("Message:Fallback", "Message", {"content": ["fallback"]}, downstream=[]),
            begin=FORM,
        )

    bad = {"data": [1, 2]}
    events = run(Canvas(dsl(exception_method="goto", exception_goto=["Message:Fallback"])), "q", inputs=bad)
    assert final(events)["status"] == "succeeded" and answer(events) == "fallback"
    events = run(Canvas(dsl(exception_method="comment")), "q", inputs=bad)
    assert final(events)["status"] == "succeeded" and answer(events) == "ok"
    assert "not an object" in outputs_of(events, "DataOperations:D")["_ERROR"]
