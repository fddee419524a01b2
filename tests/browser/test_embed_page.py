"""The embed page in Chromium: chat, forms, reload, isolation, iframes, stop and errors."""

from __future__ import annotations

import re
import uuid

from playwright.sync_api import BrowserContext, Page, expect

from tests.api.conftest import dsl_of
from tests.browser.conftest import ParentSite, Site, shot
from tests.llm_server import Reply, error

GREETING = "Hi! I'm the greeting agent. Say something."
SCRIPT = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2"><b>bold?</b>'


def session_key(agent_id: str) -> str:
    return f"agentcanvas.session.{agent_id}"


def stored_session(page: Page, agent_id: str) -> str | None:
    return page.evaluate("key => localStorage.getItem(key)", session_key(agent_id))


def send(page: Page, text: str) -> None:
    """Type ``text`` and press Enter once the previous answer has finished, as a user would.

    While a turn streams the page keeps a typed message in the box instead of sending it,
    and an answer's bubble shows before its stream has ended.
    """
    expect(page.locator("#messages")).to_have_attribute("aria-busy", "false")
    box = page.get_by_label("Your message")
    box.fill(text)
    box.press("Enter")


def assistant(page: Page, n: int):
    """The text of the agent's ``n``-th message."""
    return page.locator(".message.assistant .bubble").nth(n)


def unlabeled_controls(page: Page) -> list[str]:
    return page.evaluate(
        """() => Array.from(document.querySelectorAll('input, select, textarea'))
              .filter(e => e.labels.length === 0 && !e.getAttribute('aria-label'))
              .map(e => e.outerHTML)"""
    )


def llm_dsl() -> dict:
    return dsl_of(
        {
            "LLM:A": ("LLM", {"sys_prompt": "You are terse."}, ["Message:Out"]),
            "Message:Out": ("Message", {"content": ["{LLM:A@content}"]}, []),
        }
    )


def test_chat_with_the_greeting_sample_and_reload(site: Site, context: BrowserContext):
    agent_id = site.agent("greeting")
    page = context.new_page()
    page.goto(site.page_url(agent_id))
    expect(assistant(page, 0)).to_have_text(GREETING)
    expect(page.get_by_role("heading", level=1)).to_have_text(re.compile("agent"))
    shot(page, "greeting-1-prologue")

    send(page, "hello there")
    expect(assistant(page, 1)).to_have_text(re.compile(r"^(Hello!|Hi there!) You said: hello there$"))
    expect(page.get_by_label("Your message")).to_have_value("")

    # Script and markup in a message are shown as text and never run.
    send(page, SCRIPT)
    expect(assistant(page, 2)).to_contain_text(f"You said: {SCRIPT}")
    expect(page.locator(".message.user .bubble").nth(1)).to_have_text(SCRIPT)
    assert page.evaluate("window.pwned") is None
    assert page.locator(".messages b, .messages img, .messages script").count() == 0
    shot(page, "greeting-2-answers")

    session_id = stored_session(page, agent_id)
    assert session_id
    page.reload()
    expect(page.locator(".message")).to_have_count(5)
    expect(assistant(page, 2)).to_contain_text(f"You said: {SCRIPT}")
    assert page.evaluate("window.pwned") is None
    assert stored_session(page, agent_id) == session_id
    shot(page, "greeting-3-reloaded")

    # "New chat" forgets the conversation here; the next message starts another session.
    page.get_by_role("button", name="New chat").click()
    expect(page.locator(".message")).to_have_count(1)
    send(page, "fresh start")
    expect(assistant(page, 1)).to_contain_text("You said: fresh start")
    assert stored_session(page, agent_id) not in (None, session_id)
    assert site.api.session(agent_id, session_id)["round"] == 2


