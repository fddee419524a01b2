"""Iteration and IterationItem: one pass of the body per element, results collected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError
from tests.agent.dsl_helpers import answer, final, make_dsl, node, ran, run, run_dsl

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "iteration_demo.json"
ITEMS_FORM = {"items": {"name": "Items", "type": "object", "optional": True, "value": ["a", "b", "c"]}}


def iteration_dsl(body=None, iteration_params=None, after="Done: {Iteration:Each@result}", begin=None):
    """begin → Iteration:Each (over {begin@items}) → Message:After; ``body`` hangs off the item."""
    body = body or [
        node(
            "Message:Line",
            "Message",
            {"content": ["{IterationItem:Cur@index}={IterationItem:Cur@item}"]},
            parent_id="Iteration:Each",
            downstream=[],
        )
    ]
    params = {"items_ref": "begin@items", **(iteration_params or {})}
    return make_dsl(
        node("Iteration:Each", "Iteration", params, downstream=["Message:After"]),
        node("IterationItem:Cur", "IterationItem", {}, parent_id="Iteration:Each", downstream=[body[0][0]]),
        *body,
        node("Message:After", "Message", {"content": [after]}, downstream=[]),
        begin=begin or {"inputs": ITEMS_FORM},
    )


def test_each_element_runs_the_body_in_order_then_the_run_goes_on_once():
    canvas, events = run_dsl(iteration_dsl(), "go")
    assert final(events)["status"] == "succeeded"
    assert answer(events) == '0=a\n\n1=b\n\n2=c\n\nDone: ["0=a", "1=b", "2=c"]'
    assert ran(events).count("Message:Line") == 3
    assert ran(events).count("Message:After") == 1
    assert canvas.warnings == []


def test_declared_outputs_collect_one_value_per_element():
    dsl = iteration_dsl(
        iteration_params={
            "outputs": {"indexes": {"ref": "IterationItem:Cur@index", "type": "Array<number>"}}
        },
        after="{Iteration:Each@indexes} {Iteration:Each@result}",
    )
    _, events = run_dsl(dsl, "go", inputs={"items": ["x", "y"]})
    assert answer(events).endswith('[0, 1] ["0=x", "1=y"]')


def test_an_empty_list_goes_straight_on():
    _, events = run_dsl(iteration_dsl(), "go", inputs={"items": []})
    assert final(events)["status"] == "succeeded"
    assert "IterationItem:Cur" not in ran(events) and "Message:Line" not in ran(events)
    assert answer(events) == "Done: []"


@pytest.mark.parametrize(
    "variable",
    [
        {"variable": {"input_mode": "constant", "value": ["p", "q"]}},
        {"veriable": {"input_mode": "variable", "value": "begin@items"}},  # RAGFlow's spelling
    ],
)
def test_ragflows_variable_param_stands_in_for_an_empty_items_ref(variable):
    dsl = iteration_dsl(iteration_params={"items_ref": "", **variable})
    _, events = run_dsl(dsl, "go", inputs={"items": ["p", "q"]})
    assert answer(events) == '0=p\n\n1=q\n\nDone: ["0=p", "1=q"]'


def test_json_text_holding_a_list_is_iterated():
    dsl = iteration_dsl(begin={"inputs": {"items": {"name": "Items", "type": "line"}}})
    _, events = run_dsl(dsl, "go", inputs={"items": '["p", "q"]'})
    assert answer(events) == '0=p\n\n1=q\n\nDone: ["0=p", "1=q"]'


@pytest.mark.parametrize(
    ("field_type", "value", "kind"),
    [("object", {"a": 1}, "dict"), ("line", "not a list", "str"), ("integer", 42, "int")],
)
def test_items_that_are_not_a_list_fail_naming_the_iteration_and_the_reference(field_type, value, kind):
    dsl = iteration_dsl(begin={"inputs": {"items": {"name": "Items", "type": field_type}}})
    _, events = run_dsl(dsl, "go", inputs={"items": value})
    data = final(events)
    assert data["status"] == "failed"
    assert data["error"].startswith("Iteration:Each: items_ref 'begin@items' is " + kind)
    assert "not a list" in data["error"]
    assert "Message:Line" not in ran(events)


def test_a_reference_that_reads_nothing_fails_too():
    dsl = iteration_dsl(iteration_params={"items_ref": "env.things"})
    dsl["variables"] = {"things": {"type": "object", "value": None}}
    _, events = run_dsl(dsl, "go")
    assert final(events)["status"] == "failed"
    assert "items_ref 'env.things' is NoneType None, not a list" in final(events)["error"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d["components"]["Iteration:Each"]["obj"]["params"].update(items_ref="items"),
            "not a reference",
        ),
        (
            lambda d: d["components"]["Iteration:Each"]["obj"]["params"].update(items_ref=""),
            "items_ref is empty",
        ),
        (lambda d: d["components"].pop("IterationItem:Cur"), "exactly one IterationItem child"),
        (
            lambda d: d["components"].update(
                {
                    "IterationItem:Stray": node(
                        "IterationItem:Stray", "IterationItem", {}, parent_id="Message:After"
                    )[1]
                }
            ),
            "parent_id naming an Iteration",
        ),
        (
            lambda d: d["components"]["Iteration:Each"]["obj"]["params"].update(
                outputs={"x": {"ref": "Gone:X@y"}}
            ),
            "unknown component 'Gone:X'",
        ),
    ],
)
def test_malformed_iterations_are_dsl_errors_naming_the_component(change, message):
    dsl = iteration_dsl()
    change(dsl)
    if "IterationItem:Cur" not in dsl["components"]:
        dsl["components"]["Message:Line"]["upstream"] = []
    with pytest.raises(DSLError, match=message) as err:
        Canvas(dsl)
    assert "Iteration" in str(err.value)


def test_a_branch_that_did_not_run_in_a_pass_reads_empty_in_it():
    """Body outputs are cleared per pass: each result comes from the branch that ran."""
    switch = {
        "conditions": [
            {
                "logical_operator": "and",
                "items": [{"cpn_id": "IterationItem:Cur@item", "operator": "start with", "value": "y"}],
                "to": ["Message:Yes"],
            }
        ],
        "end_cpn_ids": ["Message:No"],
    }
    body = [
        node("Switch:Pick", "Switch", switch, parent_id="Iteration:Each", downstream=[]),
        node(
            "Message:Yes",
            "Message",
            {"content": ["Y:{IterationItem:Cur@item}"]},
            parent_id="Iteration:Each",
            downstream=[],
        ),
        node(
            "Message:No",
            "Message",
            {"content": ["N:{IterationItem:Cur@item} after [{Message:Yes@content}]"]},
            parent_id="Iteration:Each",
            downstream=[],
        ),
    ]
    dsl = iteration_dsl(
        body,
        iteration_params={"outputs": {"yes": {"ref": "Message:Yes@content"}}},
        after="{Iteration:Each@result} {Iteration:Each@yes}",
    )
    _, events = run_dsl(dsl, "go", inputs={"items": ["yak", "cow", "yeti"]})
    assert final(events)["status"] == "succeeded"
    lines = answer(events).split("\n\n")
    assert lines[:3] == ["Y:yak", "N:cow after []", "Y:yeti"]
    assert lines[3] == '["Y:yak", "N:cow after []", "Y:yeti"] ["Y:yak", null, "Y:yeti"]'


def test_the_list_is_read_once_so_the_body_cannot_make_it_endless():
    grow = {"variables": [{"variable": "env.things", "operator": "append", "parameter": "more"}]}
    body = [
        node("VariableAssigner:Grow", "VariableAssigner", grow, parent_id="Iteration:Each", downstream=[])
    ]
    dsl = iteration_dsl(body, iteration_params={"items_ref": "env.things"}, after="{env.things}")
    dsl["variables"] = {"things": {"type": "array<string>", "value": ["a", "b"]}}
    _, events = run_dsl(dsl, "go")
    assert final(events)["status"] == "succeeded"
    assert ran(events).count("VariableAssigner:Grow") == 2
    assert answer(events) == '["a", "b", "more", "more"]'


def test_a_form_inside_the_body_pauses_each_pass_and_survives_reloading():
    ask = {
        "tips": "A note on {IterationItem:Cur@item}?",
        "inputs": {"note": {"name": "Note", "type": "line"}},
    }
    body = [node("UserFillUp:Ask", "UserFillUp", ask, parent_id="Iteration:Each", downstream=[])]
    dsl = iteration_dsl(
        body,
        iteration_params={"outputs": {"notes": {"ref": "UserFillUp:Ask@note"}}},
        after="{Iteration:Each@notes}",
    )
    canvas = Canvas(dsl)
    events = run(canvas, "go", inputs={"items": ["tea", "milk"]})
    assert events[-1]["event"] == "user_inputs"
    assert final(events)["tips"] == "A note on tea?"

    canvas = Canvas(str(canvas))
    events = run(canvas, inputs={"note": "hot"})
    assert "workflow_started" not in [e["event"] for e in events]
    assert events[-1]["event"] == "user_inputs"
    # The second pass asks afresh (the whole form) about the second element.
    assert final(events)["tips"] == "A note on milk?"
    assert list(final(events)["inputs"]) == ["note"]

    canvas = Canvas(str(canvas))
    events = run(canvas, inputs={"note": "cold"})
    assert final(events)["status"] == "succeeded"
    assert answer(events) == '["hot", "cold"]'
    assert ran(events) == ["UserFillUp:Ask", "IterationItem:Cur", "Message:After"]


def test_nested_iterations_return_to_the_outer_one():
    inner_line = node(
        "Message:Pair",
        "Message",
        {"content": ["{IterationItem:Outer@index}.{IterationItem:Inner@index}={IterationItem:Inner@item}"]},
        parent_id="Iteration:Inner",
        downstream=[],
    )
    dsl = make_dsl(
        node("Iteration:Outer", "Iteration", {"items_ref": "begin@items"}, downstream=["Message:End"]),
        node(
            "IterationItem:Outer",
            "IterationItem",
            {},
            parent_id="Iteration:Outer",
            downstream=["Iteration:Inner"],
        ),
        node(
            "Iteration:Inner",
            "Iteration",
            {"items_ref": "IterationItem:Outer@item"},
            parent_id="Iteration:Outer",
            downstream=[],
        ),
        node(
            "IterationItem:Inner",
            "IterationItem",
            {},
            parent_id="Iteration:Inner",
            downstream=["Message:Pair"],
        ),
        inner_line,
        node("Message:End", "Message", {"content": ["end"]}, downstream=[]),
        begin={"inputs": {"items": {"name": "Items", "type": "object"}}},
    )
    canvas, events = run_dsl(dsl, "go", inputs={"items": [["a", "b"], [], ["c"]]})
    assert final(events)["status"] == "succeeded"
    assert answer(events).split("\n\n") == ["0.0=a", "0.1=b", "2.0=c", "end"]
    assert canvas.warnings == []


def test_item_outputs_include_ragflows_result_alias():
    _, events = run_dsl(iteration_dsl(), "go", inputs={"items": [{"k": 1}]})
    passes = [
        e["data"]["outputs"]
        for e in events
        if e["event"] == "node_finished" and e["data"]["component_id"] == "IterationItem:Cur"
    ]
    # One pass, then the run that finds the list exhausted and leaves.
    assert passes == [{"item": {"k": 1}, "index": 0, "result": {"k": 1}}, {}]


def test_the_iteration_sample_runs_without_an_llm():
    text = SAMPLE.read_text(encoding="utf-8")
    assert json.loads(text)["dsl"]["components"]["Iteration:Each"]["obj"]["component_name"] == "Iteration"
    canvas = Canvas(text)
    assert canvas.warnings == []
    events = run(canvas, "apples, pears,plums")
    assert final(events)["status"] == "succeeded"
    assert answer(events) == (
        "Item 0: apples\n\nItem 1: pears\n\nItem 2: plums\n\nDone. Labels: #0 apples; #1 pears; #2 plums"
    )
    again = run(Canvas(str(canvas)), "")
    assert answer(again) == "Done. Labels: "


def test_the_iteration_reports_node_finished_once_when_its_body_is_done():
    """As RAGFlow does: the Iteration's node_finished carries the collected results."""
    _, events = run_dsl(iteration_dsl(), "go")
    finished = [
        (i, e)
        for i, e in enumerate(events)
        if e["event"] == "node_finished" and e["data"]["component_id"] == "Iteration:Each"
    ]
    assert len(finished) == 1
    index, event = finished[0]
    assert event["data"]["outputs"]["result"] == ["0=a", "1=b", "2=c"]
    assert event["data"]["elapsed_time"] >= 0
    last_line = max(
        i
        for i, e in enumerate(events)
        if e["event"] == "node_finished" and e["data"]["component_id"] == "Message:Line"
    )
    after = min(
        i
        for i, e in enumerate(events)
        if e["event"] == "node_started" and e["data"]["component_id"] == "Message:After"
    )
    assert last_line < index < after
    _, empty = run_dsl(iteration_dsl(), "go", inputs={"items": []})
    assert [
        e["data"]["outputs"]["result"]
        for e in empty
        if e["event"] == "node_finished" and e["data"]["component_id"] == "Iteration:Each"
    ] == [[]]


