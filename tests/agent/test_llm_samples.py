"""The LLM samples, run the way a new user would: the test LLM server started by hand
(``python -m tests.llm_server``) in its own process, agentcanvas pointed at it with the
environment variables it prints."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest

from agent.canvas import Canvas
from tests.agent.dsl_helpers import answer, final, ran, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def by_hand(monkeypatch):
    """The server process, and the environment set as it says."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.llm_server", "--port", str(free_port())],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        while not lines or not lines[-1].startswith("Ctrl-C"):
            line = proc.stdout.readline()
            assert line, f"the server exited early: {lines}"
            lines.append(line.strip())
        exports = dict(line.split(" ", 1)[1].split("=", 1) for line in lines if line.startswith("export "))
        assert set(exports) == {
            "AGENTCANVAS_LLM_BASE_URL",
            "AGENTCANVAS_LLM_MODEL",
            "AGENTCANVAS_LLM_API_KEY",
        }
        for name, value in exports.items():
            monkeypatch.setenv(name, value)
        yield exports
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def sample(name: str) -> Canvas:
    with open(os.path.join(ROOT, "samples", f"{name}.json"), encoding="utf-8") as fh:
        return Canvas(fh.read())


def test_the_server_run_by_hand_lists_its_model(by_hand):
    with urllib.request.urlopen(by_hand["AGENTCANVAS_LLM_BASE_URL"] + "/models", timeout=10) as r:
        models = json.load(r)
    assert [m["id"] for m in models["data"]] == [by_hand["AGENTCANVAS_LLM_MODEL"]]


def test_support_assistant_routes_and_remembers(by_hand):
    canvas = sample("support_assistant")
    events = run(canvas, "Why was I charged twice this month?")
    assert final(events)["status"] == "succeeded"
    assert "Agent:Support" in ran(events)
    assert answer(events) == "echo: Why was I charged twice this month?"
    events = run(canvas, "Tell me a joke")
    assert ran(events)[-1] == "Message:Decline"
    events = run(canvas, "How do I create a storage bucket?")
    assert "Agent:Support" in ran(events)
    memory = json.loads(str(canvas))["memory"]
    assert [m["content"] for m in memory["Agent:Support"] if m["role"] == "user"] == [
        "Why was I charged twice this month?",
        "How do I create a storage bucket?",
    ]
    assert [m["content"] for m in memory["Categorize:Intent"] if m["role"] == "assistant"] == [
        "Billing",
        "Other",
        "Product question",
    ]


def test_planner_pauses_with_the_plan_then_carries_it_out(by_hand):
    canvas = sample("planner")
    events = run(canvas, "bake bread")
    assert events[-1]["event"] == "user_inputs"
    plan = "echo: Goal: bake bread"
    assert plan in final(events)["tips"]
    resumed = Canvas(str(canvas))
    events = run(resumed, inputs={"approve": "yes", "notes": "use rye"})
    assert final(events)["status"] == "succeeded"
    text = answer(events)
    assert f"Plan:\n{plan}" in text and "Approved: yes" in text and "use rye" in text
