"""The ``ragflow-sdk`` client from PyPI, used as its users use it, against a real server.

Every test runs with ragflow-sdk 0.22.1 and 0.27.x, on SQLite and MariaDB. One server
per (SDK, database) serves the whole module; each test is its own tenant (its own
token, made while the server runs), so it sees only its own agents and sessions.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.api.conftest import dsl_of, sample
from tests.e2e.conftest import Deployment, ServerProcess, sdk_is_current, sdk_server_env


@pytest.fixture(scope="module")
def sdk(module_sdk):
    """This module's SDK generation (module-scoped: one server per generation)."""
    return module_sdk


@pytest.fixture(scope="module")
def shared(sdk, module_database_url, tmp_path_factory) -> Iterator[tuple[Deployment, ServerProcess]]:
    dep = Deployment(module_database_url, tmp_path_factory.mktemp("sdk-server"))
    try:
        yield dep, dep.server(**sdk_server_env(sdk))
    finally:
        dep.close()


@pytest.fixture
def rag(sdk, shared):
    """A client of this generation, as a tenant of its own, on the module's server."""
    dep, server = shared
    return sdk.RAGFlow(api_key=dep.token(f"sdk-{uuid.uuid4().hex[:8]}"), base_url=server.url)


def by_title(rag, title: str) -> list:
    """The agents titled ``title``, as a user of either SDK generation finds them
    (0.27's ``list_agents`` has no ``title`` filter)."""
    return [a for a in rag.list_agents() if a.title == title]


def _agent(rag, title: str, dsl: dict):
    assert rag.create_agent(title, dsl) is None  # the SDK returns nothing: users look it up
    found = by_title(rag, title)
    assert [a.title for a in found] == [title]
    return found[0]


def test_agent_sessions_and_answers_streamed_and_blocking(rag):
    agent = _agent(rag, "Counter via SDK", sample("counter"))
    assert agent.dsl.components.begin.obj.component_name == "Begin"

    session = agent.create_session()
    assert session.agent_id == agent.id
    assert [m["content"] for m in session.message] == ["I count your messages in this session."]

    streamed = list(session.ask("hello", stream=True))
    assert streamed  # the answer's text is known at once: one chunk (streamed LLM text comes chunk by chunk)
    assert "".join(m.content for m in streamed) == "This is message number 1 in this session. You said: hello"

    blocking = list(session.ask("and again", stream=False))
    assert [m.content for m in blocking] == ["This is message number 2 in this session. You said: and again"]
    assert blocking[0].role == "assistant"

    other = agent.create_session()
    assert [m.content for m in other.ask("fresh", stream=False)] == [
        "This is message number 1 in this session. You said: fresh"
    ]

    listed = agent.list_sessions()
    assert {s.id for s in listed} == {session.id, other.id}
    assert all(s.agent_id == agent.id for s in listed)
    assert [s.id for s in agent.list_sessions(id=other.id)] == [other.id]

    agent.delete_sessions(ids=[session.id])
    assert [s.id for s in agent.list_sessions()] == [other.id]
    with pytest.raises(Exception, match=session.id):
        agent.delete_sessions(ids=[session.id])
    # What is left still works.
    assert [m.content for m in other.ask("still here", stream=False)] == [
        "This is message number 2 in this session. You said: still here"
    ]


def test_form_asked_and_answered_through_the_sdk(rag, sdk):
    agent = _agent(rag, "Intake via SDK", sample("intake_form"))
    session = agent.create_session()
    tips = "Please tell us about yourself to sign up."

    # A paused form reaches the user as its tips, in a stream and in a blocking reply
    # (with RAGFlow, 0.27 shows nothing in a stream: it reads only ``message`` events).
    assert [m.content for m in session.ask("sign me up", stream=True)] == [tips]
    again = agent.create_session()
    assert [m.content for m in again.ask("sign me up", stream=False)] == [tips]

    # 0.27's documented form of answers is {key: {"type", "value"}}; 0.22 users send values.
    answers = {"name": "Bo", "age": "16", "plan": "basic"}
    if sdk_is_current(sdk):
        answers = {"name": {"type": "line", "value": "Bo"}, "age": {"type": "integer", "value": 16}}
        answers["plan"] = {"type": "options", "value": "basic"}
    done = list(session.ask("", stream=False, inputs=answers))
    assert [m.content for m in done] == ["Sorry Bo, you must be 18 or older to sign up (you said 16)."]


