"""Forms (docs/design.md §5): pause, resume, partial answers, rejected answers, Begin's form."""

from __future__ import annotations

import json

import pytest

from agent.canvas import Canvas, Limits
from agent.errors import InputError
from tests.agent.test_canvas import answer, cpn, events_of, make_dsl, names

FORM = {
    "name": {"name": "Name", "type": "line"},
    "age": {"name": "Age", "type": "integer"},
    "plan": {"name": "Plan", "type": "options", "options": ["basic", "pro"]},
    "score": {"name": "Score", "type": "float", "optional": True},
    "agree": {"name": "Agree", "type": "boolean", "optional": True},
    "meta": {"name": "Meta", "type": "object", "optional": True},
    "notes": {"name": "Notes", "type": "paragraph", "optional": True},
}


def form_dsl(form=None, tips="Hello {sys.query}, please fill in", content=None):
    content = content or [
        "{UserFillUp:F@name}|{UserFillUp:F@age}|{UserFillUp:F@plan}|{UserFillUp:F@meta}|{UserFillUp:F@agree}"
    ]
    return make_dsl(
        {
            "begin": cpn("Begin", {}, ["UserFillUp:F"]),
            "UserFillUp:F": cpn(
                "UserFillUp", {"tips": tips, "inputs": form or FORM}, ["Message:Done"], ["begin"]
            ),
            "Message:Done": cpn("Message", {"content": content}, [], ["UserFillUp:F"]),
        }
    )


def paused(events):
    assert names(events)[-1] == "user_inputs"
    return events[-1]["data"]


def test_pause_trims_the_path_and_sends_the_whole_form_with_tips():
    canvas = Canvas(form_dsl())
    data = paused(events_of(canvas, query="Ann"))
    assert canvas.path == ["UserFillUp:F"]
    assert data["tips"] == data["content"] == "Hello Ann, please fill in"
    assert list(data["inputs"]) == list(FORM)
    assert data["inputs"]["age"]["optional"] is False and data["inputs"]["notes"]["optional"] is True


def test_resume_converts_values_and_finishes_without_a_second_workflow_started():
    canvas = Canvas(form_dsl())
    events_of(canvas, query="q")
    events = events_of(
        canvas,
        inputs={"name": "Ann", "age": "41", "plan": {"value": "pro"}, "meta": '{"a": [1]}', "agree": "yes"},
    )
    assert "workflow_started" not in names(events)
    assert answer(events) == 'Ann|41|pro|{"a": [1]}|true'
    outputs = [e for e in events if e["event"] == "node_finished"][0]["data"]["outputs"]
    assert outputs["age"] == 41 and outputs["meta"] == {"a": [1]} and outputs["agree"] is True
    assert outputs["score"] is None
    assert canvas.history[-2:] == [["user", "q"], ["assistant", 'Ann|41|pro|{"a": [1]}|true']]


def test_partial_answers_are_kept_and_only_missing_fields_asked_again():
    canvas = Canvas(form_dsl())
    events_of(canvas, query="q")
    again = paused(events_of(canvas, inputs={"name": "Ann"}))
    assert list(again["inputs"]) == ["age", "plan"]
    # The snapshot keeps the partial answer across a reload.
    canvas = Canvas(str(canvas))
    again = paused(events_of(canvas, inputs={"plan": "basic"}))
    assert list(again["inputs"]) == ["age"]
    assert answer(events_of(canvas, inputs={"age": 7})).startswith("Ann|7|basic")


@pytest.mark.parametrize(
    ("inputs", "field", "fragment"),
    [
        ({"age": "forty"}, "age", "expected an integer, got 'forty'"),
        ({"age": 4.5}, "age", "expected an integer"),
        ({"age": True}, "age", "got a boolean"),
        ({"plan": "gold"}, "plan", "'gold' is not one of the options"),
        ({"meta": "{bad json"}, "meta", "expected JSON"),
        ({"score": "high"}, "score", "expected a number"),
        ({"agree": "maybe"}, "agree", "expected true or false"),
        ({"name": "two\nlines"}, "name", "single line"),
        ({"name": ""}, "name", "a value is required"),
        ({"colour": "red"}, "colour", "the form has no field 'colour'"),
        ({"notes": "x" * 70_000}, "notes", "the limit is 65536"),
    ],
)
def test_bad_answers_are_rejected_before_anything_changes(inputs, field, fragment):
    canvas = Canvas(form_dsl())
    events_of(canvas, query="q")
    before = str(canvas)
    with pytest.raises(InputError) as info:
        canvas.run(inputs={"name": "Ann", **inputs} if field != "name" else inputs)
    assert fragment in info.value.errors[field]
    assert "nothing was changed" in str(info.value)
    assert str(canvas) == before
    # The same snapshot can still be resumed.
    again = Canvas(before)
    assert answer(events_of(again, inputs={"name": "Ann", "age": 3, "plan": "pro"})).startswith("Ann|3|pro")


