"""The Retrieval component and tool in agents: citations, references, isolation (SQLite and MariaDB).

The LLM is the test server (tests/llm_server.py): offered a retrieval tool it calls it
with the user's question; given knowledge blocks it answers with the best block's
first sentence cited as ``[ID:n]``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.api.conftest import Api, dsl_of, make_token, parse_sse
from tests.api.test_datasets import parsed_dataset
from tests.llm_server import LLMServer, Reply

STARTER = (
    Path(__file__).resolve().parents[1] / "data" / "ragflow_templates" / "your_starter_dataset_chatbot.json"
)


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


@pytest.fixture
def app(app_factory, llm):
    return app_factory(SETTINGS={"llm": llm.settings(max_retries=0)})


def starter_dsl(dataset_id: str) -> dict:
    """RAGFlow's template as shipped, with only its Retrieval tool's kb_ids set."""
    dsl = copy.deepcopy(json.loads(STARTER.read_text())["dsl"])
    tool = dsl["components"]["Agent:StalePandasDream"]["obj"]["params"]["tools"][0]
    tool["params"]["kb_ids"] = [dataset_id]
    return dsl


def retrieval_llm_dsl(kb_ids: list, cite: bool = True) -> dict:
    return dsl_of(
        {
            "Retrieval:Find": ("Retrieval", {"kb_ids": kb_ids, "query": "{sys.query}"}, ["LLM:Answer"]),
            "LLM:Answer": (
                "LLM",
                {"sys_prompt": "Answer from:\n{Retrieval:Find@formalized_content}", "cite": cite},
                ["Message:Out"],
            ),
            "Message:Out": ("Message", {"content": ["{LLM:Answer@content}"]}, []),
        }
    )


def test_ragflow_starter_template_answers_with_citations(api: Api, llm: LLMServer):
    ds, ids = parsed_dataset(api)
    agent = api.create_agent(starter_dsl(ds))
    resp = api.ask(agent, None, "How are documents parsed?")
    assert resp.status_code == 200, resp.json
    event = resp.json["data"]
    answer = event["data"]["content"]
    assert answer.endswith("[ID:0]")
    # The reference at the event's top level (ragflow-sdk) and in its data (current RAGFlow).
    assert event["reference"] == event["data"]["reference"]
    chunks = event["reference"]["chunks"]
    assert len(chunks) == 1 and "parsed in the background" in chunks[0]["content"]
    assert chunks[0]["document_id"] == ids[0] and chunks[0]["dataset_id"] == ds
    assert event["reference"]["doc_aggs"] == [{"doc_name": "guide.md", "doc_id": ids[0], "count": 1}]
    # The model was told to cite and read the knowledge blocks from the tool.
    # The transcript keeps the cited chunks with the answer (RAGFlow's message "reference").
    messages = api.session(agent, event["session_id"])["message"]
    assert messages[-1]["reference"] == chunks
    first, second = llm.chat_requests()[-2:]
    assert "[ID:n]" in first["messages"][0]["content"]
    assert any("ID: 0" in str(m.get("content")) for m in second["messages"] if m["role"] == "tool")


def test_streamed_answer_ends_with_the_reference(api: Api):
    ds, _ = parsed_dataset(api)
    agent = api.create_agent(retrieval_llm_dsl([ds]))
    frames = api.ask_stream(agent, None, "知识库")
    end = next(f for f in frames if isinstance(f, dict) and f["event"] == "message_end")
    assert "[ID:0]" in "".join(
        f["data"]["content"] for f in frames if isinstance(f, dict) and f["event"] == "message"
    )
    assert end["reference"]["chunks"][0]["content"].startswith("知识库检索")
    assert end["data"]["reference"] == end["reference"]
    assert frames[-1] == "[DONE]"


def test_retrieval_outputs_and_the_snapshot_keeps_found_chunks(api: Api):
    ds, _ = parsed_dataset(api)
    agent = api.create_agent(
        dsl_of(
            {
                "Retrieval:Find": ("Retrieval", {"kb_ids": [ds], "top_n": 1}, ["Message:Out"]),
                "Message:Out": ("Message", {"content": ["{Retrieval:Find@formalized_content}"]}, []),
            }
        )
    )
    resp = api.ask(agent, None, "background chunks")
    content = resp.json["data"]["data"]["content"]
    assert content.startswith("ID: 0\n├── Title: guide.md\n└── Content:\n")
    session = api.session(agent, resp.json["data"]["session_id"])
    assert "reference" not in resp.json["data"]  # nothing was cited
    assert session["id"]


def test_no_match_gives_the_empty_response(api: Api):
    ds, _ = parsed_dataset(api)
    dsl = dsl_of(
        {
            "Retrieval:Find": (
                "Retrieval",
                {"kb_ids": [ds], "empty_response": "Nothing found."},
                ["Message:Out"],
            ),
            "Message:Out": ("Message", {"content": ["{Retrieval:Find@formalized_content}"]}, []),
        }
    )
    agent = api.create_agent(dsl)
    assert api.ask(agent, None, "zebra").json["data"]["data"]["content"] == "Nothing found."


def test_cite_false_gives_no_citation_prompt(api: Api, llm: LLMServer):
    ds, _ = parsed_dataset(api)
    agent = api.create_agent(retrieval_llm_dsl([ds], cite=False))
    api.ask(agent, None, "parsing")
    assert "[ID:n]" not in llm.chat_requests()[-1]["messages"][0]["content"]


def test_kb_ids_by_reference_and_by_name(api: Api):
    ds, _ = parsed_dataset(api)
    dsl = retrieval_llm_dsl(["begin@kb"])
    dsl["components"]["begin"]["obj"]["params"]["inputs"] = {"kb": {"name": "KB", "type": "line"}}
    agent = api.create_agent(dsl)
    resp = api.ask(agent, None, "parsing documents", inputs={"kb": "docs"})
    assert resp.status_code == 200, resp.json
    assert resp.json["data"]["reference"]["chunks"]


def test_another_tenants_dataset_is_not_found_at_save_and_at_run(app, api: Api, llm: LLMServer):
    ds, _ = parsed_dataset(api)
    other = Api(app, make_token(app, "tenant-b"))
    resp = other.post("/agents", json={"title": "steal", "dsl": retrieval_llm_dsl([ds])})
    assert resp.status_code == 404 and "Retrieval:Find" in resp.json["message"] and ds in resp.json["message"]
    # A reference is resolved at run time, as the caller's tenant: not found either.
    dsl = retrieval_llm_dsl(["begin@kb"])
    dsl["components"]["begin"]["obj"]["params"]["inputs"] = {"kb": {"name": "KB", "type": "line"}}
    agent = other.create_agent(dsl)
    resp = other.ask(agent, None, "parsing", inputs={"kb": ds})
    assert resp.status_code == 500 and "not found" in resp.json["message"]
    resp = api.put(
        f"/agents/{api.create_agent(retrieval_llm_dsl([ds]))}", json={"dsl": retrieval_llm_dsl(["nope"])}
    )
    assert resp.status_code == 404 and "'nope'" in resp.json["message"]


def _agent_with_tools(tools: list) -> dict:
    return {"llm_id": "test-model", "sys_prompt": "Use the tools.", "tools": tools}


def _retrieval_tool(kb_ids: list) -> dict:
    return {"component_name": "Retrieval", "name": "search_docs", "params": {"kb_ids": kb_ids}}


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_a_retrieval_tool_at_any_depth_is_checked_at_save(app, api: Api, depth: int):
    """Retrieval as an Agent's tool, inside an Agent used as a tool, ...: its kb_ids are
    the saving tenant's datasets or the save is refused, naming the tool and the dataset."""
    ds, _ = parsed_dataset(api)
    tool = _retrieval_tool([ds])
    for level in range(depth - 1):
        tool = {"component_name": "Agent", "name": f"helper{level}", "params": _agent_with_tools([tool])}
    dsl = dsl_of({"Agent:Outer": ("Agent", _agent_with_tools([tool]), [])})
    assert api.post("/agents", json={"title": "mine", "dsl": dsl}).status_code == 200

    other = Api(app, make_token(app, "tenant-b"))
    resp = other.post("/agents", json={"title": "steal", "dsl": dsl})
    assert resp.status_code == 404, resp.json
    assert "Agent:Outer-->" in resp.json["message"] and "search_docs" in resp.json["message"]
    assert repr(ds) in resp.json["message"]


