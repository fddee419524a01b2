"""VariableAssigner: every operator, Dify's type rules, clear errors, undo on failure."""

from __future__ import annotations

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError
from tests.agent.dsl_helpers import answer, final, make_dsl, node, outputs_of, run

AGE_FORM = {"inputs": {"n": {"name": "N", "type": "integer", "optional": True}}}


def assigner(*items, **params):
    return node("VariableAssigner:V", "VariableAssigner", {"variables": list(items), **params})


def op(variable, operator, parameter=None):
    item = {"variable": variable, "operator": operator}
    if parameter is not None:
        item["parameter"] = parameter
    return item


def var(vtype, value):
    return {"type": vtype, "value": value}


def assign(*items, variables=None, query="q", extra=(), inputs=None, **params):
    """Run one turn with a VariableAssigner; returns the canvas and the events."""
    canvas = Canvas(make_dsl(assigner(*items, **params), *extra, variables=variables or {}, begin=AGE_FORM))
    return canvas, run(canvas, query, inputs=inputs)


def assigned(item, variables, **kw):
    """``env.x`` after one successful assignment."""
    canvas, events = assign(item, variables=variables, **kw)
    assert final(events)["status"] == "succeeded", final(events).get("error")
    return canvas.globals["env.x"]


def failure(item, variables, **kw):
    """The error of a run whose assignment fails; checks nothing was written."""
    canvas, events = assign(item, variables=variables, **kw)
    data = final(events)
    assert data["status"] == "failed", data
    assert data["error"].startswith("VariableAssigner:V: item 1")
    assert canvas.globals["env.x"] == variables["x"]["value"]
    return data["error"]


# ---------------------------------------------------------------- every operator
@pytest.mark.parametrize(
    ("vtype", "start", "parameter", "expected"),
    [
        ("string", "old", "{sys.query}", "hello"),
        ("string", "old", "sys.query", "hello"),
        ("number", 1, 2.5, 2.5),
        ("number", 1, "{begin@n}", 7),
        ("boolean", False, True, True),
        ("object", {}, {"a": [1]}, {"a": [1]}),
        ("array<string>", ["a"], ["x", "y"], ["x", "y"]),
        ("array[number]", [], [1, 2.5], [1, 2.5]),
    ],
)
def test_overwrite(vtype, start, parameter, expected):
    got = assigned(
        op("env.x", "overwrite", parameter), {"x": var(vtype, start)}, query="hello", inputs={"n": 7}
    )
    assert got == expected


@pytest.mark.parametrize(
    ("vtype", "start", "empty"),
    [
        ("string", "text", ""),
        ("number", 42, 0),
        ("boolean", True, False),
        ("object", {"a": 1}, {}),
        ("array<object>", [{"a": 1}], []),
        ("array", [1, "a"], []),
    ],
)
def test_clear_resets_to_the_types_empty_value(vtype, start, empty):
    got = assigned(op("env.x", "clear"), {"x": var(vtype, start)})
    assert got == empty and type(got) is type(empty)


def test_clear_an_untyped_empty_variable_leaves_nothing():
    assert assigned(op("env.x", "clear"), {"x": {"value": None}}) is None


@pytest.mark.parametrize(
    ("vtype", "start", "parameter", "expected"),
    [
        ("string", "", "Hi {sys.query}!", "Hi Ann!"),
        ("string", "", "{begin@n}", "5"),
        ("number", 0, "42", 42),
        ("number", 0, " 2.5 ", 2.5),
        ("number", 0, "{begin@n}", 5),
        ("boolean", False, "true", True),
        ("boolean", True, "False", False),
        ("object", {}, '{"name": "{sys.query}"}', {"name": "Ann"}),
    ],
)
def test_set_converts_text_to_the_variables_type(vtype, start, parameter, expected):
    got = assigned(op("env.x", "set", parameter), {"x": var(vtype, start)}, query="Ann", inputs={"n": 5})
    assert got == expected


def test_append_adds_one_element():
    got = assigned(op("env.x", "append", "sys.query"), {"x": var("array[string]", ["a"])}, query="b")
    assert got == ["a", "b"]
    got = assigned(op("env.x", "append", {"k": 1}), {"x": var("array<object>", [])})
    assert got == [{"k": 1}]


def test_append_to_an_untyped_empty_variable_starts_a_list():
    assert assigned(op("env.x", "append", 3), {"x": {"value": None}}) == [3]


def test_extend_adds_every_element():
    got = assigned(op("env.x", "extend", [2, 3]), {"x": var("array<number>", [1])})
    assert got == [1, 2, 3]