def test_intake_form_wrong_type_then_corrected_by_keyboard(site: Site, context: BrowserContext):
    agent_id = site.agent("intake_form")
    page = context.new_page()
    page.goto(site.page_url(agent_id))
    expect(assistant(page, 0)).to_contain_text("Welcome!")
    send(page, "sign me up")
    expect(assistant(page, 1)).to_contain_text("Please tell us about yourself to sign up.")
    form = page.locator("form.user-form")
    expect(form.get_by_label("Your name")).to_be_focused()
    for label in ("Your name", "Your age", "Plan", "Anything else? (optional)"):
        expect(form.get_by_label(label)).to_be_visible()
    assert unlabeled_controls(page) == []
    shot(page, "intake-1-form")

    session_id = stored_session(page, agent_id)
    before = site.api.session(agent_id, session_id)
    assert before["status"] == "paused"

    # Keyboard only: type, Tab between fields, pick the plan by typing, Enter to send.
    page.keyboard.type("<b>Ann</b>")
    page.keyboard.press("Tab")
    page.keyboard.type("forty")
    page.keyboard.press("Tab")
    page.keyboard.type("pro")
    page.keyboard.press("Tab")
    page.keyboard.type("<script>window.pwned = 3</script>")
    page.keyboard.press("Tab")
    expect(form.get_by_role("button", name="Send answers")).to_be_focused()
    page.keyboard.press("Enter")
    age_error = form.locator(".field-error").nth(1)
    expect(age_error).to_have_text("Enter a whole number, like 42.")
    expect(form.get_by_label("Your age")).to_have_attribute("aria-invalid", "true")
    expect(form.get_by_label("Your age")).to_be_focused()
    shot(page, "intake-2-browser-error")
    after = site.api.session(agent_id, session_id)
    assert (after["version"], after["round"], after["status"]) == (
        before["version"],
        before["round"],
        "paused",
    )

    # An answer the browser cannot check (an option that is not in the form) is refused
    # by the server, and its per-field error is shown the same way.
    page.keyboard.press("Control+A")
    page.keyboard.type("41")
    page.evaluate(
        """() => {
            const select = document.querySelector('form.user-form select');
            const option = document.createElement('option');
            option.value = 'gold'; option.textContent = 'gold';
            select.appendChild(option); select.value = 'gold';
        }"""
    )
    form.get_by_role("button", name="Send answers").click()
    plan_error = form.locator(".field-error").nth(2)
    expect(plan_error).to_contain_text("'gold' is not one of the options")
    expect(form.locator(".form-error")).to_contain_text("not accepted")
    shot(page, "intake-3-server-error")
    after = site.api.session(agent_id, session_id)
    assert (after["version"], after["round"], after["status"]) == (
        before["version"],
        before["round"],
        "paused",
    )

    form.get_by_label("Plan").select_option("pro")
    form.get_by_role("button", name="Send answers").click()
    expect(assistant(page, 2)).to_have_text(
        "Thanks <b>Ann</b>! You are signed up for the pro plan. Notes: <script>window.pwned = 3</script>"
    )
    expect(page.locator(".message.user").last).to_contain_text("Your age: 41")
    expect(form).to_have_class(re.compile("answered"))
    assert page.evaluate("window.pwned") is None
    shot(page, "intake-4-finished")
    assert site.api.session(agent_id, session_id)["status"] == "idle"

    page.reload()
    expect(assistant(page, 2)).to_contain_text("Thanks <b>Ann</b>!")
    expect(page.locator(".message.user").last).to_contain_text("Your name: <b>Ann</b>")
    expect(page.locator("form.user-form")).to_have_count(0)
    shot(page, "intake-5-reloaded")


def test_reload_while_a_form_waits_shows_it_again(site: Site, context: BrowserContext):
    agent_id = site.agent("intake_form")
    page = context.new_page()
    page.goto(site.page_url(agent_id))
    send(page, "start")
    expect(page.locator("form.user-form")).to_have_count(1)
    page.reload()
    form = page.locator("form.user-form")
    expect(form.get_by_label("Your name")).to_be_visible()
    form.get_by_label("Your name").fill("Cy")
    form.get_by_label("Your age").fill("12")
    form.get_by_label("Plan").select_option("basic")
    form.get_by_role("button", name="Send answers").click()
    expect(assistant(page, 2)).to_contain_text("Sorry Cy, you must be 18 or older")
    shot(page, "intake-6-resumed-after-reload")


def test_another_browser_cannot_see_the_conversation(site: Site, browser):
    agent_id = site.agent("greeting")
    first = browser.new_context()
    second = browser.new_context()
    try:
        mine = first.new_page()
        mine.goto(site.page_url(agent_id))
        send(mine, "my secret plans")
        expect(assistant(mine, 1)).to_contain_text("my secret plans")
        session_id = stored_session(mine, agent_id)

        theirs = second.new_page()
        theirs.goto(site.page_url(agent_id))
        expect(assistant(theirs, 0)).to_have_text(GREETING)
        expect(theirs.locator(".message")).to_have_count(1)
        # Even knowing the session id, another end user gets nothing.
        theirs.evaluate("([key, id]) => localStorage.setItem(key, id)", [session_key(agent_id), session_id])
        theirs.reload()
        expect(theirs.get_by_role("status")).to_contain_text("no longer available")
        expect(theirs.locator(".message")).to_have_count(1)
        assert "my secret plans" not in theirs.content()
        shot(theirs, "isolation-second-browser")
        assert stored_session(theirs, agent_id) is None
        mine.reload()
        expect(mine.locator(".message")).to_have_count(3)
    finally:
        first.close()
        second.close()


