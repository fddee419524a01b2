"""What every session of one agent shares (checked params, load results) stays read-only
and never carries one session's state into another."""

from __future__ import annotations

import copy
import itertools
import json

import pytest

from agent.canvas import Canvas
from tests.agent.dsl_helpers import answer, final, make_dsl, node

FORM = {
    "name": {"name": "Name", "type": "line"},
    "tags": {"name": "Tags", "type": "object", "optional": True, "value": ["new"]},
}


def signup_dsl() -> dict:
    return make_dsl(
        node("UserFillUp:Ask", "UserFillUp", {"inputs": FORM, "tips": "Who are you, {sys.query}?"}),
        node(
            "VariableAssigner:Note",
            "VariableAssigner",
            {
                "variables": [
                    {"variable": "env.names", "operator": "append", "parameter": "UserFillUp:Ask@name"},
                    {"variable": "env.count", "operator": "+=", "parameter": 1},
                ]
            },
        ),
        node(
            "Message:Done",
            "Message",
            {"content": ["{UserFillUp:Ask@name} {UserFillUp:Ask@tags} #{env.count} {env.names}"]},
        ),
        variables={"names": {"type": "array<string>", "value": []}, "count": {"type": "number", "value": 0}},
    )


def interleaved(*runs):
    """The events of several runs, taken one from each in turn."""
    out: list[list[dict]] = [[] for _ in runs]
    for step in itertools.zip_longest(*runs):
        for i, event in enumerate(step):
            if event is not None:
                out[i].append(event)
    return out


def test_two_sessions_of_one_agent_interleaved_keep_their_own_state():
    dsl = json.dumps(signup_dsl())
    snapshots = {"a": dsl, "b": dsl}
    names = {"a": ["Ann", "Abe", "Ada"], "b": ["Bob", "Bea", "Bo"]}
    for turn in range(3):
        canvases = {s: Canvas(text) for s, text in snapshots.items()}
        assert (
            canvases["a"].components["UserFillUp:Ask"]._param
            is canvases["b"].components["UserFillUp:Ask"]._param
        )
        paused = interleaved(*(c.run(query=f"{s}{turn}") for s, c in canvases.items()))
        assert [final(events)["tips"] for events in paused] == [
            f"Who are you, a{turn}?",
            f"Who are you, b{turn}?",
        ]
        snapshots = {s: str(c) for s, c in canvases.items()}

        canvases = {s: Canvas(text) for s, text in snapshots.items()}
        tags = {"a": {"tags": ["vip"]}, "b": {}}  # b keeps the form's default
        done = interleaved(*(c.run(inputs={"name": names[s][turn], **tags[s]}) for s, c in canvases.items()))
        assert [final(events)["status"] for events in done] == ["succeeded", "succeeded"]
        said = {s: json.dumps(names[s][: turn + 1]) for s in canvases}
        assert answer(done[0]) == f'{names["a"][turn]} ["vip"] #{turn + 1} {said["a"]}'
        assert answer(done[1]) == f'{names["b"][turn]} ["new"] #{turn + 1} {said["b"]}'
        snapshots = {s: str(c) for s, c in canvases.items()}

    # What the sessions did is in their snapshots only: the agent's DSL is as written.
    for text in snapshots.values():
        assert json.loads(text)["components"] == signup_dsl()["components"]
    assert Canvas(dsl).globals["env.names"] == []


def test_shared_params_refuse_changes_and_copies_of_them_are_free():
    canvas = Canvas(signup_dsl())
    form = canvas.components["UserFillUp:Ask"]._param.inputs
    with pytest.raises(TypeError, match="shared by every session"):
        form["tags"]["value"].append("changed")
    with pytest.raises(TypeError, match="shared by every session"):
        form.pop("name")
    with pytest.raises(TypeError, match="shared by every session"):
        canvas.components["UserFillUp:Ask"]._param.tips = "changed"
    mine = copy.deepcopy(form)
    mine["tags"]["value"].append("mine")
    assert isinstance(form, dict) and isinstance(form["tags"]["value"], list)
    assert json.loads(json.dumps(form)) == FORM
    assert Canvas(signup_dsl()).components["UserFillUp:Ask"]._param.inputs == FORM
