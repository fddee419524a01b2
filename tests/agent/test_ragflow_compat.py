"""A DSL written by hand in RAGFlow's exact export shape loads and runs unchanged."""

from __future__ import annotations

import json
import os

from agent.canvas import Canvas

HERE = os.path.dirname(os.path.abspath(__file__))


def export():
    with open(os.path.join(HERE, "data", "ragflow_intake.json"), encoding="utf-8") as fh:
        return fh.read()


def run(canvas, **kw):
    events = list(canvas.run(**kw))
    return events, "".join(e["data"]["content"] for e in events if e["event"] == "message")


def test_ragflow_export_loads_runs_and_keeps_its_shape():
    text = export()
    canvas = Canvas(text)
    assert canvas.warnings == []
    events, _ = run(canvas, query="hello")
    pause = events[-1]
    assert pause["event"] == "user_inputs"
    assert pause["data"]["tips"] == "You wrote: hello\nPlease tell me your name and age."
    canvas = Canvas(str(canvas))
    events, text_out = run(canvas, inputs={"name": {"value": "Ann", "type": "line"}, "age": {"value": "12"}})
    assert text_out == "Sorry Ann, 12 is under 18. Checks so far: 1"
    run(canvas, query="again")
    _, text_out = run(canvas, inputs={"name": "Bob", "age": 30})
    assert text_out == "Welcome Bob, you are an adult. Checks so far: 2"

    original = json.loads(text)["dsl"]
    saved = json.loads(str(canvas))
    for key in ("components", "graph", "variables", "messages", "reference", "retrieval", "task_id"):
        assert saved[key] == original[key], key
    assert saved["globals"]["env.checks"] == 2 and saved["globals"]["env.last_name"] == "Bob"
