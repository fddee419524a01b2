"""Loop, LoopItem and ExitLoop: passes until a condition holds, a cap, or an exit."""

from __future__ import annotations

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError
from tests.agent.dsl_helpers import answer, final, make_dsl, node, ran, run, run_dsl

COUNT_TO_3 = [{"variable": "Loop:L@n", "operator": "≥", "input_mode": "constant", "value": "3"}]


def loop_dsl(conditions=None, body=None, after="n={Loop:L@n}", **loop_params):
    """begin → Loop:L (variable n = 0) → Message:After; by default the body adds 1 to n."""
    params = {
        "loop_variables": [{"variable": "n", "type": "number", "input_mode": "constant", "value": 0}],
        "loop_termination_condition": COUNT_TO_3 if conditions is None else conditions,
        "logical_operator": "and",
        "maximum_loop_count": 10,
        **loop_params,
    }
    body = body or [increment()]
    return make_dsl(
        node("Loop:L", "Loop", params, downstream=["Message:After"]),
        node("LoopItem:P", "LoopItem", {}, parent_id="Loop:L", downstream=[body[0][0]]),
        *body,
        node("Message:After", "Message", {"content": [after]}, downstream=[]),
    )


def increment(downstream=None, cid="VariableAssigner:Inc"):
    return node(
        cid,
        "VariableAssigner",
        {"variables": [{"variable": "Loop:L@n", "operator": "+=", "parameter": 1}]},
        parent_id="Loop:L",
        downstream=downstream or [],
    )


def test_the_body_repeats_until_the_condition_holds_then_the_run_goes_on_once():
    canvas, events = run_dsl(loop_dsl(), "go")
    assert final(events)["status"] == "succeeded"
    assert answer(events) == "n=3"
    assert ran(events).count("VariableAssigner:Inc") == 3
    assert ran(events).count("Message:After") == 1
    assert canvas.warnings == []


def test_loop_item_numbers_the_passes_and_loop_variables_are_readable_in_the_body():
    body = [
        increment(["Message:Pass"]),
        node(
            "Message:Pass",
            "Message",
            {"content": ["pass {LoopItem:P@index}: n={Loop:L@n}"]},
            parent_id="Loop:L",
            downstream=[],
        ),
    ]
    _, events = run_dsl(loop_dsl(body=body), "go")
    assert answer(events).split("\n\n") == ["pass 0: n=1", "pass 1: n=2", "pass 2: n=3", "n=3"]


def test_the_condition_is_checked_before_the_first_pass():
    conditions = [{"variable": "Loop:L@n", "operator": "=", "input_mode": "constant", "value": 0}]
    _, events = run_dsl(loop_dsl(conditions), "go")
    assert "VariableAssigner:Inc" not in ran(events)
    assert answer(events) == "n=0"


def test_maximum_loop_count_caps_the_passes_when_the_condition_never_holds():
    never = [{"variable": "Loop:L@n", "operator": "<", "input_mode": "constant", "value": -1}]
    _, events = run_dsl(loop_dsl(never, maximum_loop_count=2), "go")
    assert final(events)["status"] == "succeeded"
    assert answer(events) == "n=2"


def test_without_conditions_the_loop_runs_maximum_loop_count_passes():
    _, events = run_dsl(loop_dsl([], maximum_loop_count=4), "go")
    assert answer(events) == "n=4"


@pytest.mark.parametrize(("logic", "expected"), [("and", "n=5"), ("or", "n=2")])
def test_logical_operator_combines_the_conditions(logic, expected):
    conditions = [
        {"variable": "Loop:L@n", "operator": "≥", "input_mode": "constant", "value": 2},
        {"variable": "Loop:L@n", "operator": ">", "input_mode": "constant", "value": 4},
    ]
    _, events = run_dsl(loop_dsl(conditions, logical_operator=logic), "go")
    assert answer(events) == expected


def test_variable_input_modes_read_references_when_the_loop_starts():
    conditions = [{"variable": "Loop:L@n", "operator": "≥", "input_mode": "variable", "value": "begin@stop"}]
    dsl = loop_dsl(
        conditions,
        loop_variables=[
            {"variable": "n", "type": "number", "input_mode": "variable", "value": "begin@start"}
        ],
    )
    dsl["components"]["begin"]["obj"]["params"]["inputs"] = {
        "start": {"name": "Start", "type": "integer"},
        "stop": {"name": "Stop", "type": "integer"},
    }
    _, events = run_dsl(dsl, "go", inputs={"start": 5, "stop": 8})
    assert ran(events).count("VariableAssigner:Inc") == 3
    assert answer(events) == "n=8"


