"""The Canvas core: loading and DSL errors, the run loop, events, limits, snapshots."""

from __future__ import annotations

import json

import pytest

from agent.canvas import SNAPSHOT_VERSION, Canvas, Limits
from agent.errors import DSLError, UsageError


def cpn(name, params=None, down=(), up=(), **extra):
    entry = {
        "obj": {"component_name": name, "params": params or {}},
        "downstream": list(down),
        "upstream": list(up),
    }
    entry.update(extra)
    return entry


def make_dsl(components, **top):
    dsl = {"components": components, "path": [], "history": [], "retrieval": []}
    dsl.update(top)
    return dsl


def greeting(content="Hello {sys.query}", **params):
    return make_dsl(
        {
            "begin": cpn("Begin", {"prologue": "Hi!"}, ["Message:Greet"]),
            "Message:Greet": cpn("Message", {"content": [content], **params}, [], ["begin"]),
        }
    )


def events_of(canvas, **kw):
    return list(canvas.run(**kw))


def names(events):
    return [e["event"] for e in events]


def answer(events):
    return "".join(e["data"]["content"] for e in events if e["event"] == "message")


# ---------------------------------------------------------------- loading errors
@pytest.mark.parametrize(
    ("dsl", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ({"components": {}, "path": [], "history": []}, "'retrieval'"),
        (make_dsl({"Message:A": cpn("Message", {"content": ["x"]})}), "no 'begin'"),
        (
            make_dsl({"begin": cpn("Begin", {}, ["Foo:Bar"]), "Foo:Bar": cpn("NoSuchThing")}),
            "Foo:Bar: unknown component type 'NoSuchThing'",
        ),
        (
            make_dsl({"begin": cpn("Begin", {}, ["Message:Gone"])}),
            "begin: downstream names missing component 'Message:Gone'",
        ),
        (
            make_dsl({"begin": cpn("Begin", {}, [], ["Message:Gone"])}),
            "begin: upstream names missing component 'Message:Gone'",
        ),
        (
            make_dsl(
                {
                    "begin": cpn("Begin", {}, ["Message:A"]),
                    "Message:A": cpn("Message", {"content": ["{LLM:Gone@content}"]}),
                }
            ),
            "Message:A: reference {LLM:Gone@content} names unknown component 'LLM:Gone'",
        ),
        (
            make_dsl(
                {
                    "begin": cpn("Begin", {}, ["Message:A"]),
                    "Message:A": cpn("Message", {"content": ["{env.nope}"]}),
                }
            ),
            "undeclared variable 'env.nope'",
        ),
        (
            make_dsl(
                {
                    "begin": cpn("Begin", {}, ["Message:A"]),
                    "Message:A": cpn("Message", {"content": ["{{ x "]}),
                }
            ),
            "Message:A: template",
        ),
        (make_dsl({"begin": cpn("Begin", {"mode": "party"})}), "begin: mode 'party'"),
        (
            make_dsl({"begin": cpn("Begin", {"inputs": {"a": {"type": "colour"}}})}),
            "field 'a' has unknown type 'colour'",
        ),
        (
            make_dsl({"begin": cpn("Begin", {"inputs": {"a": {"type": "options"}}})}),
            "needs an 'options' list",
        ),
        (make_dsl({"begin": cpn("Begin", {"max_retries": -1})}), "max_retries must be a whole number"),
        (make_dsl({"begin": cpn("Begin", {"exception_method": "goto"})}), "needs exception_goto"),
        (make_dsl({"begin": {"obj": {"params": {}}}}), "begin: unknown component type None"),
        (make_dsl({"begin": {"downstream": []}}), "begin: a component entry needs 'obj'"),
        (
            make_dsl(
                {"begin": {"obj": {"component_name": "Begin", "params": {}}, "downstream": "Message:A"}}
            ),
            "'downstream' must be a list",
        ),
        (make_dsl({"begin": cpn("Begin")}, path=["Message:X"]), "'path' names unknown component 'Message:X'"),
        (make_dsl({"begin": cpn("Begin")}, v=SNAPSHOT_VERSION + 1), "newer than this agentcanvas"),
        (
            make_dsl({"begin": cpn("Begin"), "Message:A": cpn("Message", {}, parent_id="Iteration:Gone")}),
            "parent_id names missing component 'Iteration:Gone'",
        ),
        (make_dsl({"begin": cpn("Begin")}, variables={"x": 3}), "variable 'x' must be an object"),
    ],
)
def test_bad_dsl_is_a_clear_error(dsl, fragment):
    with pytest.raises(DSLError) as info:
        Canvas(dsl)
    assert fragment in str(info.value)


