"""Files end to end: real ``agentcanvas serve`` processes, real HTTP uploads, and the test
LLM server seeing what the model is sent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Client
from tests.files import make_pdf, make_png
from tests.llm_server import API_KEY, LLMServer

PDF_TEXT = "Clause 7: the tenant waters the ficus"


@pytest.fixture
def llm() -> Iterator[LLMServer]:
    with LLMServer() as server:
        yield server


def llm_env(llm: LLMServer, **more: str) -> dict[str, str]:
    return {
        "AGENTCANVAS_LLM_BASE_URL": llm.url,
        "AGENTCANVAS_LLM_API_KEY": API_KEY,
        "AGENTCANVAS_LLM_MODEL": llm.model,
        "AGENTCANVAS_LLM_VISION": "1",
        **more,
    }


def form_dsl() -> dict:
    """A UserFillUp asking for a contract file, an LLM reading it, a Message with the answer."""
    return {
        "components": {
            "begin": {
                "obj": {"component_name": "Begin", "params": {"prologue": "Hi"}},
                "downstream": ["UserFillUp:Ask"],
                "upstream": [],
            },
            "UserFillUp:Ask": {
                "obj": {
                    "component_name": "UserFillUp",
                    "params": {
                        "enable_tips": True,
                        "tips": "Upload the contract",
                        "inputs": {"contract": {"name": "Contract", "type": "file"}},
                    },
                },
                "downstream": ["LLM:Read"],
                "upstream": ["begin"],
            },
            "LLM:Read": {
                "obj": {
                    "component_name": "LLM",
                    "params": {
                        "prompts": [{"role": "user", "content": "{sys.query}\n{UserFillUp:Ask@contract}"}]
                    },
                },
                "downstream": ["Message:Out"],
                "upstream": ["UserFillUp:Ask"],
            },
            "Message:Out": {
                "obj": {"component_name": "Message", "params": {"content": ["{LLM:Read@content}"]}},
                "downstream": [],
                "upstream": ["LLM:Read"],
            },
        },
        "path": [],
        "history": [],
        "retrieval": [],
    }


def upload(client: Client, agent_id: str, *files: tuple[str, bytes]):
    return client.post(f"/agents/{agent_id}/upload", files=[("file", (name, data)) for name, data in files])


def last_user_content(llm: LLMServer):
    return llm.chat_requests()[-1]["messages"][-1]["content"]


def test_a_pdf_answered_in_a_form_and_an_attached_image_reach_the_model(deployment, llm):
    server = deployment.server(**llm_env(llm, AGENTCANVAS_MAX_FILE_BYTES="5000"))
    client = Client(server.url, deployment.token())
    agent = client.create_agent("contract reader", form_dsl())

    paused = client.ask(agent, None, "start")
    assert paused.json()["data"]["event"] == "user_inputs", paused.text
    session = paused.json()["data"]["session_id"]
    pdf = upload(client, agent, ("contract.pdf", make_pdf([PDF_TEXT])))
    assert pdf.status_code == 200, pdf.text
    done = client.ask(agent, session, "", inputs={"contract": {"value": [pdf.json()["data"]["id"]]}})
    assert done.status_code == 200, done.text
    assert last_user_content(llm) == f"start\n[file: contract.pdf]\n{PDF_TEXT}"

    # The next turn attaches an image: it reaches the model as an image part.
    png = upload(client, agent, ("dot.png", make_png())).json()["data"]
    client.ask(agent, session, "start")
    done = client.ask(agent, session, "", inputs={"contract": [png]})
    assert done.status_code == 200, done.text
    parts = last_user_content(llm)
    assert parts[1]["type"] == "image_url" and parts[1]["image_url"]["url"].startswith(
        "data:image/png;base64,"
    )

    # AGENTCANVAS_MAX_FILE_BYTES is the server's limit for one file.
    too_big = upload(client, agent, ("big.txt", b"x" * 5001))
    assert too_big.status_code == 413 and "AGENTCANVAS_MAX_FILE_BYTES" in too_big.json()["message"]


@pytest.mark.parametrize("database_url", ["mysql"], indirect=True)
def test_a_file_uploaded_through_one_server_is_used_by_a_turn_on_the_other(deployment, llm):
    # Pieces of 4 KiB: a file of several pieces crosses the database between the two.
    first = deployment.server(**llm_env(llm, AGENTCANVAS_FILES_PIECE_BYTES="4096"))
    second = deployment.server(**llm_env(llm, AGENTCANVAS_FILES_PIECE_BYTES="4096"))
    token = deployment.token()
    a, b = Client(first.url, token), Client(second.url, token)
    agent = a.create_agent("reader", form_dsl())
    pdf_bytes = make_pdf([PDF_TEXT] + [f"page {n}" for n in range(2, 40)])
    assert len(pdf_bytes) > 3 * 4096
    import time

    t = time.time()
    pdf = upload(a, agent, ("long.pdf", pdf_bytes)).json()["data"]
    print("upload", time.time() - t)
    t = time.time()

    paused = b.ask(agent, None, "read this")
    session = paused.json()["data"]["session_id"]
    print("ask1", time.time() - t)
    t = time.time()
    done = b.ask(agent, session, "", inputs={"contract": pdf["id"]})
    print("ask2", time.time() - t)
    t = time.time()
    assert done.status_code == 200, done.text
    sent = last_user_content(llm)
    assert sent.startswith(f"read this\n[file: long.pdf]\n{PDF_TEXT}")
    assert b.get(f"/agents/attachments/{pdf['id']}/download").content == pdf_bytes
