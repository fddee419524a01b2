"""The embed page lists the sources an answer cites, under the answer."""

from __future__ import annotations

import re

from playwright.sync_api import BrowserContext, expect

from tests.api.conftest import dsl_of
from tests.browser.conftest import Site, shot
from tests.browser.test_embed_page import assistant, send
from tests.e2e.conftest import until

POLICY = b"# Returns\n\nItems can be returned within 30 days with the receipt.\n\n# Shipping\n\nParcels leave the warehouse <b>daily</b>.\n"


def parsed_dataset(site: Site) -> str:
    api = site.api
    ds = api.post("/datasets", json={"name": "policies", "parser_config": {"chunk_token_num": 16}}).json()[
        "data"
    ]["id"]
    doc = api.post(f"/datasets/{ds}/documents", files={"file": ("policy.md", POLICY)}).json()["data"][0]["id"]
    api.post(f"/datasets/{ds}/chunks", json={"document_ids": [doc]})

    def done():
        docs = api.get(f"/datasets/{ds}/documents").json()["data"]["docs"]
        return docs[0]["run"] == "DONE"

    until(done, "the document to be parsed")
    return ds


def test_cited_sources_appear_under_the_answer(site: Site, context: BrowserContext):
    ds = parsed_dataset(site)
    agent_id = site.agent(
        dsl_of(
            {
                "Retrieval:Find": ("Retrieval", {"kb_ids": [ds]}, ["LLM:Answer"]),
                "LLM:Answer": ("LLM", {"sys_prompt": "{Retrieval:Find@formalized_content}"}, ["Message:Out"]),
                "Message:Out": ("Message", {"content": ["{LLM:Answer@content}"]}, []),
            }
        )
    )
    page = context.new_page()
    page.goto(site.page_url(agent_id))
    send(page, "Can items be returned within 30 days?")
    expect(assistant(page, 1)).to_have_text(
        re.compile(r"^Items can be returned within 30 days with the receipt\. \[ID:\d\]$")
    )
    sources = page.locator(".message.assistant .sources").last
    expect(sources.locator("summary")).to_have_text("1 source")
    sources.locator("summary").click()
    expect(sources.locator("li")).to_have_text(re.compile(r"^policy\.md: .*returned within 30 days"))
    shot(page, "sources-1-cited")
    page.reload()  # the transcript keeps the sources
    expect(page.locator(".message.assistant .sources summary")).to_have_text("1 source")

    # Markup in a source is shown as text.
    send(page, "When do parcels leave the warehouse?")
    expect(assistant(page, 2)).to_contain_text("Parcels leave the warehouse")
    page.locator(".message.assistant .sources summary").last.click()
    expect(page.locator(".message.assistant .sources li").last).to_contain_text("<b>daily</b>")
    assert page.locator(".messages b").count() == 0
