"""Where RAGFlow's loader is lenient, ours is too: numeric text params are converted,
and wiring RAGFlow meets only at run time is a load-time warning plus a clear error if
that part runs. Everything else stays a DSLError."""

from __future__ import annotations

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError
from tests.agent.dsl_helpers import answer, final, make_dsl, node, run
from tests.llm_server import LLMServer


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


def _llm_dsl(**params) -> dict:
    return make_dsl(
        node("LLM:A", "LLM", {"temperatureEnabled": True, "topPEnabled": True, **params}),
        node("Message:Out", "Message", {"content": ["{LLM:A@content}"]}),
    )


def test_numeric_params_written_as_text_are_sent_as_numbers(llm):
    dsl = _llm_dsl(
        temperature="0.1", top_p=" 0.3", max_tokens="256", maxTokensEnabled=True, presence_penalty="0.5"
    )
    canvas = Canvas(dsl, services={"llm_settings": llm.settings()})
    assert canvas.warnings == []
    events = run(canvas, "hi")
    assert final(events)["status"] == "succeeded"
    body = llm.requests[-1]["body"]
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["presence_penalty"]) == (
        0.1,
        0.3,
        256,
        0.5,
    )
    # The DSL the snapshot keeps is the author's, text and all.
    assert canvas.to_dict()["components"]["LLM:A"]["obj"]["params"]["temperature"] == "0.1"


@pytest.mark.parametrize(
    "params, message",
    [
        ({"temperature": "warm"}, "temperature must be a number, got 'warm'"),
        ({"max_tokens": "0.5"}, "max_tokens must be a whole number, got '0.5'"),
        ({"temperature": "7"}, "temperature must be ≤ 2"),
        ({"top_p": [1]}, "top_p must be a number"),
    ],
)
def test_text_that_is_no_number_stays_an_error(params, message):
    with pytest.raises(DSLError, match="LLM:A: " + message):
        Canvas(_llm_dsl(**params))


def test_output_structure_that_is_not_an_object_is_a_warning(llm):
    canvas = Canvas(
        _llm_dsl(output_structure=["not", "a", "schema"]), services={"llm_settings": llm.settings()}
    )
    assert canvas.warnings == [
        "LLM:A: output_structure is not a JSON schema object (list); it is ignored and the node "
        "answers in plain text"
    ]
    events = run(canvas, "hello")
    assert answer(events) == "echo: hello"
    # JSON text of a schema is read as the schema.
    schema = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'
    assert Canvas(_llm_dsl(output_structure=schema)).warnings == []


def _switch_dsl(to: list[str]) -> dict:
    return make_dsl(
        node(
            "Switch:Route",
            "Switch",
            {
                "conditions": [
                    {
                        "logical_operator": "and",
                        "items": [{"cpn_id": "sys.query", "operator": "=", "value": "go"}],
                        "to": to,
                    }
                ],
                "end_cpn_ids": ["Message:Else"],
            },
            downstream=["Message:Else"],
        ),
        node("Message:Else", "Message", {"content": ["else"]}, downstream=[]),
    )


def test_switch_branch_to_a_missing_component_is_a_warning_then_an_error_if_taken():
    canvas = Canvas(_switch_dsl(["Message:Gone"]))
    assert canvas.warnings == [
        "Switch:Route: condition 1 routes to missing component 'Message:Gone'; "
        "the run fails if that branch is taken"
    ]
    events = run(canvas, "stay")
    assert final(events)["status"] == "succeeded" and answer(events) == "else"
    events = run(canvas, "go")
    done = final(events)
    assert done["status"] == "failed"
    assert (
        "Switch:Route: condition 1 holds but routes to missing component(s) 'Message:Gone'" in done["error"]
    )


def test_other_wiring_to_missing_components_stays_an_error():
    dsl = _switch_dsl(["Message:Else"])
    dsl["components"]["Message:Else"]["downstream"] = ["Message:Gone"]
    with pytest.raises(DSLError, match="Message:Else: downstream names missing component 'Message:Gone'"):
        Canvas(dsl)


def _loop_dsl(variables: list[dict]) -> dict:
    return make_dsl(
        node(
            "Loop:L",
            "Loop",
            {"loop_variables": variables, "loop_termination_condition": [], "maximum_loop_count": 1},
            downstream=["Message:Done"],
        ),
        node("LoopItem:Start", "LoopItem", {}, downstream=[], parent_id="Loop:L"),
        node("Message:Done", "Message", {"content": ["done"]}, downstream=[]),
    )


def test_an_incomplete_loop_variable_is_a_warning_then_an_error_when_the_loop_runs():
    canvas = Canvas(
        _loop_dsl(
            [
                {"variable": "n", "type": "number", "input_mode": "constant", "value": 1},
                {"variable": "", "type": "string", "input_mode": "constant", "value": ""},
            ]
        )
    )
    assert canvas.warnings == [
        "Loop:L: loop_variables item 2 is incomplete (it has no variable name); the Loop fails when it runs"
    ]
    done = final(run(canvas, "hi"))
    assert done["status"] == "failed"
    assert "Loop:L: loop_variables item 2 is incomplete (it has no variable name)" in done["error"]

    canvas = Canvas(_loop_dsl([{"variable": "src", "type": "string", "input_mode": "variable", "value": ""}]))
    assert "reads its value from a reference, but none is chosen" in canvas.warnings[0]


def test_a_malformed_loop_variable_stays_an_error():
    with pytest.raises(DSLError, match="must be a name of letters"):
        Canvas(_loop_dsl([{"variable": "a b", "type": "string", "input_mode": "constant", "value": ""}]))


def test_an_mcp_entry_with_no_tools_is_a_warning():
    dsl = make_dsl(
        node("Agent:A", "Agent", {"mcp": [{"mcp_id": "30d6ef8ea8d511f0828382e3548809fa", "tools": {}}]}),
        node("Message:Out", "Message", {"content": ["{Agent:A@content}"]}),
    )
    assert Canvas(dsl).warnings == [
        "Agent:A: mcp[0] (server '30d6ef8ea8d511f0828382e3548809fa') selects no tools; it offers the model nothing"
    ]
    dsl["components"]["Agent:A"]["obj"]["params"]["mcp"] = [{"tools": {}}]
    with pytest.raises(DSLError, match=r"Agent:A: mcp\[0\] must be \{mcp_id, tools\}"):
        Canvas(dsl)


def test_warnings_of_an_agents_tools_name_the_tool():
    dsl = make_dsl(
        node(
            "Agent:A",
            "Agent",
            {"tools": [{"component_name": "LLM", "name": "helper", "params": {"output_structure": 5}}]},
        ),
        node("Message:Out", "Message", {"content": ["{Agent:A@content}"]}),
    )
    (warning,) = Canvas(dsl).warnings
    assert warning.startswith("Agent:A: tools[0] ('helper'): output_structure is not a JSON schema object")