def test_task_mode_shows_begins_form_first_with_every_field_type(
    site: Site, context: BrowserContext, tmp_path
):
    fields = {
        "title": {"name": "Title", "type": "line", "optional": False},
        "body": {"name": "Body", "type": "paragraph", "optional": True},
        "size": {"name": "Size", "type": "options", "options": ["S", "M", "L"], "optional": False},
        "count": {"name": "Count", "type": "integer", "optional": False},
        "ratio": {"name": "Ratio", "type": "float", "optional": False, "description": "Between 0 and 1."},
        "urgent": {"name": "Urgent", "type": "boolean", "optional": True},
        "meta": {"name": "Meta", "type": "object", "optional": False},
        "doc": {"name": "Attachment", "type": "file", "optional": False},
    }
    shown = "{begin@title}|{begin@size}|{begin@count}|{begin@ratio}|{begin@urgent}|{begin@meta.k}|{begin@doc.0.name}"
    dsl = dsl_of({"Message:Out": ("Message", {"content": [shown]}, [])}, prologue="Fill in the task.")
    dsl["components"]["begin"]["obj"]["params"].update(mode="task", inputs=fields)
    agent_id = site.agent(dsl, title="Task runner")
    page = context.new_page()
    page.goto(site.page_url(agent_id))
    form = page.locator("form.user-form")
    expect(form.locator("legend")).to_have_text("Start")
    assert unlabeled_controls(page) == []
    expect(form.get_by_label("Title")).to_have_attribute("type", "text")
    expect(form.get_by_label("Body (optional)")).to_have_js_property("tagName", "TEXTAREA")
    expect(form.get_by_label("Size")).to_have_js_property("tagName", "SELECT")
    expect(form.get_by_label("Count")).to_have_attribute("inputmode", "numeric")
    expect(form.get_by_label("Ratio")).to_have_attribute("inputmode", "decimal")
    expect(form.get_by_text("Between 0 and 1.")).to_be_visible()
    expect(form.get_by_label("Urgent (optional)")).to_have_attribute("type", "checkbox")
    expect(form.get_by_label("Meta")).to_have_class("code")
    expect(form.get_by_label("Attachment")).to_have_attribute("type", "file")

    form.get_by_label("Count").fill("2.5")
    form.get_by_label("Ratio").fill("abc")
    form.get_by_label("Meta").fill("{not json")
    form.get_by_role("button", name="Send answers").click()
    errors = form.locator(".field-error:not([hidden])")
    expect(errors).to_have_count(6)  # title, size, count, ratio, meta, attachment
    expect(form.get_by_label("Title")).to_be_focused()
    shot(page, "task-1-browser-errors")
    assert site.api.get(f"/agents/{agent_id}/sessions").json()["data"] == []

    attachment = tmp_path / "notes.txt"
    attachment.write_text("some notes")
    form.get_by_label("Title").fill("Ship it")
    form.get_by_label("Size").select_option("M")
    form.get_by_label("Count").fill("3")
    form.get_by_label("Ratio").fill("0.5")
    form.get_by_label("Urgent (optional)").check()
    form.get_by_label("Meta").fill('{"k": "v"}')
    form.get_by_label("Attachment").set_input_files(str(attachment))
    expect(form.locator(".upload.done")).to_contain_text("notes.txt")  # uploaded as soon as chosen
    form.get_by_role("button", name="Send answers").click()
    expect(assistant(page, 1)).to_have_text("Ship it|M|3|0.5|true|v|notes.txt")
    expect(page.locator(".message.user")).to_contain_text("Attachment: notes.txt")
    shot(page, "task-2-done")


def test_iframe_on_an_allowed_origin_works_and_elsewhere_is_refused(
    site: Site, context: BrowserContext, parent_sites: tuple[ParentSite, ParentSite]
):
    allowed, other = parent_sites
    title = f"Shop helper {uuid.uuid4().hex[:6]}"
    agent_id = site.agent("greeting", title=title)
    resp = site.api.call("PUT", f"/agents/{agent_id}/embed", json={"allowed_origins": [allowed.origin]})
    assert resp.status_code == 200, resp.text
    snippet = site.api.get(f"/agents/{agent_id}/embed", params={"embed_token": site.embed_token}).json()[
        "data"
    ]
    assert snippet["url"] == site.page_url(agent_id)

    page = context.new_page()
    page.goto(allowed.framing(snippet["url"]))
    chat = page.frame_locator("iframe#chat")
    expect(chat.locator(".message.assistant .bubble").first).to_have_text(GREETING)
    box = chat.get_by_label("Your message")
    box.fill("from the shop")
    box.press("Enter")
    expect(chat.locator(".message.assistant .bubble").nth(1)).to_contain_text("You said: from the shop")
    shot(page, "iframe-1-allowed-origin")

    # The allowed site may also call the embed API itself (CORS); the other may not.
    probe = """([url, token]) => fetch(url, {headers: {Authorization: 'Bearer ' + token}})
                   .then(r => r.json()).then(b => b.data.title, e => 'refused: ' + e.name)"""
    inputs_url = f"{site.url}/api/v1/agentbots/{agent_id}/inputs"
    assert page.evaluate(probe, [inputs_url, site.embed_token]) == title

    refused = context.new_page()
    # Chromium refuses to show the page in the frame (frame-ancestors) and says so.
    with refused.expect_console_message(lambda m: "frame-ancestors" in m.text):
        refused.goto(other.framing(snippet["url"]))
    expect(refused.get_by_role("heading", name="Some other site")).to_be_visible()
    expect(refused.frame_locator("iframe#chat").locator("#app")).to_have_count(0)
    assert refused.evaluate(probe, [inputs_url, site.embed_token]).startswith("refused")
    shot(refused, "iframe-2-other-origin-refused")