def test_not_an_object_of_answers_is_rejected():
    canvas = Canvas(form_dsl())
    events_of(canvas, query="q")
    with pytest.raises(InputError) as info:
        canvas.run(inputs=["Ann"])
    assert "expected an object" in info.value.errors["inputs"]


def test_a_turn_without_inputs_asks_the_pending_form_again():
    canvas = Canvas(form_dsl())
    events_of(canvas, query="q")
    events_of(canvas, inputs={"name": "Ann"})
    data = paused(events_of(canvas, query="what?"))
    assert list(data["inputs"]) == ["age", "plan"]


def test_reaching_a_form_again_starts_it_empty():
    canvas = Canvas(form_dsl(form={"x": {"name": "X", "type": "line"}}, content=["got {UserFillUp:F@x}"]))
    events_of(canvas, query="1")
    assert answer(events_of(canvas, inputs={"x": "first"})) == "got first"
    data = paused(events_of(canvas, query="2"))
    assert list(data["inputs"]) == ["x"]
    assert canvas.components["UserFillUp:F"].data.get("answers") in (None, {})
    assert "first" not in json.dumps(canvas.to_dict()["state"])


def test_default_values_fill_required_fields():
    form = {"x": {"name": "X", "type": "integer", "value": 5}}
    canvas = Canvas(form_dsl(form=form, content=["x={UserFillUp:F@x}"]))
    assert answer(events_of(canvas, query="q")) == "x=5"


def test_tips_can_be_turned_off():
    dsl = form_dsl()
    dsl["components"]["UserFillUp:F"]["obj"]["params"]["enable_tips"] = False
    assert paused(events_of(Canvas(dsl), query="q"))["tips"] == ""


def test_value_size_limit_is_configurable():
    canvas = Canvas(form_dsl(), limits=Limits(max_value_bytes=10))
    events_of(canvas, query="q")
    with pytest.raises(InputError) as info:
        canvas.run(inputs={"name": "a much longer name"})
    assert "the limit is 10" in info.value.errors["name"]


# ---------------------------------------------------------------- Begin's form
def begin_form_dsl(mode="task"):
    return make_dsl(
        {
            "begin": cpn(
                "Begin",
                {
                    "mode": mode,
                    "prologue": "Give me a city",
                    "inputs": {
                        "city": {"name": "City", "type": "line"},
                        "days": {"name": "Days", "type": "integer", "optional": True},
                    },
                },
                ["Message:M"],
            ),
            "Message:M": cpn(
                "Message", {"content": ["{begin@city} for {begin@days} days ({sys.query})"]}, [], ["begin"]
            ),
        }
    )


def test_task_mode_takes_begin_inputs_on_the_first_call():
    canvas = Canvas(begin_form_dsl())
    events = events_of(canvas, query="", inputs={"city": "Oslo", "days": "3"})
    assert events[0]["data"]["inputs"] == {"city": "Oslo", "days": 3}
    assert answer(events) == "Oslo for 3 days ()"
    # Begin's answers hold for the conversation.
    assert answer(events_of(canvas, query="again")) == "Oslo for 3 days (again)"


def test_begin_pauses_when_its_required_input_is_missing_then_resumes():
    canvas = Canvas(begin_form_dsl())
    data = paused(events_of(canvas, query="go"))
    assert data["component_id"] == "begin" and list(data["inputs"]) == ["city", "days"]
    assert answer(events_of(canvas, inputs={"city": "Rome"})) == "Rome for  days (go)"


def test_begin_rejects_undeclared_and_mistyped_inputs():
    canvas = Canvas(begin_form_dsl())
    with pytest.raises(InputError) as info:
        canvas.run(query="", inputs={"city": "Oslo", "weather": "sunny", "days": "many"})
    assert set(info.value.errors) == {"weather", "days"}
    assert canvas.globals["sys.conversation_turns"] == 0


def test_an_oversized_query_or_files_are_refused_before_anything_changes():
    canvas = Canvas(form_dsl(), limits=Limits(max_value_bytes=100))
    before = str(canvas)
    with pytest.raises(InputError) as info:
        canvas.run(query="x" * 101)
    assert "the limit is 100" in info.value.errors["query"]
    with pytest.raises(InputError) as info:
        canvas.run(query="ok", files=[{"name": "f" * 200}])
    assert set(info.value.errors) == {"files"}
    assert str(canvas) == before
