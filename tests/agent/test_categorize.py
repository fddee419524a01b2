"""Categorize through the test LLM server: routing, the default, the prompt, bad DSLs."""

from __future__ import annotations

import pytest

from agent.canvas import Canvas
from agent.errors import DSLError
from tests.agent.dsl_helpers import answer, final, finished_nodes, make_dsl, node, ran, run
from tests.llm_server import LLMServer, error, text

CATEGORIES = {
    "Billing ": {
        "description": "Invoices and payments",
        "examples": ["Why was I charged twice?"],
        "to": ["Message:Bill"],
    },
    "Tech": {"description": "Something is broken", "examples": ["The app crashes"], "to": ["Message:Tech"]},
    "Other": {"description": "Anything else", "to": ["Message:Other"]},
}


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


def router(llm: LLMServer, categories: dict | None = None, **params) -> Canvas:
    dsl = make_dsl(
        node(
            "Categorize:Route",
            "Categorize",
            {"category_description": categories or CATEGORIES, "query": "sys.query", **params},
            downstream=["Message:Bill", "Message:Tech", "Message:Other"],
        ),
        node(
            "Message:Bill",
            "Message",
            {"content": ["billing ({Categorize:Route@category_name})"]},
            downstream=[],
        ),
        node("Message:Tech", "Message", {"content": ["tech"]}, downstream=[]),
        node("Message:Other", "Message", {"content": ["other"]}, downstream=[]),
    )
    return Canvas(dsl, services={"llm_settings": llm.settings(max_retries=0)})


@pytest.mark.parametrize(
    ("reply", "route", "shown"),
    [
        ("Billing", "Message:Bill", "billing (Billing )"),
        ("tech", "Message:Tech", "tech"),
        ('"Other".', "Message:Other", "other"),
        ("This is clearly about Tech, not Billing. Tech!", "Message:Tech", "tech"),
        ("**Billing**", "Message:Bill", "billing (Billing )"),
    ],
)
def test_each_category_routes_to_its_components(llm, reply, route, shown):
    llm.queue(text(reply))
    events = run(router(llm), "a question")
    assert final(events)["status"] == "succeeded"
    assert ran(events)[-1] == route
    assert [c for c in ran(events) if c.startswith("Message:")] == [route]
    assert answer(events) == shown


def test_an_answer_naming_no_category_goes_to_the_last_category(llm):
    llm.queue(text("I cannot decide"))
    events = run(router(llm), "hmm")
    assert final(events)["status"] == "succeeded"
    assert ran(events)[-1] == "Message:Other"
    assert finished_nodes(events)["Categorize:Route"]["outputs"]["category_name"] == "Other"


def test_default_category_param_overrides_the_last(llm):
    llm.queue(text(""))
    events = run(router(llm, default_category="Tech"), "hmm")
    assert ran(events)[-1] == "Message:Tech"
    outputs = finished_nodes(events)["Categorize:Route"]["outputs"]
    assert outputs == {"category_name": "Tech", "_next": ["Message:Tech"]}


def test_the_prompt_lists_categories_descriptions_examples_and_the_query(llm):
    run(router(llm, sys_prompt="Customers of Acme write in."), "my card was charged twice")
    system, user = llm.chat_requests()[0]["messages"]
    assert system["role"] == "system"
    for line in (
        "- Billing: Invoices and payments",
        "- Tech: Something is broken",
        "- Other: Anything else",
        "Example (Billing): Why was I charged twice?",
        "Customers of Acme write in.",
    ):
        assert line in system["content"]
    assert user == {"role": "user", "content": "my card was charged twice"}


