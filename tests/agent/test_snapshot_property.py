"""Property: a conversation run in one Canvas and the same conversation with
``Canvas(str(canvas))`` between every turn give the same events and the same state;
so does one with ``canvas.keep(canvas.dump(keepable=True)).load()`` between every turn (the turn
service's per-process cache of canvases, api/services/canvas_cache.py)."""

from __future__ import annotations

import copy
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import jsonio
from agent.canvas import Canvas, Limits
from agent.component.form_base import _FORMS
from agent.errors import InputError, UsageError
from tests.agent.test_forms import form_dsl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOLATILE = {"message_id", "task_id", "created_at", "elapsed_time", "started_at", "sys.date", "sys.message_id"}


def sample(name):
    with open(os.path.join(ROOT, "samples", f"{name}.json"), encoding="utf-8") as fh:
        return json.load(fh)


def scrub(value):
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def play(dsl, script, reload_each_turn):
    """``reload_each_turn``: False, True (``Canvas(str(canvas))``) or ``"kept"``."""
    canvas = Canvas(dsl)
    transcript = []
    for step in script:
        if reload_each_turn == "kept":
            text = canvas.dump(keepable=True)
            if not canvas._plain:  # built from a dict: not kept, as it is
                assert canvas.keep(text) is None
                canvas = Canvas(text)
                assert canvas.keep(str(canvas)) is None  # not written to be kept
                text = canvas.dump(keepable=True)
            kept = canvas.keep(text)
            assert kept is not None and kept.text == text
            canvas = kept.load()
            assert str(canvas) == text
        elif reload_each_turn:
            canvas = Canvas(str(canvas))
        kind, payload = step
        try:
            if kind == "query":
                events = list(canvas.run(query=payload, user_id="u"))
            else:
                events = list(canvas.run(inputs=payload))
            transcript.append(scrub(events))
        except InputError as e:
            transcript.append({"input_error": e.errors})
        except UsageError as e:  # inputs with no form pending
            transcript.append({"usage_error": str(e)})
    return transcript, scrub(json.loads(str(canvas)))


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
answers = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(texts, st.just("Ann")),
        "age": st.one_of(st.integers(-5, 120), st.sampled_from(["41", "forty", "", "7.5"])),
        "plan": st.sampled_from(["basic", "pro", "gold"]),
        "notes": texts,
        "meta": st.sampled_from(['{"a": 1}', "{bad", "[1,2]"]),
        "bogus": st.just("x"),
    },
)
steps = st.lists(
    st.one_of(st.tuples(st.just("query"), texts), st.tuples(st.just("inputs"), answers)), max_size=8
)


def _dsls():
    yield form_dsl()
    yield sample("greeting")
    for name in ("intake_form", "counter", "iteration_demo"):
        if os.path.exists(os.path.join(ROOT, "samples", f"{name}.json")):
            try:
                Canvas(sample(name))
            except Exception:  # a component the sample needs may not exist in this checkout yet
                continue
            yield sample(name)


DSLS = list(_dsls())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dsl_index=st.integers(0, len(DSLS) - 1), script=steps)
def test_reloading_between_turns_changes_nothing(dsl_index, script):
    dsl = DSLS[dsl_index]
    straight = play(dsl, script, reload_each_turn=False)
    reloaded = play(dsl, script, reload_each_turn=True)
    assert straight == reloaded
    assert play(dsl, script, reload_each_turn="kept") == reloaded


