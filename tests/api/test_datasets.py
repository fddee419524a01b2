"""Knowledge bases over REST: datasets, documents, parsing, chunks, retrieval (SQLite and MariaDB)."""

from __future__ import annotations

import io
import logging
import sqlite3
import threading
import time

import pytest

from tests.api.conftest import Api, make_token
from tests.files import make_docx, make_pdf

MD = b"""# Retrieval

The Retrieval component searches datasets and returns the best chunks.

# Parsing

Documents are parsed in the background and split into chunks by tokens.
"""
CJK = "知识库检索会返回最相关的文本块。数据集属于租户。".encode()


def wait_parsed(api: Api, ds: str, doc_ids: list[str], seconds: float = 60) -> dict:
    """Poll the documents until none is RUNNING (a safety net, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while True:
        docs = {d["id"]: d for d in api.get(f"/datasets/{ds}/documents").json["data"]["docs"]}
        if all(docs[i]["run"] != "RUNNING" for i in doc_ids):
            return docs
        assert time.monotonic() < deadline, f"documents still parsing: {docs}"
        time.sleep(0.05)


def create_dataset(api: Api, name: str = "docs", **extra) -> str:
    resp = api.post("/datasets", json={"name": name, **extra})
    assert resp.status_code == 200, resp.json
    return resp.json["data"]["id"]


def upload(api: Api, ds: str, *files: tuple[str, bytes]):
    data = {"file": [(io.BytesIO(content), name) for name, content in files]}
    return api.post(f"/datasets/{ds}/documents", data=data, content_type="multipart/form-data")


def parsed_dataset(api: Api, files=None) -> tuple[str, list[str]]:
    ds = create_dataset(api)
    files = files or [("guide.md", MD), ("cjk.txt", CJK)]
    resp = upload(api, ds, *files)
    assert resp.status_code == 200, resp.json
    ids = [d["id"] for d in resp.json["data"]]
    assert api.post(f"/datasets/{ds}/chunks", json={"document_ids": ids}).status_code == 200
    docs = wait_parsed(api, ds, ids)
    assert all(docs[i]["run"] == "DONE" for i in ids), docs
    return ds, ids


def test_dataset_crud_and_listing(api):
    ds = create_dataset(api, "kb one", description="about things", parser_config={"chunk_token_num": 128})
    listed = api.get("/datasets").json
    assert listed["code"] == 0 and [d["id"] for d in listed["data"]] == [ds]
    item = listed["data"][0]
    assert item["chunk_method"] == "naive" and item["parser_config"]["chunk_token_num"] == 128
    assert item["document_count"] == 0 and item["embedding_model"] == ""
    assert api.get("/datasets", query_string={"name": "kb one"}).json["data"][0]["id"] == ds
    resp = api.put(f"/datasets/{ds}", json={"name": "kb renamed", "parser_config": {"delimiter": "\n."}})
    assert resp.json["data"]["name"] == "kb renamed"
    assert resp.json["data"]["parser_config"] == {"chunk_token_num": 128, "delimiter": "\n."}
    assert api.post("/datasets", json={"name": "kb renamed"}).status_code == 409
    assert api.delete("/datasets", json={"ids": [ds]}).json["code"] == 0
    assert api.get("/datasets").json["data"] == []


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "'name'"),
        ({"name": ""}, "'name'"),
        ({"name": 3}, "'name'"),
        ({"name": "x", "chunk_method": "book"}, "chunk_method"),
        ({"name": "x", "parser_config": {"chunk_token_num": 0}}, "chunk_token_num"),
        ({"name": "x", "parser_config": []}, "parser_config"),
        ({"name": "x", "permission": "all"}, "permission"),
    ],
)
def test_bad_dataset_bodies_name_the_field(api, body, field):
    resp = api.post("/datasets", json=body)
    assert resp.status_code == 400 and resp.json["code"] == 101, resp.json
    assert field in resp.json["message"]
    assert api.get("/datasets").json["data"] == []


def test_upload_parse_list_download_and_chunks(api):
    pdf = make_pdf(["A PDF page about parsers.", "Second page mentions retrieval."])
    docx = make_docx([("Heading 1", "Word files"), ("Normal", "DOCX paragraphs become chunks too.")])
    ds, ids = parsed_dataset(
        api, [("guide.md", MD), ("paper.pdf", pdf), ("notes.docx", docx), ("cjk.txt", CJK)]
    )
    docs = api.get(f"/datasets/{ds}/documents").json["data"]
    assert docs["total"] == 4
    for doc in docs["docs"]:
        assert doc["run"] == "DONE" and doc["progress"] == 1.0 and doc["chunk_count"] >= 1
        assert doc["token_count"] > 0 and "Done" in doc["progress_msg"]
    pdf_id = ids[1]
    resp = api.get(f"/datasets/{ds}/documents/{pdf_id}")
    assert resp.status_code == 200 and resp.data == pdf
    chunks = api.get(f"/datasets/{ds}/documents/{pdf_id}/chunks").json["data"]
    assert chunks["total"] >= 1 and "parsers" in chunks["chunks"][0]["content"]
    assert chunks["doc"]["id"] == pdf_id
    found = api.get(f"/datasets/{ds}/documents/{ids[0]}/chunks", query_string={"keywords": "background"})
    assert all("background" in c["content"] for c in found.json["data"]["chunks"])
    assert api.get("/datasets").json["data"][0]["document_count"] == 4


def test_retrieval_finds_ranked_chunks_with_doc_aggs(api):
    ds, ids = parsed_dataset(api)
    resp = api.post("/retrieval", json={"question": "How are documents parsed?", "dataset_ids": [ds]})
    data = resp.json["data"]
    assert resp.status_code == 200 and data["total"] >= 1
    top = data["chunks"][0]
    assert "parsed in the background" in top["content"]
    assert top["document_id"] == ids[0] and top["dataset_id"] == ds
    assert top["similarity"] == top["term_similarity"] > 0.2
    assert data["doc_aggs"][0] == {"doc_id": ids[0], "doc_name": "guide.md", "count": data["total"]}
    cjk = api.post("/retrieval", json={"question": "知识库", "dataset_ids": [ds], "highlight": True}).json[
        "data"
    ]
    assert cjk["chunks"][0]["document_id"] == ids[1]
    assert "<em>知识</em>" in cjk["chunks"][0]["highlight"]
    none = api.post("/retrieval", json={"question": "zebra", "dataset_ids": [ds]}).json["data"]
    assert none == {"chunks": [], "doc_aggs": [], "total": 0}
    only_cjk = api.post(
        "/retrieval", json={"question": "retrieval 知识库", "dataset_ids": [ds], "document_ids": [ids[1]]}
    ).json["data"]
    assert {c["document_id"] for c in only_cjk["chunks"]} == {ids[1]}


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"dataset_ids": ["x"]}, 400, "'question'"),
        ({"question": "q"}, 400, "'dataset_ids'"),
        ({"question": "q", "dataset_ids": "nope"}, 404, "'nope'"),
        ({"question": "q", "dataset_ids": [1]}, 400, "dataset_ids"),
        ({"question": "q", "dataset_ids": ["DS"], "similarity_threshold": 2}, 400, "similarity_threshold"),
        ({"question": "q", "dataset_ids": ["DS"], "page_size": 0}, 400, "page_size"),
        ({"question": "q", "dataset_ids": ["DS"], "document_ids": ["nope"]}, 404, "nope"),
    ],
)
def test_bad_retrieval_requests(api, body, status, field):
    ds = create_dataset(api)
    body = {k: ([ds if i == "DS" else i for i in v] if isinstance(v, list) else v) for k, v in body.items()}
    resp = api.post("/retrieval", json=body)
    assert resp.status_code == status and field in resp.json["message"], resp.json


def test_chunks_added_edited_and_deleted_by_hand_are_searchable(api):
    ds, ids = parsed_dataset(api)
    base = f"/datasets/{ds}/documents/{ids[0]}/chunks"
    resp = api.post(
        base, json={"content": "Hand-made chunk about zebras.", "important_keywords": ["stripes"]}
    )
    chunk = resp.json["data"]["chunk"]
    assert chunk["content"] == "Hand-made chunk about zebras." and chunk["important_keywords"] == ["stripes"]
    search = {"question": "stripes", "dataset_ids": [ds]}
    assert [c["id"] for c in api.post("/retrieval", json=search).json["data"]["chunks"]] == [chunk["id"]]
    assert api.put(f"{base}/{chunk['id']}", json={"content": "Now about giraffes."}).status_code == 200
    moved = api.post("/retrieval", json={"question": "giraffes", "dataset_ids": [ds]}).json["data"]
    assert [c["id"] for c in moved["chunks"]] == [chunk["id"]]
    assert api.patch(f"{base}/{chunk['id']}", json={"available": False}).status_code == 200
    assert (
        api.post("/retrieval", json={"question": "giraffes", "dataset_ids": [ds]}).json["data"]["total"] == 0
    )
    assert api.post(base, json={"content": ""}).status_code == 400
    assert api.put(f"{base}/nope", json={"content": "x"}).status_code == 404
    assert api.delete(base, json={"chunk_ids": [chunk["id"]]}).json["data"]["success_count"] == 1
    assert api.delete(base, json={"chunk_ids": ["nope"]}).status_code == 404


def test_documents_renamed_and_deleted_take_their_chunks(api):
    ds, ids = parsed_dataset(api)
    resp = api.put(f"/datasets/{ds}/documents/{ids[0]}", json={"name": "renamed.md"})
    assert resp.json["data"]["name"] == "renamed.md"
    assert api.put(f"/datasets/{ds}/documents/{ids[0]}", json={"name": "x.pdf"}).status_code == 400
    assert api.delete(f"/datasets/{ds}/documents", json={"ids": [ids[0], "nope"]}).status_code == 404
    assert api.get(f"/datasets/{ds}/documents").json["data"]["total"] == 2
    assert api.delete(f"/datasets/{ds}/documents", json={"ids": [ids[0]]}).json["code"] == 0
    found = api.post("/retrieval", json={"question": "background parsing", "dataset_ids": [ds]}).json["data"]
    assert found["total"] == 0
    assert api.delete("/datasets", json={"delete_all": True}).json["data"]["success_count"] == 1


def test_unsupported_and_oversized_uploads_store_nothing(app_factory):
    app = app_factory(DATASETS={"max_file_bytes": 1000, "max_files_per_request": 2})
    from tests.api.conftest import make_token

    api = Api(app, make_token(app))
    ds = create_dataset(api)
    resp = upload(api, ds, ("ok.md", b"fine"), ("photo.exe", b"MZ"))
    assert resp.status_code == 400 and "photo.exe" in resp.json["message"] and "pdf" in resp.json["message"]
    resp = upload(api, ds, ("ok.md", b"fine"), ("big.txt", b"x" * 1001))
    assert resp.status_code == 413 and "big.txt" in resp.json["message"]
    resp = upload(api, ds, ("a.md", b"a"), ("b.md", b"b"), ("c.md", b"c"))
    assert resp.status_code == 413 and "max_files_per_request" in resp.json["message"]
    resp = api.post(f"/datasets/{ds}/documents", data={}, content_type="multipart/form-data")
    assert resp.status_code == 400 and "'file'" in resp.json["message"]
    assert api.get(f"/datasets/{ds}/documents").json["data"]["total"] == 0


def test_chunk_limit_per_dataset_fails_the_document_with_nothing_stored(app_factory):
    app = app_factory(DATASETS={"max_chunks_per_dataset": 3})
    from tests.api.conftest import make_token

    api = Api(app, make_token(app))
    ds = create_dataset(api, parser_config={"chunk_token_num": 8})
    text = ("word " * 6 + "\n") * 10
    doc = upload(api, ds, ("long.txt", text.encode())).json["data"][0]["id"]
    api.post(f"/datasets/{ds}/chunks", json={"document_ids": [doc]})
    docs = wait_parsed(api, ds, [doc])
    assert docs[doc]["run"] == "FAIL" and "max_chunks_per_dataset" in docs[doc]["progress_msg"]
    assert docs[doc]["chunk_count"] == 0


def test_unparseable_document_fails_with_the_reason(api):
    ds = create_dataset(api)
    doc = upload(api, ds, ("broken.pdf", b"%PDF-1.4 not really")).json["data"][0]["id"]
    api.post(f"/datasets/{ds}/chunks", json={"document_ids": [doc]})
    docs = wait_parsed(api, ds, [doc])
    assert docs[doc]["run"] == "FAIL" and "broken.pdf" in docs[doc]["progress_msg"]


def test_cancel_marks_cancel_and_a_second_cancel_is_refused(app_factory):
    app = app_factory(DATASETS={"parse_threads": 0})  # nobody picks the task up
    from tests.api.conftest import make_token

    api = Api(app, make_token(app))
    ds = create_dataset(api)
    doc = upload(api, ds, ("guide.md", MD)).json["data"][0]["id"]
    assert api.post(f"/datasets/{ds}/chunks", json={"document_ids": [doc]}).json["code"] == 0
    listed = api.get(f"/datasets/{ds}/documents", query_string={"run": "RUNNING"}).json["data"]
    assert [d["id"] for d in listed["docs"]] == [doc]
    assert api.delete(f"/datasets/{ds}/chunks", json={"document_ids": [doc]}).json["code"] == 0
    assert api.get(f"/datasets/{ds}/documents").json["data"]["docs"][0]["run"] == "CANCEL"
    resp = api.delete(f"/datasets/{ds}/chunks", json={"document_ids": [doc]})
    assert resp.status_code == 400 and "not being parsed" in resp.json["message"]
    assert api.post(f"/datasets/{ds}/chunks", json={}).status_code == 400


def test_other_tenants_datasets_are_not_found(api, other):
    ds, ids = parsed_dataset(api)
    for method, path, body in [
        ("GET", f"/datasets/{ds}/documents", None),
        ("PUT", f"/datasets/{ds}", {"name": "mine"}),
        ("GET", f"/datasets/{ds}/documents/{ids[0]}", None),
        ("GET", f"/datasets/{ds}/documents/{ids[0]}/chunks", None),
        ("POST", f"/datasets/{ds}/chunks", {"document_ids": ids}),
        ("POST", "/retrieval", {"question": "parsing", "dataset_ids": [ds]}),
        ("DELETE", "/datasets", {"ids": [ds]}),
    ]:
        resp = other.call(method, path, json=body)
        assert resp.status_code == 404 and resp.json["code"] == 102, (path, resp.json)
    assert other.get("/datasets").json["data"] == []
    assert api.get("/datasets").json["data"][0]["id"] == ds


def test_a_large_file_is_parsed_in_a_child_process_to_the_same_chunks(api):
    from agent.chunking import naive_chunks
    from api.services.parsing import INLINE_PARSE_BYTES

    text = "".join(f"paragraph {i} about the {i % 7}th topic\n" for i in range(INLINE_PARSE_BYTES // 30))
    assert len(text.encode()) > INLINE_PARSE_BYTES
    ds = create_dataset(api, parser_config={"chunk_token_num": 256})
    doc = upload(api, ds, ("large.txt", text.encode())).json["data"][0]["id"]
    api.post(f"/datasets/{ds}/chunks", json={"document_ids": [doc]})
    docs = wait_parsed(api, ds, [doc], seconds=120)
    assert docs[doc]["run"] == "DONE", docs[doc]["progress_msg"]
    assert docs[doc]["chunk_count"] == len(naive_chunks([text], 256, "\n"))


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_task_found_while_another_process_writes_is_claimed_once_it_is_done(app_factory, caplog):
    """The parse worker's claim waits for SQLite's write lock like every other write.

    It used to update while its look for tasks was still open, and such an UPDATE
    fails at once with "database is locked" when another connection holds the lock;
    the connection then went back to the pool with that old snapshot still open, so
    the threads it went to next read old rows (seen: a turn cancelled mid-run).
    """
    caplog.set_level(logging.WARNING, logger="agentcanvas.parsing")
    queued = app_factory(DATASETS={"parse_threads": 0})  # queues only
    api = Api(queued, make_token(queued))
    ds = create_dataset(api)
    docs = [d["id"] for d in upload(api, ds, ("guide.md", MD), ("cjk.txt", CJK)).json["data"]]
    assert api.post(f"/datasets/{ds}/chunks", json={"document_ids": docs}).json["code"] == 0
    from api.db import db

    # Another process (a second server, the CLI) writing when the worker looks for tasks.
    other = sqlite3.connect(db.obj.database, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    done_writing = threading.Timer(0.5, other.commit)
    done_writing.start()
    try:
        app_factory()  # its parse thread looks for tasks at once
        parsed = wait_parsed(api, ds, docs)
    finally:
        done_writing.join()
        other.close()
    assert all(parsed[d]["run"] == "DONE" for d in docs), parsed
    failed = [r.getMessage() for r in caplog.records if r.name == "agentcanvas.parsing"]
    assert failed == []