def test_a_run_without_trace_has_the_same_answer_and_state_without_node_events():
    """``trace=False`` (a blocking turn) leaves out the ``node_finished`` events, those of a
    container that finishes late included, and the ``node_started`` ones (no
    ``stop_before``); the answer, the ending event and the saved state are those of a
    traced run."""
    runs = {}
    for trace in (True, False):
        canvas = Canvas(iteration_dsl())
        events = list(canvas.run(query="go", trace=trace))
        runs[trace] = (events, json.loads(str(canvas)))
    traced, untraced = runs[True][0], runs[False][0]
    assert "Iteration:Each" in [e["data"]["component_id"] for e in traced if e["event"] == "node_finished"]
    assert [e for e in untraced if e["event"] == "node_finished"] == []
    assert answer(untraced) == answer(traced) == '0=a\n\n1=b\n\n2=c\n\nDone: ["0=a", "1=b", "2=c"]'
    assert final(untraced)["status"] == "succeeded"
    assert [e["event"] for e in untraced] == [
        e["event"] for e in traced if e["event"] not in ("node_started", "node_finished")
    ]
    assert _without_times(runs[False][1]) == _without_times(runs[True][1])


def test_a_run_without_trace_announces_the_components_stop_before_asks_for():
    """``stop_before`` is asked before each component runs, in the order a traced run
    announces them; only those it answers true for get their ``node_started``, in place."""
    traced = list(Canvas(iteration_dsl()).run(query="go"))
    canvas = Canvas(iteration_dsl())
    asked = []

    def stop_before(cpn):
        asked.append(cpn.id)
        return cpn.component_name == "Message"

    canvas.stop_before = stop_before
    untraced = list(canvas.run(query="go", trace=False))
    started = [e["data"]["component_id"] for e in traced if e["event"] == "node_started"]
    assert asked == started
    messages = [c for c in started if canvas.components[c].component_name == "Message"]
    assert messages and len(messages) < len(started)
    assert [e["data"]["component_id"] for e in untraced if e["event"] == "node_started"] == messages
    assert [e["event"] for e in untraced] == [
        e["event"]
        for e in traced
        if e["event"] != "node_finished"
        and (e["event"] != "node_started" or e["data"]["component_id"] in messages)
    ]


def _without_times(value):
    """A snapshot with its clock readings and random ids left out."""
    if isinstance(value, dict):
        return {
            k: _without_times(v)
            for k, v in value.items()
            if k
            not in (
                "created_at",
                "started_at",
                "elapsed_time",
                "message_id",
                "task_id",
                "sys.date",
                "sys.message_id",
            )
            and not k.endswith("_at")
        }
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value
