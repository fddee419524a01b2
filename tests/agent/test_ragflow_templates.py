"""RAGFlow's 15 agent templates (tests/data/ragflow_templates, Apache-2.0): what each
uses, and that each loads unchanged. Running them over the API is
tests/api/test_ragflow_templates.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.canvas import Canvas
from agent.component import component_class

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "ragflow_templates"

# template: (component types on the canvas, component types used as Agent tools, at any depth)
USES = {
    "cajal_scientific_paper_agent": ({"Agent", "Begin", "Message"}, {"Retrieval"}),
    "customer_feedback_dispatcher": ({"Begin", "Categorize", "Message", "VariableAggregator"}, set()),
    "data_analysis_beginner_assistant": ({"Agent", "Begin", "Message"}, {"CodeExec"}),
    "deep_research": ({"Agent", "Begin", "Message"}, {"Agent", "TavilyExtract", "TavilySearch"}),
    "market_seo_article_writer": ({"Agent", "Begin", "Message"}, {"TavilySearch"}),
    "photo_text_translator": ({"Agent", "Begin", "Message"}, set()),
    "reflective_academic_paper_generator": ({"Agent", "Begin", "Message"}, {"Retrieval"}),
    "seo_article_writer": ({"Agent", "Begin", "Message"}, {"Agent", "TavilySearch"}),
    "smart_customer_service_specialist": (
        {"Agent", "Begin", "Categorize", "Message", "Retrieval", "VariableAggregator"},
        set(),
    ),
    "stock_market_research_assistant": (
        {"Agent", "Begin", "CodeExec", "Message", "Switch", "YahooFinance"},
        {"Agent", "Retrieval", "TavilySearch"},
    ),
    "text2sql_data_expert": ({"Agent", "Begin", "ExeSQL", "Message", "Retrieval"}, set()),
    "trip_planner": ({"Agent", "Begin", "Message"}, {"TavilyExtract", "TavilySearch"}),
    "user_interaction": ({"Agent", "Begin", "Message", "UserFillUp"}, {"Retrieval"}),
    "web_search_assistant": (
        {"Agent", "Begin", "Message", "Retrieval"},
        {"Bing", "DuckDuckGo", "Google", "TavilyExtract", "TavilySearch", "Wikipedia"},
    ),
    "your_starter_dataset_chatbot": ({"Agent", "Begin", "Message"}, {"Retrieval"}),
}

# What a template is expected to warn about when it loads (RAGFlow loads it silently).
WARNINGS = {
    "stock_market_research_assistant": [
        "Agent:SadDodosRescue: mcp[0] (server '30d6ef8ea8d511f0828382e3548809fa') selects no tools; "
        "it offers the model nothing"
    ],
}


def template(name: str) -> dict:
    return json.loads((TEMPLATES / f"{name}.json").read_text())


def uses(dsl: dict) -> tuple[set[str], set[str]]:
    """The component types of a DSL and of its Agents' tools (tools of tools too)."""
    tools: set[str] = set()

    def walk(params: dict) -> None:
        for spec in params.get("tools") or []:
            tools.add(spec["component_name"])
            walk(spec.get("params") or {})

    for entry in dsl["components"].values():
        walk(entry["obj"]["params"])
    return {e["obj"]["component_name"] for e in dsl["components"].values()}, tools


def missing_types(name: str) -> list[str]:
    """Component types a template needs that this checkout does not have."""
    on_canvas, tools = USES[name]
    return sorted(t for t in on_canvas | tools if component_class(t) is None)


def test_the_fixtures_are_the_fifteen_agent_templates_and_keep_their_license():
    assert sorted(p.stem for p in TEMPLATES.glob("*.json")) == sorted(USES)
    assert "Apache License" in (TEMPLATES / "LICENSE").read_text()
    assert "Apache License, Version 2.0" in (TEMPLATES / "NOTICE").read_text()


@pytest.mark.parametrize("name", sorted(USES))
def test_components_each_template_uses(name):
    assert uses(template(name)["dsl"]) == USES[name]


@pytest.mark.parametrize("name", sorted(USES))
def test_each_template_loads_unchanged(name):
    missing = missing_types(name)
    if missing:
        pytest.xfail(f"{name} needs component type(s) not built yet: {', '.join(missing)}")
    export = template(name)
    canvas = Canvas(export)
    # RAGFlow ships its Retrieval nodes with an empty kb_ids: each says so (a warning).
    empty_kb = [
        w for w in canvas.warnings if w.endswith("kb_ids is empty; it finds nothing until a dataset is set")
    ]
    assert not empty_kb or "Retrieval" in set().union(*USES[name])
    assert [w for w in canvas.warnings if w not in empty_kb] == WARNINGS.get(name, [])
    # Loading changes nothing: the DSL written back is the template's.
    snapshot = canvas.to_dict()
    assert snapshot["components"] == export["dsl"]["components"]
    assert snapshot["graph"] == export["dsl"]["graph"]