def test_a_constant_condition_value_may_hold_a_reference_as_in_switch():
    conditions = [
        {"variable": "Loop:L@n", "operator": "≥", "input_mode": "constant", "value": "{begin@stop}"}
    ]
    dsl = loop_dsl(conditions)
    dsl["components"]["begin"]["obj"]["params"]["inputs"] = {"stop": {"name": "Stop", "type": "integer"}}
    _, events = run_dsl(dsl, "go", inputs={"stop": 4})
    assert answer(events) == "n=4"


def test_constant_loop_variables_take_their_declared_types():
    variables = [
        {"variable": "n", "type": "number", "input_mode": "constant", "value": "2"},
        {"variable": "flag", "type": "boolean", "input_mode": "constant", "value": "true"},
        {"variable": "names", "type": "array<string>", "input_mode": "constant", "value": '["x"]'},
        {"variable": "blank", "type": "object", "input_mode": "", "value": ""},
    ]
    after = "{Loop:L@n}|{Loop:L@flag}|{Loop:L@names}|{Loop:L@blank}"
    _, events = run_dsl(loop_dsl(loop_variables=variables, after=after), "go")
    assert answer(events) == '3|true|["x"]|{}'


def test_exit_loop_leaves_at_once_even_with_a_body_branch_still_queued():
    body = [
        increment(["Switch:Enough"]),
        node(
            "Switch:Enough",
            "Switch",
            {
                "conditions": [
                    {
                        "logical_operator": "and",
                        "items": [{"cpn_id": "Loop:L@n", "operator": "≥", "value": "2"}],
                        "to": ["Message:Last", "ExitLoop:Out"],
                    }
                ],
                "end_cpn_ids": ["Message:More"],
            },
            parent_id="Loop:L",
            downstream=[],
        ),
        node("Message:More", "Message", {"content": ["more"]}, parent_id="Loop:L", downstream=[]),
        # Runs before ExitLoop and, having no downstream, hands the run back to LoopItem;
        # that queued pass must not start once ExitLoop has left the loop.
        node("Message:Last", "Message", {"content": ["last"]}, parent_id="Loop:L", downstream=[]),
        node("ExitLoop:Out", "ExitLoop", {}, parent_id="Loop:L", downstream=[]),
    ]
    canvas, events = run_dsl(loop_dsl([], body=body, maximum_loop_count=10), "go")
    assert final(events)["status"] == "succeeded"
    assert answer(events) == "more\n\nlast\n\nn=2"
    assert ran(events).count("VariableAssigner:Inc") == 2
    assert ran(events)[-2:] == ["LoopItem:P", "Message:After"]
    assert canvas.warnings == []


def test_a_runaway_loop_is_stopped_by_the_step_limit():
    never = [{"variable": "Loop:L@n", "operator": "<", "input_mode": "constant", "value": -1}]
    canvas, events = run_dsl(loop_dsl(never, maximum_loop_count=10**9), "go")
    data = final(events)
    assert events[-1]["event"] == "workflow_finished"
    assert data["status"] == "failed"
    assert "max_steps" in data["error"]
    assert canvas.path == []  # a failed turn leaves the canvas as it was


def test_a_form_in_the_body_pauses_each_pass_and_survives_reloading():
    ask = {
        "tips": "Pass {LoopItem:P@index}: another?",
        "inputs": {"more": {"name": "More", "type": "boolean"}},
    }
    body = [
        increment(["UserFillUp:Ask"]),
        node("UserFillUp:Ask", "UserFillUp", ask, parent_id="Loop:L", downstream=[]),
    ]
    stop = [{"variable": "UserFillUp:Ask@more", "operator": "is", "input_mode": "constant", "value": "false"}]
    canvas = Canvas(loop_dsl(stop, body=body))
    events = run(canvas, "go")
    assert final(events)["tips"] == "Pass 0: another?"
    for n, reply in enumerate(["yes", "no"], 1):
        canvas = Canvas(str(canvas))
        events = run(canvas, inputs={"more": reply})
        if reply == "yes":
            assert final(events)["tips"] == f"Pass {n}: another?"
    assert final(events)["status"] == "succeeded"
    assert answer(events) == "n=2"


