"""Knowledge bases through ``ragflow-sdk`` (0.22.1 and 0.27.x), against a real server.

The whole flow a RAGFlow user writes: create a dataset, upload a PDF, a DOCX, a
Markdown and a CJK text file, parse, poll until DONE, retrieve, chat with a Retrieval
agent and read the citations from ``Message.reference``. The LLM and the embedding
model are the test server (tests/llm_server.py). One server per (SDK, database) serves
the module; each test is a tenant of its own on it.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Deployment, ServerProcess, sdk_is_current, sdk_server_env
from tests.files import make_docx, make_pdf
from tests.llm_server import LLMServer

STARTER = (
    Path(__file__).resolve().parents[1] / "data" / "ragflow_templates" / "your_starter_dataset_chatbot.json"
)
MD = b"# Returns\n\nItems can be returned within 30 days with the receipt.\n"
CJK = "退货政策：收到商品后三十天内可以退货。".encode()


@pytest.fixture(scope="module")
def llm():
    with LLMServer() as server:
        yield server


@pytest.fixture(scope="module")
def sdk(module_sdk):
    """This module's SDK generation (module-scoped: one server per generation)."""
    return module_sdk


@pytest.fixture(scope="module")
def shared(sdk, module_database_url, llm, tmp_path_factory) -> Iterator[tuple[Deployment, ServerProcess]]:
    dep = Deployment(module_database_url, tmp_path_factory.mktemp("sdk-datasets"))
    try:
        yield dep, dep.server(**sdk_server_env(sdk), **llm_env(llm))
    finally:
        dep.close()


def tenant_client(sdk, shared):
    """A client of this generation for a new tenant of the module's server."""
    dep, server = shared
    return sdk.RAGFlow(api_key=dep.token(f"kb-{uuid.uuid4().hex[:8]}"), base_url=server.url)


def llm_env(llm: LLMServer) -> dict[str, str]:
    return {
        "AGENTCANVAS_LLM_BASE_URL": llm.url,
        "AGENTCANVAS_LLM_API_KEY": "test",
        "AGENTCANVAS_LLM_MODEL": llm.model,
    }


def wait_done(dataset, ids: list[str], seconds: float = 120) -> dict:
    """Poll as SDK users do (``list_documents``) until no document is RUNNING."""
    deadline = time.monotonic() + seconds
    while True:
        docs = {d.id: d for d in dataset.list_documents(page_size=100)}
        if all(docs[i].run not in ("RUNNING", "UNSTART") for i in ids):
            return docs
        assert time.monotonic() < deadline, {i: (d.run, d.progress_msg) for i, d in docs.items()}
        time.sleep(0.05)


def starter_dsl(dataset_id: str) -> dict:
    dsl = copy.deepcopy(json.loads(STARTER.read_text())["dsl"])
    dsl["components"]["Agent:StalePandasDream"]["obj"]["params"]["tools"][0]["params"]["kb_ids"] = [
        dataset_id
    ]
    return dsl


def test_whole_knowledge_base_flow(sdk, shared, llm):
    rag = tenant_client(sdk, shared)

    ds = rag.create_dataset(name="shop policies", embedding_model=llm.model)
    assert ds.chunk_method == "naive" and ds.embedding_model == llm.model
    files = [
        ("policy.pdf", make_pdf(["Shipping takes five working days.", "Refunds go back to the card."])),
        ("faq.docx", make_docx([("Heading 1", "Gift cards"), ("Normal", "Gift cards never expire.")])),
        ("returns.md", MD),
        ("退货.txt", CJK),
    ]
    docs = ds.upload_documents([{"display_name": name, "blob": blob} for name, blob in files])
    assert [d.name for d in docs] == [name for name, _ in files]
    assert {d.run for d in docs} == {"UNSTART"}

    ids = [d.id for d in docs]
    ds.async_parse_documents(ids)
    parsed = wait_done(ds, ids)
    assert {parsed[i].run for i in ids} == {"DONE"}, {i: parsed[i].progress_msg for i in ids}
    assert all(parsed[i].chunk_count >= 1 and parsed[i].progress == 1.0 for i in ids)

    pdf = parsed[ids[0]]
    chunks = pdf.list_chunks()
    assert "Shipping takes five working days." in chunks[0].content
    added = pdf.add_chunk(content="Store hours are nine to five.", important_keywords=["opening"])
    assert added.content == "Store hours are nine to five."

    found = rag.retrieve(dataset_ids=[ds.id], question="How many working days does shipping take?")
    assert "Shipping takes five working days." in found[0].content
    assert found[0].document_id == ids[0] and found[0].similarity > 0
    assert rag.retrieve(dataset_ids=[ds.id], question="opening")[0].id == added.id
    cjk = rag.retrieve(dataset_ids=[ds.id], question="退货政策")
    assert cjk[0].document_id == ids[3]

    rag.create_agent("Shop assistant", starter_dsl(ds.id))
    agent = next(a for a in rag.list_agents() if a.title == "Shop assistant")
    session = agent.create_session()
    answer = list(session.ask("Can items be returned within 30 days?", stream=False))[0]
    assert answer.content.startswith("Items can be returned within 30 days with the receipt. [ID:")
    assert [c["document_id"] for c in answer.reference] == [ids[2]]
    assert "returned within 30 days" in answer.reference[0]["content"]
    streamed = list(session.ask("Do gift cards expire?", stream=True))
    text = "".join(m.content for m in streamed)
    assert "Gift cards never expire." in text and "[ID:" in text
    if sdk_is_current(sdk):  # 0.27 reads the citations from the stream's message_end
        assert streamed[-1].content == "" and [c["document_id"] for c in streamed[-1].reference] == [ids[1]]

    ds.delete_documents(ids=[ids[1]])
    assert {d.id for d in ds.list_documents()} == {ids[0], ids[2], ids[3]}
    rag.delete_datasets(ids=[ds.id])
    assert rag.list_datasets() == []


def test_another_tenant_sees_nothing(sdk, shared):
    mine, theirs = tenant_client(sdk, shared), tenant_client(sdk, shared)
    ds = mine.create_dataset(name="private")
    assert theirs.list_datasets() == []
    with pytest.raises(Exception, match="not found"):
        theirs.retrieve(dataset_ids=[ds.id], question="anything")
    with pytest.raises(Exception, match="not found"):
        theirs.delete_datasets(ids=[ds.id])
    assert [d.id for d in mine.list_datasets()] == [ds.id]