@pytest.mark.parametrize(
    ("operator", "start", "expected"),
    [
        ("remove_first", [1, 2, 3], [2, 3]),
        ("remove_first", [], []),
        ("remove_last", [1, 2, 3], [1, 2]),
        ("remove_last", [], []),
    ],
)
def test_remove_first_and_last(operator, start, expected):
    assert assigned(op("env.x", operator), {"x": var("array<number>", start)}) == expected


@pytest.mark.parametrize(
    ("operator", "start", "parameter", "expected"),
    [
        ("+=", 1, 2, 3),
        ("+=", 1.5, "{begin@n}", 5.5),
        ("+=", 1, "2", 3),
        ("-=", 10, 4, 6),
        ("-=", 1, 0.5, 0.5),
        ("*=", 3, 4, 12),
        ("*=", 3, 0.5, 1.5),
        ("/=", 6, 3, 2),
        ("/=", 7, 2, 3.5),
        ("/=", 1.0, 4, 0.25),
    ],
)
def test_arithmetic(operator, start, parameter, expected):
    got = assigned(op("env.x", operator, parameter), {"x": var("number", start)}, inputs={"n": 4})
    assert got == expected and type(got) is type(expected)


# ---------------------------------------------------------------- type rules: clear failures
@pytest.mark.parametrize(
    ("item", "variable", "fragment"),
    [
        (op("env.x", "append", 1), var("number", 0), "append works on arrays; the variable is a number"),
        (op("env.x", "append", 1), var("array<string>", []), "append needs a string element, got number 1"),
        (op("env.x", "append", "sys.query"), var("array<number>", []), "append needs a number element"),
        (op("env.x", "extend", "sys.query"), var("array", []), "extend needs a list, got string 'q'"),
        (op("env.x", "extend", [1, "a"]), var("array<number>", []), "extend needs a list of number elements"),
        (
            op("env.x", "remove_first"),
            var("string", "abc"),
            "remove_first works on arrays; the variable is a string",
        ),
        (
            op("env.x", "remove_last"),
            var("object", {}),
            "remove_last works on arrays; the variable is an object",
        ),
        (op("env.x", "+=", 1), var("string", "a"), "+= works on numbers; the variable is a string"),
        (op("env.x", "-=", "sys.query"), var("number", 1), "the value must be a number, got string 'q'"),
        (op("env.x", "*=", 2), var("number", None), "*= needs a number in the variable, which holds nothing"),
        (op("env.x", "/=", "{begin@n}"), var("number", 8), "/= by zero"),
        (op("env.x", "overwrite", 5), var("string", "a"), "overwrite needs a string value, got number 5"),
        (
            op("env.x", "overwrite", "sys.query"),
            var("array<string>", []),
            "overwrite needs an array<string> value",
        ),
        (
            op("env.x", "overwrite", [1, "a"]),
            var("array<number>", []),
            "overwrite needs an array<number> value",
        ),
        (op("env.x", "overwrite", "x"), var("boolean", False), "overwrite needs a boolean value"),
        (
            op("env.x", "set", "a"),
            var("array<string>", []),
            "set works on string, number, integer, boolean, object",
        ),
        (op("env.x", "set", "ten"), var("number", 0), "the value must be a number, got string 'ten'"),
        (op("env.x", "set", "maybe"), var("boolean", False), "the value must be true or false, got 'maybe'"),
        (op("env.x", "set", "{not json"), var("object", {}), "the value must be a JSON object"),
        (op("env.x", "set", "[1, 2]"), var("object", {}), "set needs an object value, got array<any> [1, 2]"),
    ],
)
def test_a_bad_operation_fails_with_a_clear_error_and_writes_nothing(item, variable, fragment):
    error = failure(item, {"x": variable}, inputs={"n": 0})
    assert fragment in error
    assert "(env.x " + item["operator"] + ")" in error


def test_a_type_this_runtime_does_not_know_is_read_from_the_value():
    # As the REST API does: an unknown declared type does not block the DSL.
    assert assigned(op("env.x", "+=", 2), {"x": var("matrix", 1)}) == 3
    error = failure(op("env.x", "append", 2), {"x": var("matrix", 1)})
    assert "append works on arrays; the variable is a number" in error


def test_declared_any_takes_any_value():
    assert assigned(op("env.x", "overwrite", "text"), {"x": var("any", 1)}) == "text"