def test_dsl_limits_are_enforced():
    many = {"begin": cpn("Begin")}
    many.update({f"Message:{i}": cpn("Message", {"content": ["x"]}) for i in range(5)})
    with pytest.raises(DSLError, match="6 components; the limit is 5"):
        Canvas(make_dsl(many), limits=Limits(max_components=5))
    text = json.dumps(greeting())
    with pytest.raises(DSLError, match="the limit is 100"):
        Canvas(text, limits=Limits(max_dsl_bytes=100, max_snapshot_bytes=100))


def test_unreachable_component_is_a_warning_not_an_error():
    dsl = greeting()
    dsl["components"]["Message:Lonely"] = cpn("Message", {"content": ["x"]})
    canvas = Canvas(dsl)
    assert canvas.warnings == ["Message:Lonely: no path from 'begin' reaches this component"]
    # A second load of the same components (checked once per process) warns the same.
    assert Canvas(str(canvas)).warnings == canvas.warnings


def test_unknown_params_and_graph_are_kept_verbatim():
    dsl = greeting()
    dsl["components"]["Message:Greet"]["obj"]["params"]["tenant_llm_id"] = 7
    dsl["graph"] = {"nodes": [{"id": "begin", "position": {"x": 1}}], "edges": []}
    dsl["something_new"] = {"kept": True}
    canvas = Canvas(dsl)
    events_of(canvas, query="x")
    out = json.loads(str(canvas))
    assert out["components"]["Message:Greet"]["obj"]["params"]["tenant_llm_id"] == 7
    assert out["graph"] == dsl["graph"]
    assert out["something_new"] == {"kept": True}


def test_ragflow_export_wrapper_is_unwrapped():
    canvas = Canvas({"title": "x", "dsl": greeting()})
    assert answer(events_of(canvas, query="you")) == "Hello you"


# ---------------------------------------------------------------- running and events
def test_events_have_the_design_shape_and_one_terminal_event():
    canvas = Canvas(greeting())
    events = events_of(canvas, query="bob", conversation_id="sess-1")
    assert names(events) == [
        "workflow_started",
        "node_started",
        "node_finished",
        "node_started",
        "message",  # the text known at once ("Hello " and the query) is one chunk
        "node_finished",
        "message_end",
        "workflow_finished",
    ]
    ids = {(e["message_id"], e["task_id"], e["session_id"]) for e in events}
    assert len(ids) == 1 and next(iter(ids))[2] == "sess-1"
    assert all(isinstance(e["created_at"], int) for e in events)
    finished = events[-1]["data"]
    assert finished["status"] == "succeeded" and finished["outputs"] == {"content": "Hello bob"}
    node = events[-3]["data"]
    assert node["component_id"] == "Message:Greet" and node["component_type"] == "Message"
    assert node["outputs"] == {"content": "Hello bob"} and node["error"] is None
    assert events[-2]["data"]["content"] == "Hello bob"


def test_turns_are_counted_and_history_is_bounded():
    canvas = Canvas(greeting(), limits=Limits(history_size=4))
    for i in range(5):
        events_of(canvas, query=f"q{i}", user_id="u1")
    assert canvas.globals["sys.conversation_turns"] == 5
    assert canvas.globals["sys.dialogue_count"] == 5
    assert canvas.globals["sys.user_id"] == "u1"
    assert canvas.history == [
        ["user", "q3"],
        ["assistant", "Hello q3"],
        ["user", "q4"],
        ["assistant", "Hello q4"],
    ]