@pytest.mark.parametrize(
    "params, fix",
    [
        ({"kb_ids": ["x"], "rerank_id": "bge"}, "rerank_id"),
        ({"kb_ids": ["x"], "use_kg": True}, "use_kg"),
        ({"kb_ids": ["x"], "toc_enhance": True}, "toc_enhance"),
        ({"kb_ids": ["x"], "top_n": 0}, "top_n"),
        ({"kb_ids": ["x"], "similarity_threshold": "high"}, "similarity_threshold"),
        ({"kb_ids": "x", "retrieval_from": "memory"}, "retrieval_from"),
        ({"kb_ids": [3]}, "kb_ids"),
    ],
)
def test_unsupported_params_are_refused_at_save(api: Api, params, fix):
    dsl = dsl_of({"Retrieval:Find": ("Retrieval", params, [])})
    resp = api.post("/agents", json={"title": "bad", "dsl": dsl})
    assert (
        resp.status_code == 400 and "Retrieval:Find" in resp.json["message"] and fix in resp.json["message"]
    )


def test_empty_kb_ids_load_with_a_warning(api: Api):
    resp = api.post("/agents", json={"title": "t", "dsl": dsl_of({"Retrieval:Find": ("Retrieval", {}, [])})})
    assert resp.status_code == 200