@pytest.mark.parametrize(
    ("item", "start", "expected"),
    [
        (op("env.x", "+=", 2), 1, 3),
        (op("env.x", "*=", 0.5), 4, 2),
        (op("env.x", "/=", 2), 8, 4),
        (op("env.x", "set", "12"), 0, 12),
        (op("env.x", "clear"), 5, 0),
    ],
)
def test_an_integer_variable_stays_whole(item, start, expected):
    got = assigned(item, {"x": var("integer", start)})
    assert got == expected and type(got) is int


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        (op("env.x", "/=", 2), "the result of /= must be a whole number for an integer variable, got 3.5"),
        (op("env.x", "+=", 0.5), "the result of += must be a whole number"),
        (op("env.x", "set", "2.5"), "the value must be a whole number for an integer variable, got 2.5"),
        (op("env.x", "overwrite", 2.5), "overwrite needs an integer value, got number 2.5"),
    ],
)
def test_an_integer_variable_refuses_fractions(item, fragment):
    assert fragment in failure(item, {"x": var("integer", 7)})


def test_numbers_past_the_limit_are_refused():
    error = failure(op("env.x", "*=", 2**40), {"x": var("number", 2**40)})
    assert "is too large to store (limit ±2**63)" in error


def test_node_inputs_show_the_items_as_written_not_the_values():
    variables = {"token": {"type": "secret", "value": "s3cr3t"}, "copy": var("string", "")}
    canvas, events = assign(op("env.copy", "overwrite", "env.token"), variables=variables)
    assert canvas.globals["env.copy"] == "s3cr3t"
    finished = [e for e in events if e["event"] == "node_finished"]
    assert "s3cr3t" not in repr(finished)


def test_a_boolean_is_not_a_number():
    variables = {"x": var("number", 1), "flag": var("boolean", True)}
    error = failure(op("env.x", "+=", "{env.flag}"), variables)
    assert "the value must be a number, got boolean True" in error


def test_types_of_undeclared_targets_come_from_their_current_value():
    # env.x only in globals (no declared type): a string, so += is refused; a list takes append.
    dsl = make_dsl(assigner(op("env.x", "+=", 1)), globals={"env.x": "seven"})
    data = final(run(Canvas(dsl), "q"))
    assert data["status"] == "failed" and "+= works on numbers; the variable is a string" in data["error"]
    dsl = make_dsl(assigner(op("env.x", "append", "sys.query")), globals={"env.x": ["a"]})
    canvas = Canvas(dsl)
    run(canvas, "b")
    assert canvas.globals["env.x"] == ["a", "b"]


# ---------------------------------------------------------------- references and targets
def test_a_component_output_can_be_assigned_and_read_later_in_the_turn():
    dsl = make_dsl(
        node("StringTransform:T", "StringTransform", {"method": "split", "split_ref": "sys.query"}),
        assigner(op("StringTransform:T@result", "remove_first")),
        node("Message:M", "Message", {"content": ["{StringTransform:T@result}"]}),
    )
    events = run(Canvas(dsl), "a,b,c")
    assert answer(events) == '["b", "c"]'


def test_items_run_in_order_and_see_earlier_writes():
    variables = {"count": var("number", 0), "log": var("array<number>", [])}
    canvas, events = assign(
        op("env.count", "+=", 1),
        op("env.log", "append", "env.count"),
        op("env.count", "*=", 10),
        op("env.log", "append", "{env.count}"),
        variables=variables,
    )
    assert final(events)["status"] == "succeeded"
    assert canvas.globals["env.count"] == 10
    assert canvas.globals["env.log"] == [1, 10]


def test_text_that_only_looks_like_a_reference_is_kept_as_text():
    got = assigned(op("env.x", "append", "bob@example.com"), {"x": var("array<string>", [])})
    assert got == ["bob@example.com"]


def test_conversation_variables_persist_across_turns_and_snapshots():
    dsl = make_dsl(
        assigner(op("env.count", "+=", 1), op("env.said", "append", "sys.query")),
        node("Message:M", "Message", {"content": ["#{env.count}: {env.said}"]}),
        variables={"count": var("number", 0), "said": var("array[string]", [])},
    )
    canvas = Canvas(dsl)
    for query in ("a", "b", "c"):
        events = run(canvas, query)
        canvas = Canvas(str(canvas))
    assert answer(events) == '#3: ["a", "b", "c"]'