def test_sys_history_reads_the_conversation():
    canvas = Canvas(greeting("{sys.history}"))
    events_of(canvas, query="one")
    second = answer(events_of(canvas, query="two"))
    assert json.loads(second) == [{"role": "user", "content": "one"}, {"role": "assistant", "content": "[]"}]


def test_fan_out_runs_each_branch_and_a_join_once():
    dsl = make_dsl(
        {
            "begin": cpn("Begin", {}, ["Message:A", "Message:B"]),
            "Message:A": cpn("Message", {"content": ["A"]}, ["Message:Join"], ["begin"]),
            "Message:B": cpn("Message", {"content": ["B"]}, ["Message:Join"], ["begin"]),
            "Message:Join": cpn("Message", {"content": ["J"]}, [], ["Message:A", "Message:B"]),
        }
    )
    events = events_of(Canvas(dsl), query="")
    assert answer(events) == "A\n\nB\n\nJ"
    assert events[-2]["data"]["content"] == "A\n\nB\n\nJ"


# ---------------------------------------------------------------- templates
@pytest.mark.parametrize(
    "value",
    [r"C:\new\1 \g<0>", "{sys.user_id}", "{{ 7 * 7 }}", "{% for x in range(3) %}x{% endfor %}", "{begin@x}"],
)
def test_values_are_inserted_literally_never_evaluated(value):
    plain = Canvas(greeting("You said: {sys.query}."))
    assert answer(events_of(plain, query=value, user_id="secret")) == f"You said: {value}."
    with_jinja = Canvas(greeting("{{ 'You said: ' }}{sys.query}{{ '.' }}"))
    assert answer(events_of(with_jinja, query=value, user_id="secret")) == f"You said: {value}."


def test_author_jinja_runs_in_a_sandbox():
    ok = Canvas(greeting("{% for w in ['a', 'b'] %}{{ w|upper }}{% endfor %} {sys.query}"))
    assert answer(events_of(ok, query="q")) == "AB q"
    evil = Canvas(greeting("{{ ''.__class__.__mro__[1].__subclasses__() }}"))
    events = events_of(evil, query="q")
    assert events[-1]["data"]["status"] == "failed"
    assert "unsafe" in events[-1]["data"]["error"] or "SecurityError" in events[-1]["data"]["error"]
    assert "subclasses" not in answer(events)


def test_a_param_that_is_one_reference_gets_the_raw_value():
    canvas = Canvas(greeting())
    canvas.globals["sys.files"] = [{"id": 1}]
    assert canvas.render_value("{sys.files}") == [{"id": 1}]
    assert canvas.render_value("files: {sys.files}") == 'files: [{"id": 1}]'
    assert canvas.render_value("{sys.files.0.id}") == 1
    assert canvas.render_value("{sys.files.5.id}") is None


# ---------------------------------------------------------------- failures, retries, limits
def test_failure_rolls_the_turn_back_and_names_the_component():
    canvas = Canvas(greeting("{{ ''.__class__.__mro__ }}"))
    before = str(canvas)
    events = events_of(canvas, query="q")
    assert names(events)[-1] == "workflow_finished"
    data = events[-1]["data"]
    assert data["status"] == "failed" and data["error"].startswith("Message:Greet:")
    assert data["content"] == data["error"]
    assert str(canvas) == before


def _failing_then_fallback(**params):
    return make_dsl(
        {
            "begin": cpn("Begin", {}, ["Message:Bad"]),
            "Message:Bad": cpn(
                "Message", {"content": ["{{ ''.__class__.__mro__ }}"], **params}, ["Message:Next"]
            ),
            "Message:Next": cpn("Message", {"content": ["next"]}, [], ["Message:Bad"]),
            "Message:Fallback": cpn("Message", {"content": ["fallback"]}),
        }
    )