def test_openai_endpoint_carries_the_reference(api: Api):
    ds, ids = parsed_dataset(api)
    agent = api.create_agent(retrieval_llm_dsl([ds]))
    body = {"model": "x", "messages": [{"role": "user", "content": "知识库"}]}
    resp = api.post(f"/agents_openai/{agent}/chat/completions", json=body)
    message = resp.json["choices"][0]["message"]
    assert message["content"].endswith("[ID:0]")
    assert [c["document_id"] for c in message["reference"]["chunks"]] == [ids[1]]
    streamed = api.post(f"/agents_openai/{agent}/chat/completions", json={**body, "stream": True})
    frames = [
        f for f in parse_sse(streamed.get_data(as_text=True).replace("data: ", "data:")) if f != "[DONE]"
    ]
    last = next(f for f in frames if f["choices"] and f["choices"][0]["finish_reason"] == "stop")
    assert last["choices"][0]["delta"]["reference"] == message["reference"]


def test_vector_search_mixes_scores_and_its_wait_obeys_the_turn_deadline(app_factory, llm: LLMServer):
    app = app_factory(SETTINGS={"llm": llm.settings(max_retries=0)}, LIMITS={"max_seconds": 1})
    api = Api(app, make_token(app))
    resp = api.post("/datasets", json={"name": "vectors", "embedding_model": llm.model})
    ds = resp.json["data"]["id"]
    from tests.api.test_datasets import MD, upload, wait_parsed

    doc = upload(api, ds, ("guide.md", MD)).json["data"][0]["id"]
    api.post(f"/datasets/{ds}/chunks", json={"document_ids": [doc]})
    assert wait_parsed(api, ds, [doc])[doc]["run"] == "DONE"
    assert any(r["path"].endswith("/embeddings") for r in llm.requests)
    found = api.post("/retrieval", json={"question": "parsed in the background", "dataset_ids": [ds]}).json[
        "data"
    ]
    top = found["chunks"][0]
    assert top["vector_similarity"] > 0 and top["term_similarity"] > 0
    assert abs(top["similarity"] - (0.7 * top["term_similarity"] + 0.3 * top["vector_similarity"])) < 1e-5

    agent = api.create_agent(retrieval_llm_dsl([ds]))
    llm.queue(Reply(delay=30))  # the question's embedding never comes in time
    resp = api.ask(agent, None, "parsing")
    assert resp.status_code >= 400 and "max_seconds" in resp.json["message"], resp.json