def test_the_property_sees_pauses_answers_and_rejections():
    """Guard against a vacuous property: one fixed script exercises every path."""
    script = [
        ("query", "hi"),
        ("inputs", {"age": "forty"}),
        ("inputs", {"name": "Ann"}),
        ("inputs", {"age": 41, "plan": "pro"}),
        ("query", "again"),
        ("inputs", {"bogus": 1}),
    ]
    transcript, state = play(form_dsl(), script, reload_each_turn=True)
    assert transcript == play(form_dsl(), script, reload_each_turn=False)[0]
    assert play(form_dsl(), script, reload_each_turn="kept") == (transcript, state)
    kinds = [t[-1]["event"] if isinstance(t, list) else next(iter(t)) for t in transcript]
    assert kinds == [
        "user_inputs",
        "input_error",
        "user_inputs",
        "workflow_finished",
        "user_inputs",
        "input_error",
    ]
    assert state["globals"]["sys.conversation_turns"] == 2


def _attributes(canvas):
    """What a canvas and its components hold, as comparable values (objects by type);
    without what the DSL alone decides, worked out once and kept (see _check_derived)."""

    def value(v):
        if callable(v) or type(v).__module__.startswith("agent.") and not isinstance(v, (dict, list)):
            return type(v).__name__
        return v

    skipped = ("_finished_late", "_started_late", "_components_json", "_history_written")
    own = {k: value(v) for k, v in vars(canvas).items() if k not in skipped}
    own["components"] = {
        cid: {k: value(v) for k, v in vars(cpn).items() if k != "_canvas" and k not in cpn.param_derived}
        for cid, cpn in canvas.components.items()
    }
    return own


def _check_derived(canvas):
    """What a kept canvas keeps of its DSL is what its DSL gives: the components' JSON,
    and each form's worked-out form (its params' own, shared); and of its history, the
    JSON of the entries it has (written by the last dump)."""
    written = canvas._components_json
    if written is not None:
        assert written[0] is canvas.dsl["components"]
        assert written[1] == jsonio.dumps(canvas.dsl["components"]).encode()
    history = canvas._history_written
    if history is not None:
        assert history.entries == canvas.history
        assert history.text == jsonio.dumps(canvas.history).encode()
    for cpn in canvas.components.values():
        assert set(vars(cpn)) & cpn.param_derived <= {"_form"}
        if "_form" in vars(cpn):
            assert cpn._form is _FORMS[cpn._param]


def test_a_kept_canvas_loads_as_the_snapshot_would():
    """Attribute by attribute (components' too): what a turn's run left behind is gone."""
    from tests.agent.test_loop import loop_dsl

    script = [("query", "hi"), ("inputs", {"name": "Ann", "age": 41, "plan": "pro"}), ("query", "a b")]
    for dsl in [*DSLS, loop_dsl()]:
        canvas = Canvas(str(Canvas(dsl)))
        for kind, payload in script:
            try:
                list(canvas.run(**({"query": payload} if kind == "query" else {"inputs": payload})))
            except (InputError, UsageError):
                continue
            plain = str(canvas)
            text = canvas.dump(keepable=True)
            assert text == plain == jsonio.dumps_plain(canvas.to_dict())[0]  # the same text
            services = {"a": 1}
            kept = canvas.keep(text)
            assert kept is not None
            canvas = kept.load(services=services)
            assert _attributes(canvas) == _attributes(Canvas(text, services=services))
            _check_derived(canvas)


def test_a_kept_canvas_builds_anew_a_component_a_run_added_to():
    """A component that gained an attribute (one its params do not decide) is not kept as
    the object it is: loading the kept canvas builds it as loading its snapshot would."""
    canvas = Canvas(str(Canvas(form_dsl())))
    list(canvas.run(query="hi"))
    form = canvas.component("UserFillUp:F")
    form.noted = "left by a run"
    cleared = [c for c in canvas.components.values() if c is not form]
    text = canvas.dump(keepable=True)
    loaded = canvas.keep(text).load()
    assert loaded.component(form.id) is not form and not hasattr(loaded.component(form.id), "noted")
    assert all(loaded.component(c.id) is c for c in cleared)  # the others are kept, cleared
    assert _attributes(loaded) == _attributes(Canvas(text))