def test_exception_goto_routes_to_the_fallback():
    canvas = Canvas(_failing_then_fallback(exception_method="goto", exception_goto=["Message:Fallback"]))
    events = events_of(canvas, query="q")
    assert events[-1]["data"]["status"] == "succeeded"
    assert answer(events) == "fallback"
    bad = [e for e in events if e["event"] == "node_finished" and e["data"]["component_id"] == "Message:Bad"][
        0
    ]
    assert "unsafe" in bad["data"]["error"]


def test_exception_default_value_continues_downstream():
    canvas = Canvas(_failing_then_fallback(exception_method="comment", exception_default_value="n/a"))
    events = events_of(canvas, query="q")
    assert events[-1]["data"]["status"] == "succeeded"
    assert answer(events) == "next"


def test_retries_wait_between_attempts_then_fail():
    canvas = Canvas(_failing_then_fallback(max_retries=2, delay_after_error=1.5))
    slept = []
    canvas.sleep = slept.append
    events = events_of(canvas, query="q")
    assert slept == [1.5, 1.5]
    assert events[-1]["data"]["status"] == "failed"


def test_step_limit_ends_an_endless_cycle():
    dsl = make_dsl(
        {
            "begin": cpn("Begin", {}, ["Message:A"]),
            "Message:A": cpn("Message", {"content": ["a"]}, ["Message:B"], ["begin", "Message:B"]),
            "Message:B": cpn("Message", {"content": ["b"]}, ["Message:A"], ["Message:A"]),
        }
    )
    canvas = Canvas(dsl, limits=Limits(max_steps=50))
    events = events_of(canvas, query="q")
    assert events[-1]["event"] == "workflow_finished"
    assert events[-1]["data"]["status"] == "failed"
    assert "limit is 50 (max_steps)" in events[-1]["data"]["error"]
    assert canvas.globals["sys.conversation_turns"] == 0


def test_wall_clock_limit_ends_the_run():
    canvas = Canvas(greeting(), limits=Limits(max_seconds=0))
    events = events_of(canvas, query="q")
    assert events[-1]["data"]["status"] == "failed"
    assert "max_seconds" in events[-1]["data"]["error"]


def test_cancellation_hook_stops_between_components_and_rolls_back():
    canvas = Canvas(greeting())
    before = str(canvas)
    calls = []

    def cancel():
        calls.append(1)
        return len(calls) > 1  # let begin run, stop before the Message

    canvas.cancel_check = cancel
    events = events_of(canvas, query="q")
    assert events[-1]["data"]["status"] == "cancelled"
    assert "message" not in names(events)
    assert str(canvas) == before
    canvas.cancel_check = None
    assert events_of(canvas, query="q")[-1]["data"]["status"] == "succeeded"


def test_snapshot_over_the_cap_is_a_clear_error():
    canvas = Canvas(greeting(), limits=Limits(max_snapshot_bytes=2000))
    events_of(canvas, query="x" * 3000)
    from agent.errors import SnapshotTooLarge

    with pytest.raises(SnapshotTooLarge, match="the limit is 2000"):
        str(canvas)


def test_the_snapshot_cap_counts_characters_in_its_utf8_too():
    """dump_utf8() (what a turn stores) and a kept canvas's load measure a non-ASCII
    snapshot as str() does: in characters, though its UTF-8 has more bytes."""
    from agent.errors import SnapshotTooLarge

    canvas = Canvas(json.dumps(greeting()))
    events_of(canvas, query="ü" * 1500)
    text = str(canvas)
    size = len(text)
    assert len(text.encode()) > size + 1000
    limits = Limits(max_snapshot_bytes=size, max_dsl_bytes=size)
    canvas.limits = limits
    data = canvas.dump_utf8(keepable=True)
    assert data == text.encode()
    loaded = canvas.keep(data).load(limits=limits)
    assert str(loaded) == text
    loaded.limits = Limits(max_snapshot_bytes=size - 1)
    with pytest.raises(
        SnapshotTooLarge, match=f"the session snapshot is {size} bytes; the limit is {size - 1} "
    ):
        loaded.dump_utf8()