def test_a_loop_nested_in_an_iteration_returns_to_the_iteration():
    """Count up to each element; the Loop has no downstream, so it hands back to the item."""
    until_item = [
        {"variable": "Loop:L@n", "operator": "≥", "input_mode": "variable", "value": "IterationItem:I@item"}
    ]
    dsl = make_dsl(
        node("Iteration:It", "Iteration", {"items_ref": "begin@items"}, downstream=["Message:End"]),
        node("IterationItem:I", "IterationItem", {}, parent_id="Iteration:It", downstream=["Loop:L"]),
        node(
            "Loop:L",
            "Loop",
            {
                "loop_variables": [{"variable": "n", "type": "number", "input_mode": "constant", "value": 0}],
                "loop_termination_condition": until_item,
                "maximum_loop_count": 10,
            },
            parent_id="Iteration:It",
            downstream=[],
        ),
        node("LoopItem:P", "LoopItem", {}, parent_id="Loop:L", downstream=["VariableAssigner:Inc"]),
        increment(),
        node("Message:End", "Message", {"content": ["{Iteration:It@result}"]}, downstream=[]),
        begin={"inputs": {"items": {"name": "Items", "type": "object"}}},
    )
    canvas, events = run_dsl(dsl, "go", inputs={"items": [2, 0, 3]})
    assert final(events)["status"] == "succeeded"
    assert ran(events).count("VariableAssigner:Inc") == 5
    assert answer(events) == '[{"n": 2}, {"n": 0}, {"n": 3}]'
    assert canvas.warnings == []


@pytest.mark.parametrize("count", [0, -1, "10", 2.5, True, None])
def test_maximum_loop_count_must_be_a_positive_whole_number(count):
    with pytest.raises(DSLError, match=r"Loop:L: maximum_loop_count must be a whole number ≥ 1, got"):
        Canvas(loop_dsl(maximum_loop_count=count))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"loop_termination_condition": [{"variable": "Loop:L@n", "operator": "about", "value": 1}]},
            "unknown operator 'about'",
        ),
        (
            {"loop_termination_condition": [{"variable": "n", "operator": "=", "value": 1}]},
            "variable 'n' is not a reference",
        ),
        (
            {"loop_termination_condition": [{"variable": "Loop:L@m", "operator": "=", "value": 1}]},
            "reads 'm', which is not a loop variable",
        ),
        (
            {"loop_termination_condition": [{"variable": "Gone:X@m", "operator": "=", "value": 1}]},
            "unknown component 'Gone:X'",
        ),
        (
            {
                "loop_variables": [
                    {"variable": "n", "type": "number", "input_mode": "constant", "value": "abc"}
                ]
            },
            "has type number but value 'abc'",
        ),
        (
            {"loop_variables": [{"variable": "a b", "type": "number", "value": 1}]},
            "must be a name of letters",
        ),
        ({"logical_operator": "xor"}, "logical_operator 'xor' is not one of"),
    ],
)
def test_malformed_loops_are_dsl_errors_naming_the_loop(change, message):
    with pytest.raises(DSLError, match=message) as err:
        Canvas(loop_dsl(**change))
    assert str(err.value).startswith("Loop:L:")


def test_loop_item_and_exit_loop_must_sit_in_a_loop():
    dsl = loop_dsl()
    dsl["components"].pop("LoopItem:P")
    with pytest.raises(DSLError, match="Loop:L: needs exactly one LoopItem child"):
        Canvas(dsl)
    dsl = loop_dsl()
    dsl["components"]["ExitLoop:Stray"] = node("ExitLoop:Stray", "ExitLoop", {}, downstream=[])[1]
    with pytest.raises(DSLError, match="ExitLoop:Stray: an ExitLoop must sit in a Loop's body"):
        Canvas(dsl)


def test_the_loop_reports_node_finished_once_with_its_final_variables():
    _, events = run_dsl(loop_dsl(), "go")
    finished = [
        e["data"] for e in events if e["event"] == "node_finished" and e["data"]["component_id"] == "Loop:L"
    ]
    assert len(finished) == 1 and finished[0]["outputs"]["n"] == 3