# ---------------------------------------------------------------- DSL errors at load
@pytest.mark.parametrize(
    ("items", "fragment"),
    [
        ([op("env.x", "increment", 1)], "VariableAssigner:V: item 1 (env.x): unknown operator 'increment'"),
        ([op("x", "clear")], "item 1: variable 'x' is not a reference"),
        ([{"operator": "clear"}], "item 1: variable None is not a reference"),
        ([op("sys.query", "set", "a")], "item 1: 'sys.query' is set by the runtime and cannot be assigned"),
        ([op("env.x.y", "set", "a")], "item 1: cannot assign into 'env.x.y'"),
        (
            [op("env.x", "clear"), op("env.x", "append")],
            "item 2 (env.x): operator 'append' needs a 'parameter'",
        ),
        (
            [op("env.x", "+=", "one")],
            "item 1 (env.x): the parameter of += must be a number, got string 'one'",
        ),
        ([op("env.x", "/=", 0)], "item 1 (env.x): /= by zero"),
        ([op("env.x", "-=", True)], "item 1 (env.x): the parameter of -= must be a number, got boolean True"),
        ([op("env.nope", "clear")], "reference {env.nope} names undeclared variable 'env.nope'"),
        (
            [op("LLM:Gone@content", "clear")],
            "reference {LLM:Gone@content} names unknown component 'LLM:Gone'",
        ),
        ([op("env.x", "append", "LLM:Gone@content")], "names unknown component 'LLM:Gone'"),
        ([op("env.x", "set", "Hi {Agent:Gone@content}")], "names unknown component 'Agent:Gone'"),
        (["env.x"], "item 1 must be an object"),
    ],
)
def test_bad_items_are_dsl_errors(items, fragment):
    with pytest.raises(DSLError) as err:
        Canvas(make_dsl(assigner(*items), variables={"x": var("number", 0)}))
    assert fragment in str(err.value)


def test_variables_must_be_a_list():
    with pytest.raises(DSLError, match="variables must be a list"):
        Canvas(make_dsl(node("VariableAssigner:V", "VariableAssigner", {"variables": {"env.x": 1}})))


# ---------------------------------------------------------------- failures, undo, exception_method
def test_a_failure_undoes_earlier_items_and_leaves_the_session_as_it_was():
    variables = {"a": var("number", 1), "b": var("string", "text")}
    canvas = Canvas(make_dsl(assigner(op("env.a", "+=", 1), op("env.b", "+=", 1)), variables=variables))
    before = str(canvas)
    data = final(run(canvas, "q"))
    assert data["status"] == "failed"
    assert data["error"] == (
        "VariableAssigner:V: item 2 (env.b +=): += works on numbers; the variable is a string"
    )
    assert str(canvas) == before


def test_exception_comment_keeps_nothing_of_a_failed_assignment():
    variables = {"a": var("number", 1), "b": var("string", "text")}
    canvas, events = assign(
        op("env.a", "+=", 1),
        op("env.b", "+=", 1),
        variables=variables,
        extra=[node("Message:M", "Message", {"content": ["a={env.a} b={env.b}"]})],
        exception_method="comment",
        exception_default_value="skipped",
    )
    assert final(events)["status"] == "succeeded"
    assert answer(events) == "a=1 b=text"
    assert canvas.globals["env.a"] == 1 and canvas.globals["env.b"] == "text"
    outputs = outputs_of(events, "VariableAssigner:V")
    assert "works on numbers" in outputs["_ERROR"] and outputs["content"] == "skipped"


def test_exception_goto_routes_to_the_fallback():
    dsl = make_dsl(
        assigner(op("env.x", "/=", "{begin@n}"), exception_method="goto", exception_goto=["Message:Oops"]),
        node("Message:Ok", "Message", {"content": ["x={env.x}"]}, downstream=[]),
        node("Message:Oops", "Message", {"content": ["cannot divide by {begin@n}"]}, downstream=[]),
        variables={"x": var("number", 10)},
        begin=AGE_FORM,
    )
    canvas = Canvas(dsl)
    assert answer(run(canvas, "q", inputs={"n": 0})) == "cannot divide by 0"
    assert answer(run(canvas, "q", inputs={"n": 4})) == "x=2.5"


def test_retries_start_from_the_values_before_the_first_attempt():
    # Each failed attempt is undone, so three attempts never add 1 three times.
    variables = {"a": var("number", 0), "b": var("number", 1)}
    canvas = Canvas(
        make_dsl(
            assigner(
                op("env.a", "+=", 1),
                op("env.b", "/=", "{begin@n}"),
                max_retries=2,
                delay_after_error=0.5,
                exception_method="comment",
            ),
            variables=variables,
            begin=AGE_FORM,
        )
    )
    slept = []
    canvas.sleep = slept.append
    data = final(run(canvas, "q", inputs={"n": 0}))
    assert data["status"] == "succeeded" and slept == [0.5, 0.5]
    assert canvas.globals["env.a"] == 0 and canvas.globals["env.b"] == 1
