"""Background parsing across server processes: a SIGKILLed worker's task is finished by
another with no chunk stored twice; a cancel reaches the process doing the work."""

from __future__ import annotations

import pytest

from agent.chunking import naive_chunks
from tests.e2e.conftest import Client, until

LEASE = {"AGENTCANVAS_SERVER_LEASE_SECONDS": "2"}
# Small chunks make many batches, so the parse is caught half way.
PARSER = {"chunk_token_num": 16, "delimiter": "\n"}
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split()


def big_text(lines: int = 2500) -> str:
    return "".join(
        f"line {i} {WORDS[i % len(WORDS)]} {WORDS[(i * 7) % len(WORDS)]} end\n" for i in range(lines)
    )


def start_parse(client: Client, text: str, name: str = "big") -> tuple[str, str]:
    ds = client.post("/datasets", json={"name": name, "parser_config": PARSER}).json()["data"]["id"]
    files = {"file": ("big.txt", text.encode())}
    doc = client.post(f"/datasets/{ds}/documents", files=files).json()["data"][0]["id"]
    assert client.post(f"/datasets/{ds}/chunks", json={"document_ids": [doc]}).json()["code"] == 0
    return ds, doc


def document(client: Client, ds: str, doc: str) -> dict:
    docs = client.get(f"/datasets/{ds}/documents", params={"id": doc}).json()["data"]["docs"]
    return docs[0]


def all_chunks(client: Client, ds: str, doc: str) -> list[dict]:
    out, page = [], 1
    while True:
        data = client.get(
            f"/datasets/{ds}/documents/{doc}/chunks", params={"page": page, "page_size": 100}
        ).json()
        out += data["data"]["chunks"]
        if len(out) >= data["data"]["total"]:
            return out
        page += 1


def parse_killed_half_way(deployment, token: str, text: str, name: str) -> tuple[Client, str, str, dict]:
    """Start a parse on a server, SIGKILL it half way, and let a second server finish it:
    (a client of the second server, the dataset, the document, the document when done)."""
    doomed = deployment.server(**LEASE)
    client = Client(doomed.url, token)
    ds, doc = start_parse(client, text, name=name)
    half = until(
        lambda: (d := document(client, ds, doc))["run"] == "RUNNING" and 0.05 < d["progress"] < 0.8 and d,
        "the parse to be part done",
        step=0.01,
    )
    doomed.kill()
    assert half["chunk_count"] == 0  # counted at the end
    rescuer = Client(deployment.server(**LEASE).url, token)
    done = until(
        lambda: (d := document(rescuer, ds, doc))["run"] != "RUNNING" and d, "another worker to finish"
    )
    assert done["run"] == "DONE" and done["progress"] == 1.0, done["progress_msg"]
    return rescuer, ds, doc, done


def test_killed_parser_is_resumed_by_another_worker_without_duplicates(deployment):
    token = deployment.token()
    text = big_text()
    expected = naive_chunks([text], PARSER["chunk_token_num"], PARSER["delimiter"])
    for attempt in range(3):
        rescuer, ds, doc, done = parse_killed_half_way(deployment, token, text, f"big {attempt}")
        if "Resuming after" in done["progress_msg"]:
            break
        # The parse ended between the look and the kill (a busy machine ran the parse
        # thread on, not the test), so no kill landed mid-parse: again, with no server left.
        deployment.close()
    else:
        pytest.fail(f"the killed parse was never resumed: {done['progress_msg']}")
    chunks = all_chunks(rescuer, ds, doc)
    assert done["chunk_count"] == len(chunks) == len(expected)
    assert sorted(c["content"] for c in chunks) == sorted(expected)  # each chunk once, none lost
    found = rescuer.post("/retrieval", json={"question": "line 2499", "dataset_ids": [ds]}).json()["data"]
    assert found["chunks"][0]["content"].startswith("line 2499 ")


def test_cancel_reaches_the_process_that_parses(deployment):
    token = deployment.token()
    worker = Client(deployment.server(**LEASE).url, token)
    # Another process takes the cancel: parse threads off, so it never works on the task.
    front = Client(deployment.server(AGENTCANVAS_DATASETS_PARSE_THREADS="0", **LEASE).url, token)
    for attempt in range(3):
        ds, doc = start_parse(worker, big_text(), name=f"big {attempt}")
        # Part done (or, on a busy machine, already done: then the cancel is refused below).
        until(
            lambda ds=ds, doc=doc: document(front, ds, doc)["progress"] > 0.05,
            "the parse to start",
            step=0.01,
        )
        resp = front.call("DELETE", f"/datasets/{ds}/chunks", json={"document_ids": [doc]})
        if resp.json()["code"] == 0:
            break
        # The parse ended between the look and the cancel (a busy machine ran the parse
        # thread on, not the test): that is the one refusal allowed, then again.
        assert document(front, ds, doc)["run"] == "DONE", resp.text
        assert "is not being parsed; nothing to cancel" in resp.json()["message"]
    else:
        pytest.fail(f"every parse ended before its cancel: {resp.text}")
    cancelled = document(front, ds, doc)
    assert cancelled["run"] == "CANCEL" and cancelled["chunk_count"] == 0
    assert front.get(f"/datasets/{ds}/documents/{doc}/chunks").json()["data"]["total"] == 0
    # The worker stops (its next batch finds the task gone) and stores nothing more;
    # parsing again works at once, since the lease was given back.
    again = until(
        lambda: front.post(f"/datasets/{ds}/chunks", json={"document_ids": [doc]}).json()["code"] == 0,
        "the cancelled task's lease to be given back",
    )
    assert again
    done = until(lambda: (d := document(front, ds, doc))["run"] != "RUNNING" and d, "the parse to finish")
    assert done["run"] == "DONE"
    assert len(all_chunks(front, ds, doc)) == done["chunk_count"]