def test_a_failed_turn_shows_its_error_to_the_sdk_user(rag):
    # 192.168.0.1 is private and not allow-listed: the Invoke fails before connecting.
    dsl = dsl_of(
        {
            "Invoke:Call": ("Invoke", {"url": "http://192.168.0.1/x", "method": "get"}, ["Message:Show"]),
            "Message:Show": ("Message", {"content": ["{Invoke:Call@result}"]}, []),
        }
    )
    session = _agent(rag, "Failing via SDK", dsl).create_session()
    streamed = [m.content for m in session.ask("go", stream=True)]
    assert len(streamed) == 1 and "192.168.0.1" in streamed[0] and "allow_hosts" in streamed[0]
    blocking = [m.content for m in session.ask("go", stream=False)]
    assert len(blocking) == 1 and "192.168.0.1" in blocking[0] and "allow_hosts" in blocking[0]


def test_agent_update_delete_and_refusals_through_the_sdk(rag):
    agent = _agent(rag, "Greeting via SDK", sample("greeting"))
    with pytest.raises(Exception, match="already"):
        rag.create_agent("Greeting via SDK", sample("greeting"))
    broken = sample("greeting")
    broken["components"]["Message:Greet"]["downstream"] = ["Message:Gone"]
    with pytest.raises(Exception, match="Message:Gone"):
        rag.create_agent("Broken via SDK", broken)
    assert by_title(rag, "Broken via SDK") == []

    rag.update_agent(agent.id, title="Hello via SDK", dsl=sample("counter"))
    assert by_title(rag, "Greeting via SDK") == []
    (renamed,) = by_title(rag, "Hello via SDK")
    assert renamed.id == agent.id
    answer = [m.content for m in renamed.create_session().ask("hi", stream=False)]
    assert answer == ["This is message number 1 in this session. You said: hi"]

    rag.delete_agent(agent.id)
    assert agent.id not in {a.id for a in rag.list_agents()}
    with pytest.raises(Exception, match=agent.id):
        rag.delete_agent(agent.id)


def test_delete_all_sessions_through_the_sdk(rag, sdk):
    agent = _agent(rag, "Counter to clear", sample("counter"))
    made = {agent.create_session().id for _ in range(3)}
    assert {s.id for s in agent.list_sessions()} == made
    if sdk_is_current(sdk):
        agent.delete_sessions(delete_all=True)
    else:  # 0.22's delete_sessions has no delete_all: the same request by hand
        assert rag.delete(f"/agents/{agent.id}/sessions", {"delete_all": True}).json()["code"] == 0
    assert agent.list_sessions() == []
    # Neither ids nor delete_all is refused with a message, not taken for "all".
    agent.create_session()
    with pytest.raises(Exception, match="delete_all"):
        agent.delete_sessions()
    assert len(agent.list_sessions()) == 1


def test_releases_through_the_sdk(rag):
    greeting = dsl_of({"Message:Say": ("Message", {"content": ["v1: {sys.query}"]}, [])})
    agent = _agent(rag, "Released via SDK", greeting)
    with pytest.raises(Exception, match="no published version"):
        agent.create_session(release=True)
    # Publish (PUT with release: the SDK's update_agent has no such argument).
    assert rag.put(f"/agents/{agent.id}", {"release": True}).json()["code"] == 0
    released = agent.create_session(release=True)
    fixed = dsl_of({"Message:Say": ("Message", {"content": ["v2: {sys.query}"]}, [])})
    rag.update_agent(agent.id, dsl=fixed)  # a draft: release callers do not see it

    assert [m.content for m in released.ask("hi", stream=False)] == ["v1: hi"]
    streamed = agent.create_session(release=True).ask("hi", stream=True)
    assert "".join(m.content for m in streamed) == "v1: hi"
    assert [m.content for m in agent.create_session().ask("hi", stream=False)] == ["v2: hi"]

    assert rag.put(f"/agents/{agent.id}", {"dsl": fixed, "release": True}).json()["code"] == 0
    assert [m.content for m in agent.create_session(release=True).ask("hi", stream=False)] == ["v2: hi"]
    # The session made before the fix was published stays on its version.
    assert [m.content for m in released.ask("again", stream=False)] == ["v1: again"]


def test_everything_session_ask_sends_is_accepted(rag, sdk):
    dsl = dsl_of({"Message:Who": ("Message", {"content": ["{sys.query} from {sys.user_id}"]}, [])})
    session = _agent(rag, "Who via SDK", dsl).create_session()
    extra = {"user_id": "visitor-7", "files": [], "custom_header": {"X-Trace": "abc"}}
    if sdk_is_current(sdk):  # 0.27's own parameters
        extra.update(release=True, return_trace=False)
    assert [m.content for m in session.ask("hi", stream=False, **extra)] == ["hi from visitor-7"]
    assert "".join(m.content for m in session.ask("yo", stream=True, **extra)) == "yo from visitor-7"