def test_inputs_without_any_form_are_misuse():
    with pytest.raises(UsageError, match="no form is pending"):
        Canvas(greeting()).run(query="x", inputs={"a": 1})


# ---------------------------------------------------------------- snapshots
def test_load_and_dump_without_a_run_changes_nothing():
    canvas = Canvas(greeting())
    events_of(canvas, query="a")
    text = str(canvas)
    assert json.loads(str(Canvas(text))) == json.loads(text)
    assert str(Canvas(text)) == text


def test_old_format_is_migrated_and_reset_starts_over():
    dsl = greeting()
    dsl["variables"] = {"n": {"type": "number", "value": 3}}
    canvas = Canvas(dsl)
    assert json.loads(str(canvas))["v"] == SNAPSHOT_VERSION
    events_of(canvas, query="a")
    canvas.globals["env.n"] = 9
    canvas.reset()
    assert canvas.history == [] and canvas.path == []
    assert canvas.globals["sys.conversation_turns"] == 0
    assert canvas.globals["env.n"] == 3


@pytest.mark.parametrize("wrapped", [False, True])
def test_first_turn_failure_restores_a_canvas_loaded_from_text(wrapped):
    dsl = greeting("{{ ''.__class__.__mro__ }}")
    text = json.dumps({"title": "t", "dsl": dsl} if wrapped else dsl)
    fresh = str(Canvas(text))
    canvas = Canvas(text)
    assert list(canvas.run(query="q"))[-1]["data"]["status"] == "failed"
    assert str(canvas) == fresh
    assert list(canvas.run(query="q"))[-1]["data"]["status"] == "failed"
    assert str(canvas) == fresh


def test_variables_may_be_ragflows_list_shape_and_keep_it():
    dsl = greeting("n={env.n}")
    dsl["variables"] = [{"name": "n", "type": "number", "value": 4}]
    canvas = Canvas(dsl)
    assert answer(events_of(canvas, query="")) == "n=4"
    assert canvas.variable_type("n") == "number"
    assert json.loads(str(canvas))["variables"] == dsl["variables"]
    assert Canvas({**greeting(), "variables": []}).variables == {}


def test_a_dsl_that_failed_its_checks_fails_again_on_every_load():
    dsl = make_dsl(
        {"begin": cpn("Begin", {}, ["Message:A"]), "Message:A": cpn("Message", {"content": ["{env.x}"]})}
    )
    for _ in range(2):
        with pytest.raises(DSLError, match="undeclared variable 'env.x'"):
            Canvas(dsl)
    dsl["variables"] = {"x": {"type": "string", "value": "ok"}}
    assert answer(events_of(Canvas(dsl), query="")) == "ok"


# ---------------------------------------------------------------- memory
@pytest.mark.parametrize(
    "sample", ["intake_form", "iteration_demo", "counter", "greeting", "docs_assistant", "bad_template"]
)
def test_a_canvas_is_freed_when_its_last_reference_goes(sample):
    """No reference cycle keeps a canvas (its components, history and state) alive for
    the cyclic collector: a worker frees each turn's canvas at once, a failed turn's
    too (docs_assistant: Retrieval fails without datasets; a template the sandbox refuses)."""
    import gc
    import os
    import weakref

    if sample == "bad_template":
        text = json.dumps(greeting("{{ ''.__class__.__mro__ }}"))
    else:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(os.path.join(root, "samples", f"{sample}.json"), encoding="utf-8") as fh:
            text = json.dumps(json.load(fh)["dsl"])
    answers = {"name": "Ann", "age": "41", "plan": "pro", "notes": "n"}
    gc.collect()
    gc.disable()
    try:
        for _ in range(2):
            canvas = Canvas(text)
            events = events_of(canvas, query="3")
            if events[-1]["event"] == "user_inputs":
                canvas = Canvas(str(canvas))
                events = events_of(canvas, inputs=answers)
            assert events[-1]["event"] == "workflow_finished"
            text = str(canvas)
            gone = weakref.ref(canvas)
            del canvas, events
            assert gone() is None
    finally:
        gc.enable()