def test_answers_stream_in_and_stop_cancels(site: Site, context: BrowserContext, llm):
    agent_id = site.agent(llm_dsl())
    page = context.new_page()
    page.goto(site.page_url(agent_id))
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    llm.queue(
        Reply(
            content="first part and the rest", chunks=["first part ", "and the rest"], stall_after=1, stall=3
        )
    )
    send(page, "tell me")
    reply = assistant(page, 1)  # after the prologue
    # The first chunk is on screen while the answer is still coming.
    expect(reply).to_have_text("first part ")
    stop = page.get_by_role("button", name="Stop")
    expect(stop).to_be_visible()
    expect(page.get_by_role("button", name="Send")).to_be_disabled()
    shot(page, "stop-1-streaming")
    stop.click()
    expect(page.locator(".note")).to_have_text("Stopped. This answer is not kept in the conversation.")
    expect(stop).to_be_hidden()
    shot(page, "stop-2-stopped")
    session_id = stored_session(page, agent_id)
    session = site.api.session(agent_id, session_id)
    assert session["round"] == 0 and session["status"] == "idle"  # a cancelled turn adds nothing

    send(page, "again")
    expect(page.locator(".message.assistant .bubble").last).to_have_text("echo: again")


def test_errors_are_shown_in_words(site: Site, context: BrowserContext, llm):
    agent_id = site.agent(llm_dsl())
    page = context.new_page()
    page.goto(site.page_url(agent_id))

    # A failing LLM provider: the turn fails and says so, without the provider's details.
    llm.queue(error(500, "the model crashed"))
    send(page, "hello")
    expect(page.locator(".note.error")).to_have_text(
        "The assistant's language service is not available right now. Please try again later."
    )
    assert llm.url not in page.content()
    shot(page, "errors-1-server-error")

    # The same session open twice: the second page's message meets a busy session.
    llm.queue(Reply(content="slow answer", chunks=["slow ", "answer"], stall_after=1, stall=3))
    send(page, "take your time")
    expect(page.locator(".message.assistant .bubble").last).to_have_text("slow ")
    twin = context.new_page()
    twin.goto(site.page_url(agent_id))
    expect(twin.get_by_role("status")).to_contain_text("still being written")
    send(twin, "me too")
    expect(twin.get_by_role("status")).to_contain_text("still answering your previous message")
    expect(twin.get_by_label("Your message")).to_have_value("me too")  # kept to send again
    shot(twin, "errors-2-busy")
    expect(page.locator(".message.assistant .bubble").last).to_have_text("slow answer")
    twin.close()

    # No network: said so, and the message stays in the box.
    context.set_offline(True)
    send(page, "are you there?")
    expect(page.get_by_role("status")).to_contain_text("Could not reach the chat server")
    expect(page.get_by_label("Your message")).to_have_value("are you there?")
    shot(page, "errors-3-offline")
    context.set_offline(False)
    page.get_by_role("button", name="Send").click()
    expect(page.locator(".message.assistant .bubble").last).to_have_text("echo: are you there?")


def test_revoked_or_wrong_tokens_show_words_not_a_blank_page(site: Site, context: BrowserContext):
    agent_id = site.agent("greeting")
    token = site.new_embed_token()
    page = context.new_page()
    page.goto(site.page_url(agent_id, token))
    expect(assistant(page, 0)).to_have_text(GREETING)
    assert site.api.call("DELETE", f"/system/tokens/{token}").status_code == 200
    send(page, "still there?")
    expect(page.get_by_role("status")).to_contain_text("not available any more")
    shot(page, "tokens-1-revoked-while-open")

    page.goto(site.page_url(agent_id, token))
    expect(page.get_by_role("alert")).to_contain_text("not valid")
    shot(page, "tokens-2-revoked-link")
    page.goto(site.page_url(agent_id, site.api_token))
    expect(page.get_by_role("alert")).to_contain_text("embed tokens only")
    page.goto(f"{site.url}/embed/agents/{agent_id}")
    expect(page.get_by_role("alert")).to_contain_text("no embed token")
    shot(page, "tokens-3-missing")
