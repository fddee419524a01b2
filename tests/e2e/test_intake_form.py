"""The intake sample over HTTP: paused, a wrong answer refused, resumed partially, finished."""

from __future__ import annotations

from tests.e2e.conftest import SAMPLES, Client, read_sse


def test_intake_form_pause_refuse_resume_finish(deployment):
    token = deployment.token()
    agent_id = deployment.import_agent(SAMPLES / "intake_form.json")
    client = Client(deployment.server().url, token)
    session_id = client.create_session(agent_id)

    # First turn: the whole form is asked for, each field with its optional flag.
    frames = read_sse(client.ask_stream(agent_id, session_id, "I want to sign up"))
    assert frames[-1] == "[DONE]"
    form = frames[-2]
    assert form["event"] == "user_inputs"
    assert form["data"]["content"] == "Please tell us about yourself to sign up."
    asked = form["data"]["inputs"]
    assert set(asked) == {"name", "age", "plan", "notes"}
    assert [asked[k]["optional"] for k in ("name", "age", "plan", "notes")] == [False, False, False, True]
    paused = client.session(agent_id, session_id, dsl=True)
    assert paused["status"] == "paused" and paused["pending_form"] == "UserFillUp:Intake"
    assert paused["round"] == 1

    # Wrong types: a per-field error for each bad value, and the session exactly as it was.
    bad = client.ask(agent_id, session_id, inputs={"name": "Ann", "age": "forty", "plan": "gold"})
    assert bad.status_code == 400
    body = bad.json()
    assert body["code"] == 101
    errors = body["data"]["errors"]
    assert set(errors) == {"age", "plan"}
    assert "forty" in errors["age"] and "gold" in errors["plan"]
    assert client.session(agent_id, session_id, dsl=True) == paused

    # The same through a streamed call: refused before anything streams.
    bad_stream = client.ask_stream(agent_id, session_id, inputs={"age": {"value": "4.5"}})
    assert bad_stream.status_code == 400 and set(bad_stream.json()["data"]["errors"]) == {"age"}
    assert client.session(agent_id, session_id, dsl=True) == paused

    # Partial answers are kept; only the required field still missing is asked for.
    partial = client.ask(agent_id, session_id, inputs={"name": "Ann", "age": "41"})
    assert partial.status_code == 200, partial.text
    again = partial.json()["data"]
    assert again["event"] == "user_inputs"
    assert set(again["data"]["inputs"]) == {"plan"}
    resumed = client.session(agent_id, session_id, dsl=True)
    assert resumed["status"] == "paused" and resumed["version"] == paused["version"] + 1

    # Finished: the answer uses the values given in both calls (the age, converted to a
    # number, took the adult branch).
    done = read_sse(client.ask_stream(agent_id, session_id, inputs={"plan": "pro", "notes": "vegetarian"}))
    assert done[-1] == "[DONE]" and done[-2]["event"] == "message_end"
    answer = "".join(f["data"]["content"] for f in done[:-2])
    assert answer == "Thanks Ann! You are signed up for the pro plan. Notes: vegetarian"

    final = client.session(agent_id, session_id)
    assert final["status"] == "idle" and final["pending_form"] is None
    assert final["version"] == paused["version"] + 2 and final["round"] == 3
    messages = final["message"]
    assert (messages[0]["role"], messages[0]["content"]) == (
        "assistant",
        "Welcome! Send any message to start your sign-up.",
    )
    assert [m["role"] for m in messages[1:]] == ["user", "assistant"] * 3
    assert messages[1]["content"] == "I want to sign up"
    assert messages[2]["content"] == "Please tell us about yourself to sign up."
    assert messages[3]["inputs"] == {"name": "Ann", "age": 41}  # as the form accepted them
    assert messages[-1]["content"] == answer

    # The next turn starts the form empty: earlier answers are not reused.
    next_form = client.ask(agent_id, session_id, "once more").json()["data"]
    assert next_form["event"] == "user_inputs" and set(next_form["data"]["inputs"]) == {
        "name",
        "age",
        "plan",
        "notes",
    }
