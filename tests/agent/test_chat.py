"""``agentcanvas run``: the terminal chat, run as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.agent.test_forms import form_dsl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def chat(*args, stdin=""):
    proc = subprocess.run(
        [sys.executable, "-m", "agent.chat", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    return proc


def test_greeting_chat_streams_answers_until_end_of_input():
    proc = chat("samples/greeting.json", stdin="hello\nagain\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Hi! I'm the greeting agent.")
    assert "You said: hello" in proc.stdout and "You said: again" in proc.stdout


def test_form_fields_are_asked_one_by_one_and_retyped_until_valid(tmp_path):
    dsl = tmp_path / "form.json"
    dsl.write_text(
        json.dumps(form_dsl(content=["{UserFillUp:F@name} is {UserFillUp:F@age}, plan {UserFillUp:F@plan}"]))
    )
    # name, age (wrong, then right), plan (wrong, then right), then the optional fields left empty.
    answers = "go\nAnn\nforty\n41\ngold\npro\n\n\n\n\n"
    proc = chat(str(dsl), stdin=answers)
    assert proc.returncode == 0, proc.stderr
    assert "expected an integer, got 'forty'" in proc.stdout
    assert "'gold' is not one of the options" in proc.stdout
    assert "Ann is 41, plan pro" in proc.stdout


def test_state_file_makes_each_invocation_one_turn(tmp_path):
    dsl = tmp_path / "form.json"
    dsl.write_text(
        json.dumps(form_dsl(form={"x": {"name": "X", "type": "integer"}}, content=["x is {UserFillUp:F@x}"]))
    )
    state = tmp_path / "state.json"
    first = chat(str(dsl), "--state", str(state), "--query", "start")
    assert first.returncode == 0, first.stderr
    assert "Hello start, please fill in" in first.stdout
    assert json.loads(state.read_text())["path"] == ["UserFillUp:F"]
    second = chat(str(dsl), "--state", str(state), stdin="12\n")
    assert "x is 12" in second.stdout
    snapshot = json.loads(state.read_text())
    assert snapshot["path"] == [] and snapshot["globals"]["sys.conversation_turns"] == 1


def test_a_broken_dsl_file_is_reported_not_a_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"components": {}, "path": [], "history": [], "retrieval": []}')
    proc = chat(str(bad))
    assert proc.returncode == 2
    assert "error: the DSL has no 'begin' component" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_keyed_memory_nodes_run_in_the_terminal(tmp_path):
    """The terminal chat has no database; keyed memory lives for the process."""
    from agent.chat import _load

    dsl = tmp_path / "memo.json"
    dsl.write_text(json.dumps(form_dsl()))
    canvas = _load(str(dsl), None)
    assert canvas.services["memory_store"].load("LLM:X", "u1") == []


def test_a_file_field_asks_for_a_path_and_the_prompt_reads_the_file(tmp_path):
    from tests.agent.dsl_helpers import make_dsl, node
    from tests.files import make_pdf

    form = {"doc": {"name": "Your document", "type": "file"}}
    dsl = make_dsl(
        node("UserFillUp:F", "UserFillUp", {"inputs": form, "enable_tips": True, "tips": "Which file?"}),
        node("Message:Out", "Message", {"content": ["You sent: {UserFillUp:F@doc}"]}),
    )
    (tmp_path / "form.json").write_text(json.dumps(dsl))
    (tmp_path / "my notes.pdf").write_bytes(make_pdf(["Buy more tea"]))
    (tmp_path / "tool.exe").write_bytes(b"MZ")
    # A missing path, then an unsupported type, then the PDF (quoted: its name has a space).
    answers = f"go\n{tmp_path / 'gone.pdf'}\n{tmp_path / 'tool.exe'}\n'{tmp_path / 'my notes.pdf'}'\n"
    proc = chat(str(tmp_path / "form.json"), stdin=answers)
    assert proc.returncode == 0, proc.stderr
    assert "Your document [path to a file; several separated by spaces]:" in proc.stdout
    assert "cannot read" in proc.stdout and "No such file" in proc.stdout
    assert "unsupported file type ('.exe')" in proc.stdout
    assert "You sent: [file: my notes.pdf]\nBuy more tea" in proc.stdout