def test_query_reads_a_bare_reference_and_memory_keeps_the_chosen_category(llm):
    dsl = make_dsl(
        node(
            "Categorize:Route",
            "Categorize",
            {"category_description": CATEGORIES, "query": "begin@topic", "message_history_window_size": 2},
            downstream=["Message:Bill", "Message:Tech", "Message:Other"],
        ),
        node("Message:Bill", "Message", {"content": ["b"]}, downstream=[]),
        node("Message:Tech", "Message", {"content": ["t"]}, downstream=[]),
        node("Message:Other", "Message", {"content": ["o"]}, downstream=[]),
        begin={"inputs": {"topic": {"name": "Topic", "type": "line"}}},
    )
    canvas = Canvas(dsl, services={"llm_settings": llm.settings()})
    llm.queue(text("It's Tech."))
    run(canvas, "", inputs={"topic": "the app crashes"})
    run(canvas, "", inputs={"topic": "refund please"})
    last = llm.chat_requests()[-1]["messages"]
    assert last[1:] == [
        {"role": "user", "content": "the app crashes"},
        {"role": "assistant", "content": "Tech"},
        {"role": "user", "content": "refund please"},
    ]


def test_examples_written_as_lines_of_one_text_are_each_an_example(llm):
    categories = {
        "1. contact": {"examples": "My phone number is 203921\nmail me at a@b.c", "to": "Message:Bill"},
        "2. casual": {"examples": ["How are you?"], "to": ["Message:Other"]},
    }
    llm.queue(text("1. contact"))
    events = run(router(llm, categories), "call me")
    assert ran(events)[-1] == "Message:Bill"
    system = llm.chat_requests()[0]["messages"][0]["content"]
    assert "Example (1. contact): My phone number is 203921\nExample (1. contact): mail me at a@b.c" in system


def test_routing_back_to_an_earlier_component_is_allowed(llm):
    dsl = make_dsl(
        node("Message:Hello", "Message", {"content": ["hello"]}),
        node(
            "Categorize:Again",
            "Categorize",
            {
                "category_description": {
                    "again": {"to": ["Message:Hello"]},
                    "stop": {"to": ["Message:Bye"]},
                }
            },
            downstream=["Message:Hello", "Message:Bye"],
        ),
        node("Message:Bye", "Message", {"content": ["bye"]}, downstream=[]),
    )
    llm.queue(text("again"), text("stop"))
    events = run(Canvas(dsl, services={"llm_settings": llm.settings()}), "x")
    assert [c for c in ran(events) if c != "begin"] == [
        "Message:Hello",
        "Categorize:Again",
        "Message:Hello",
        "Categorize:Again",
        "Message:Bye",
    ]


def test_a_provider_failure_fails_the_turn(llm):
    llm.queue(error(500, "down"))
    data = final(run(router(llm), "x"))
    assert data["status"] == "failed" and "Categorize:Route" in data["error"] and "down" in data["error"]


def test_a_failure_replaced_by_its_default_value_takes_the_default_category_only(llm):
    llm.queue(error(500, "down"))
    events = run(
        router(llm, exception_method="comment", exception_default_value="", default_category="Tech"), "x"
    )
    assert final(events)["status"] == "succeeded"
    assert [c for c in ran(events) if c.startswith("Message:")] == ["Message:Tech"]


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"category_description": {}}, "category_description"),
        ({"category_description": {"A": {"description": "x"}}}, "'to'"),
        ({"category_description": {"A": {"to": ["Message:Nowhere"]}}}, "Message:Nowhere"),
        (
            {"category_description": {"A ": {"to": ["Message:Tech"]}, "a": {"to": ["Message:Tech"]}}},
            "same name",
        ),
        ({"category_description": CATEGORIES, "query": "what is this"}, "query"),
        ({"category_description": CATEGORIES, "query": "Nope:X@out"}, "Nope:X"),
        ({"category_description": CATEGORIES, "default_category": "Sales"}, "Sales"),
    ],
)
def test_bad_categorize_params_are_dsl_errors(params, fragment):
    dsl = make_dsl(
        node("Categorize:Route", "Categorize", params, downstream=["Message:Tech"]),
        node("Message:Bill", "Message", {"content": ["b"]}, downstream=[]),
        node("Message:Tech", "Message", {"content": ["t"]}, downstream=[]),
        node("Message:Other", "Message", {"content": ["o"]}, downstream=[]),
    )
    with pytest.raises(DSLError) as e:
        Canvas(dsl)
    assert "Categorize:Route" in str(e.value) and fragment in str(e.value)
