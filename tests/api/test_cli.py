"""The ``agentcanvas`` command as a real process, from a directory other than the project's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api.services import tokens
from tests.api.conftest import ROOT, Api, echo_dsl

AGENTCANVAS = Path(sys.executable).parent / "agentcanvas"


@pytest.fixture
def cli(database_url, tmp_path):
    if not AGENTCANVAS.exists():
        pytest.fail(f"{AGENTCANVAS} is missing: install the project with `make install` (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTCANVAS_")}
    env["AGENTCANVAS_DATABASE_URL"] = database_url

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(AGENTCANVAS), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        if ok:
            assert done.returncode == 0, done.stderr
        return done

    return run


def test_token_create_list_revoke(cli, app_factory):
    token = cli("token", "create", "--tenant", "acme").stdout.strip().splitlines()[-1].split()[-1]
    app = app_factory()
    api = Api(app, token)
    assert api.get("/agents").status_code == 200

    listing = cli("token", "list").stdout
    assert token not in listing and token[:9] in listing
    token_id = api.get("/system/tokens").json["data"][0]["id"]
    assert token_id in listing

    cli("token", "revoke", token)
    # Revoked in another process (the CLI): a worker trusts a token it looked up for at
    # most TOKEN_CACHE_SECONDS, so the token is refused within that time, never later.
    refused_by = time.monotonic() + tokens.TOKEN_CACHE_SECONDS + 0.05
    status = api.get("/agents").status_code
    while status == 200 and time.monotonic() < refused_by:
        time.sleep(0.02)
        status = api.get("/agents").status_code
    assert status == 401
    failed = cli("token", "revoke", token, ok=False)
    assert failed.returncode != 0 and "no such token" in failed.stderr

    embed = cli("token", "create", "--tenant", "acme", "--embed").stdout.split()[-1]
    assert embed.startswith("acembed-")


def test_agent_import_export_and_bare_dsl(cli, app_factory, tmp_path):
    cli("agent", "import", str(ROOT / "samples" / "greeting.json"), "--tenant", "acme")
    bare = tmp_path / "my_echo.json"
    bare.write_text(json.dumps(echo_dsl()))
    cli("agent", "import", str(bare), "--tenant", "acme")
    token = cli("token", "create", "--tenant", "acme").stdout.split()[-1]
    api = Api(app_factory(), token)
    assert sorted(a["title"] for a in api.get("/agents").json["data"]["canvas"]) == ["Greeting", "my_echo"]

    # RAGFlow's templates title themselves per language: the English one is taken.
    cli("agent", "import", str(ROOT / "tests" / "agent" / "data" / "ragflow_intake.json"), "--tenant", "acme")
    titles = sorted(a["title"] for a in api.get("/agents").json["data"]["canvas"])
    assert titles == ["Age check (hand-written in RAGFlow's export shape)", "Greeting", "my_echo"]
    api.delete(
        f"/agents/{[a for a in api.get('/agents').json['data']['canvas'] if a['title'].startswith('Age')][0]['id']}"
    )

    again = cli("agent", "import", str(bare), "--tenant", "acme", ok=False)
    assert again.returncode == 2 and "'my_echo' already exists" in again.stderr
    broken = tmp_path / "broken.json"
    broken.write_text(
        json.dumps({**echo_dsl(), "components": {"begin": {"obj": {"component_name": "Nope"}}}})
    )
    failed = cli("agent", "import", str(broken), ok=False)
    assert failed.returncode == 2 and "begin" in failed.stderr and "'Nope'" in failed.stderr
    missing = cli("agent", "import", str(tmp_path / "absent.json"), ok=False)
    assert "cannot read" in missing.stderr
    assert len(api.get("/agents").json["data"]["canvas"]) == 2


def test_quickstart_sets_up_token_and_samples_once(cli, app_factory):
    first = cli("quickstart", "--no-serve", "--port", "9999").stdout
    token = first.strip().splitlines()[-1].split()[-1]
    api = Api(app_factory(), token)
    titles = sorted(a["title"] for a in api.get("/agents").json["data"]["canvas"])
    samples = sorted(json.loads(p.read_text())["title"] for p in (ROOT / "samples").glob("*.json"))
    assert titles == samples
    for agent in api.get("/agents").json["data"]["canvas"]:
        assert f"http://127.0.0.1:9999/api/v1/agents/{agent['id']}/completions" in first
    cli("quickstart", "--no-serve")
    assert len(api.get("/agents").json["data"]["canvas"]) == len(samples)


def test_run_chats_without_a_server(cli, tmp_path):
    state = tmp_path / "state.json"
    out = cli(
        "run", str(ROOT / "samples" / "greeting.json"), "--state", str(state), "--query", "hello"
    ).stdout
    assert "You said: hello" in out and state.exists()


def test_bad_database_url_is_reported(cli, tmp_path):
    env = {**os.environ, "AGENTCANVAS_DATABASE_URL": "oracle://nowhere/db"}
    done = subprocess.run(
        [str(AGENTCANVAS), "token", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "unsupported scheme 'oracle'" in done.stderr


def test_quickstart_makes_the_sample_dataset_that_the_docs_assistant_cites(cli, app_factory):
    import time

    from tests.llm_server import LLMServer

    first = cli("quickstart", "--no-serve").stdout
    assert "dataset 'agentcanvas docs': 3 documents" in first
    token = first.strip().splitlines()[-1].split()[-1]
    with LLMServer() as llm:
        app = app_factory(SETTINGS={"llm": llm.settings(max_retries=0)}, PARSE_POLL_SECONDS=0.05)
        api = Api(app, token)
        ds = api.get("/datasets", query_string={"name": "agentcanvas docs"}).json["data"][0]["id"]
        deadline = time.monotonic() + 60
        while {d["run"] for d in api.get(f"/datasets/{ds}/documents").json["data"]["docs"]} != {"DONE"}:
            assert time.monotonic() < deadline, "the sample documents were not parsed"
            time.sleep(0.05)
        agent = next(a for a in api.get("/agents").json["data"]["canvas"] if a["title"] == "Docs assistant")
        reply = api.ask(agent["id"], None, "How are citations marked in an answer?").json["data"]
        assert "[ID:" in reply["data"]["content"]
        assert reply["reference"]["doc_aggs"][0]["doc_name"] == "knowledge-bases.md"
    assert "already there" in cli("quickstart", "--no-serve").stdout


def test_a_command_starts_without_the_model_client():
    """``openai`` is the app's largest import (about half of a command's start-up): a
    command loads it only when a model is called (``serve``: before its workers fork)."""
    code = (
        "import sys, api.cli\n"
        "print('openai' in sys.modules)\n"
        "from agent.llm.client import load_sdk\n"
        "print(load_sdk().__name__, 'openai' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "openai", "True"]


def test_a_database_command_starts_without_the_web_app(database_url):
    """``agentcanvas token create`` (``list``, ``revoke``) needs the database, not Flask,
    the app's routes, the OpenAPI description or the canvas runtime: importing the
    ``api`` package does not build or import the app, and the command imports neither
    (together about half of a command's start-up)."""
    heavy = ("api.app", "api.blueprints", "api.openapi", "flask", "agent.canvas")
    code = (
        "import sys\n"
        "from api.cli import main\n"
        "codes = main(['token', 'create', '--tenant', 'light']), main(['token', 'list'])\n"
        f"print(*codes, [m for m in {heavy!r} if m in sys.modules])\n"
        "import api\n"
        "print(api.create_app.__module__, 'api.app' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTCANVAS_")}
    env["AGENTCANVAS_DATABASE_URL"] = database_url
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-2:] == ["0 0 []", "api.app True"], done.stdout
    assert lines[1].split()[-1].startswith("ac-")  # the token was made