def test_a_canvas_a_run_added_an_attribute_to_is_not_kept():
    canvas = Canvas(str(Canvas(form_dsl())))
    list(canvas.run(query="hi"))  # a run adds its own two (_finished_late, _started_late)
    assert canvas.keep(canvas.dump(keepable=True)) is not None
    canvas = Canvas(str(Canvas(form_dsl())))
    list(canvas.run(query="hi"))
    canvas.sleep = lambda seconds: None  # (a test's own wait)
    assert canvas.keep(canvas.dump(keepable=True)) is None


def test_what_only_the_standard_library_reads_or_writes_is_not_kept():
    value = {"a": [1, {"b": "ü"}], "c": None}
    assert jsonio.dumps_plain(value) == ('{"a":[1,{"b":"ü"}],"c":null}', True)
    for odd in ({"a": 2**70}, {"a": {1: "x"}}):
        assert jsonio.dumps_plain(odd) == (jsonio.dumps(odd), False)

    canvas = Canvas(str(Canvas(sample("greeting")["dsl"])))
    list(canvas.run(query="hi"))
    canvas.globals["sys.big"] = 2**70  # written by the standard library
    assert canvas.keep(canvas.dump(keepable=True)) is None
    text = str(Canvas(sample("greeting")["dsl"]))
    assert '"variables":{}' in text
    loaded = Canvas(text.replace('"variables":{}', '"variables":{},"x":NaN'))  # read by the standard library
    assert loaded.keep(loaded.dump(keepable=True)) is None  # it holds nan where str() writes null
    again = Canvas(str(loaded))
    assert again.keep(again.dump(keepable=True)) is not None


def test_the_snapshot_text_is_what_one_json_call_writes():
    """dump() writes the components' JSON once per canvas and the rest each time: the text
    is the one json call's, whatever the members' order, and what only the standard
    library writes is written by it whole, as before."""
    dsl = sample("intake_form")["dsl"]
    canvas = Canvas(json.dumps(dsl))
    for kind, payload in [("query", "hi"), ("inputs", {"name": "Ann", "age": 41, "plan": "pro"})]:
        list(canvas.run(**({"query": payload} if kind == "query" else {"inputs": payload})))
        for _ in range(2):  # the components' JSON written, then reused
            assert canvas.dump() == jsonio.dumps_plain(canvas.to_dict())[0]
    assert canvas._components_json[0] is canvas.dsl["components"]
    canvas.globals["sys.big"] = 2**70  # the rest only the standard library writes
    assert canvas.dump() == jsonio.dumps_plain(canvas.to_dict())[0]
    assert canvas.dump().startswith('{"components":{"begin":')
    history_first = Canvas(json.dumps({"history": [], **dsl}))
    assert history_first.dump() == jsonio.dumps_plain(history_first.to_dict())[0]
    assert history_first.dump().startswith('{"history":[],"components":')
    big = Canvas(
        {
            **dsl,
            "components": {
                **dsl["components"],
                "x": {"obj": {"component_name": "Message", "params": {"content": ["hi"], "n": 2**70}}},
            },
        }
    )
    assert big.dump() == jsonio.dumps_plain(big.to_dict())[0]
    assert big._components_json is None  # written whole by the standard library
    only = Canvas(json.dumps({"components": dsl["components"], "path": [], "history": [], "retrieval": []}))
    assert only.dump() == jsonio.dumps_plain(only.to_dict())[0]


