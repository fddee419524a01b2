"""The embed page and long conversations: earlier messages page by page, "Regenerate"."""

from __future__ import annotations

import pytest
from playwright.sync_api import BrowserContext, expect

from tests.browser.conftest import Site, shot
from tests.browser.test_embed_page import assistant, llm_dsl, send
from tests.llm_server import text


@pytest.fixture(scope="module")
def site_env() -> dict[str, str]:
    # Transcript pages of 4 messages, so a short chat already has several.
    return {"AGENTCANVAS_LIMITS_PAGE_SIZE": "4"}


def test_reload_shows_the_last_page_and_earlier_ones_on_request(site: Site, context: BrowserContext):
    agent_id = site.agent("greeting")
    page = context.new_page()
    page.goto(site.page_url(agent_id))
    for word in ("one", "two", "three"):
        send(page, word)
        expect(page.locator(".message")).to_have_count(1 + 2 * ("one", "two", "three").index(word) + 2)
    page.reload()
    expect(page.locator(".message")).to_have_count(4)
    earlier = page.get_by_role("button", name="Show earlier messages")
    earlier.click()
    expect(page.locator(".message")).to_have_count(7)
    expect(page.get_by_role("button", name="Show earlier messages")).to_have_count(0)
    expect(page.locator(".message.user .bubble").first).to_have_text("one")
    shot(page, "history-1-earlier-pages")


def test_regenerate_the_last_answer(site: Site, context: BrowserContext, llm):
    agent_id = site.agent(llm_dsl())
    page = context.new_page()
    page.goto(site.page_url(agent_id))
    llm.queue(text("A first try."), text("A better answer."))
    send(page, "explain")
    expect(assistant(page, 1)).to_have_text("A first try.")
    regenerate = page.get_by_role("button", name="Regenerate")
    expect(regenerate).to_have_count(1)
    regenerate.click()
    expect(assistant(page, 1)).to_have_text("A better answer.")
    expect(page.locator(".message")).to_have_count(3)
    shot(page, "history-2-regenerated")

    # A reload shows the active answer only, still offered for regeneration.
    page.reload()
    expect(page.locator(".message")).to_have_count(3)
    expect(assistant(page, 1)).to_have_text("A better answer.")
    expect(page.get_by_role("button", name="Regenerate")).to_have_count(1)