def test_the_history_is_written_anew_where_it_changed():
    """dump() reuses the JSON of the history entries the last dump wrote: whatever changed
    the history since (a turn, an edit, a rollback, a reset), the text is the one json
    call's, and a kept canvas goes on from it."""
    dsl = sample("intake_form")["dsl"]
    limits = Limits(history_size=6)
    edits = {
        3: lambda h: h.__setitem__(1, ["assistant", "edited ≥"]),  # an entry replaced
        4: lambda h: h.insert(0, ["user", "older"]),
        5: lambda h: h.__delitem__(2),
        6: lambda h: h.append({"role": "user", "content": "a dict"}),  # not a pair: written whole
        8: lambda h: h.__setitem__(0, ["user", 2**70]),  # only the standard library writes it
        9: lambda h: h.clear(),
        11: lambda h: h.extend([["user", "x"], ["user", "x"], ["assistant", "y"]]),  # equal entries
        12: lambda h: h.reverse(),
        14: lambda h: h.__delitem__(slice(0, 2)),  # the oldest dropped, none added
        15: lambda h: h.insert(0, h.pop(3)),  # a later entry, the very object, moved first
    }
    canvas = Canvas(json.dumps(dsl), limits=limits)
    not_kept = []
    for turn in range(16):
        for body in ({"query": f"hi {turn} ü"}, {"inputs": {"name": "Ann", "age": 41, "plan": "pro"}}):
            list(canvas.run(**body))
            if turn in edits and "query" in body:  # edited between two dumps
                edits.pop(turn)(canvas.history)
            assert str(canvas) == jsonio.dumps_plain(canvas.to_dict())[0]
            text = canvas.dump(keepable=True)
            assert text == jsonio.dumps_plain(canvas.to_dict())[0]
            assert json.loads(text)["history"] == canvas.history
            kept = canvas.keep(text)
            if kept is None:
                not_kept.append((turn, "inputs" in body))
            canvas = kept.load(limits=limits) if kept is not None else Canvas(text, limits=limits)
            _check_derived(canvas)
    # Not kept while the history ends with the dict, and with what only the standard library writes.
    assert not_kept == [(6, False), (8, False)]
    assert len(canvas.history) == 6
    canvas.history.append(["user", "not kept"])
    canvas.limits.max_steps = 1  # the turn fails: the history it began with is back
    events = list(canvas.run(query="fails"))
    assert events[-1]["data"]["status"] == "failed"
    assert canvas.dump() == jsonio.dumps_plain(canvas.to_dict())[0]
    assert json.loads(canvas.dump())["history"] == json.loads(text)["history"]
    canvas.reset()
    assert canvas.dump() == jsonio.dumps_plain(canvas.to_dict())[0]


def test_a_conversation_that_repeats_itself_is_written_right():
    """Every exchange the same (a form filled in with the same answers again and again),
    the oldest dropped past history_size: each dump is the one json call's, through a
    canvas kept from turn to turn, and the history keeps its last entries."""
    dsl = sample("intake_form")["dsl"]
    limits = Limits(history_size=6)
    canvas = Canvas(json.dumps(dsl), limits=limits)
    for turn in range(12):
        for body in ({"query": "sign me up"}, {"inputs": {"name": "Ann", "age": 41, "plan": "pro"}}):
            list(canvas.run(**json.loads(json.dumps(body))))  # fresh strings, equal ones
            text = canvas.dump(keepable=True)
            assert text == jsonio.dumps_plain(canvas.to_dict())[0]
            kept = canvas.keep(text)
            assert kept is not None, turn
            canvas = kept.load(limits=limits)
    history = json.loads(text)["history"]
    assert len(history) == 6 and history == canvas.history
    assert history[0][1] == "sign me up" and history[:2] == history[2:4] == history[4:]


def test_the_entries_a_turn_adds_cannot_be_changed_in_place():
    """So the JSON a dump wrote of them holds; copies are ordinary lists."""
    canvas = Canvas(json.dumps(sample("greeting")["dsl"]))
    list(canvas.run(query="hi"))
    entry = canvas.history[0]
    assert entry == ["user", "hi"]
    for change in (lambda: entry.append("x"), lambda: entry.__setitem__(1, "x"), lambda: entry.clear()):
        with pytest.raises(TypeError, match="history entry cannot be changed"):
            change()
    assert type(copy.deepcopy(entry)) is list and type(list(entry)) is list
    assert Canvas(canvas.to_dict()).history == canvas.history
