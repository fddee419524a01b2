"""Files on the embed page in Chromium: the composer's Attach button (with the keyboard),
a file field answered through its picker, and type and size errors shown in words."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.api.conftest import dsl_of
from tests.browser.conftest import Site, shot
from tests.files import make_pdf
from tests.llm_server import LLMServer

MAX_FILE_BYTES = 4000
PDF_TEXT = "Invoice 2231 is due on Friday"


@pytest.fixture(scope="module")
def site_env() -> dict[str, str]:
    return {"AGENTCANVAS_MAX_FILE_BYTES": str(MAX_FILE_BYTES)}


def reader_dsl(prompt: str = "{sys.query}") -> dict:
    return dsl_of(
        {
            "LLM:Read": ("LLM", {"prompts": [{"role": "user", "content": prompt}]}, ["Message:Out"]),
            "Message:Out": ("Message", {"content": ["{LLM:Read@content}"]}, []),
        }
    )


def last_prompt(llm: LLMServer) -> str:
    return llm.chat_requests()[-1]["messages"][-1]["content"]


def attach_with_keyboard(page: Page, *paths: Path) -> None:
    button = page.get_by_role("button", name="Attach files")
    page.bring_to_front()  # several pages share the browser; this one takes the keys
    with page.expect_file_chooser() as chooser:
        button.press("Enter")
    chooser.value.set_files([str(p) for p in paths])


def test_attach_a_pdf_to_a_message_and_the_model_reads_it(site: Site, context: BrowserContext, llm, tmp_path):
    agent_id = site.agent(reader_dsl(), title="Invoice reader")
    pdf = tmp_path / "invoice.pdf"
    pdf.write_bytes(make_pdf([PDF_TEXT]))
    page = context.new_page()
    page.goto(site.page_url(agent_id))
    expect(page.locator(".message.assistant .bubble").first).to_have_text("Hi!")

    attach_with_keyboard(page, pdf)
    chip = page.locator("#attachments .upload")
    expect(chip).to_have_class("upload done")
    expect(chip).to_contain_text("invoice.pdf")
    shot(page, "files-1-attached")

    box = page.get_by_label("Your message")
    box.fill("When is it due?")
    box.press("Enter")
    expect(page.locator(".message.user .bubble").last).to_have_text("When is it due?\nAttached: invoice.pdf")
    expect(page.locator(".message.assistant .bubble").nth(1)).to_contain_text(PDF_TEXT)
    assert last_prompt(llm) == f"When is it due?\n\n[file: invoice.pdf]\n{PDF_TEXT}"
    expect(page.locator("#attachments")).to_be_hidden()  # sent: the list is cleared
    shot(page, "files-2-answered")

    page.reload()
    expect(page.locator(".message.user .bubble").last).to_have_text("When is it due?\nAttached: invoice.pdf")


def test_too_large_and_unsupported_files_are_refused_in_words(site: Site, context: BrowserContext, tmp_path):
    agent_id = site.agent(reader_dsl(), title="Picky reader")
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    tool = tmp_path / "tool.exe"
    tool.write_bytes(b"MZ")
    page = context.new_page()
    page.goto(site.page_url(agent_id))
    expect(page.locator(".message.assistant .bubble").first).to_have_text("Hi!")

    attach_with_keyboard(page, big, tool)
    failed = page.locator("#attachments .upload.failed")
    expect(failed).to_have_count(2)
    expect(failed.nth(0)).to_contain_text("big.txt is too large (4 KB): the limit is 4 KB.")
    expect(failed.nth(1)).to_contain_text(
        "tool.exe cannot be sent: .exe files are not supported. Supported: txt"
    )
    expect(page.locator("#status")).to_contain_text("tool.exe cannot be sent")
    shot(page, "files-3-refused")

    # Removed with the keyboard: the list empties and the message box has the focus.
    for _ in range(2):
        remove = page.locator("#attachments .remove").first
        remove.focus()
        page.keyboard.press("Enter")
    expect(page.locator("#attachments")).to_be_hidden()
    expect(page.get_by_label("Your message")).to_be_focused()


def test_a_file_field_is_answered_through_its_picker(site: Site, context: BrowserContext, llm, tmp_path):
    dsl = dsl_of(
        {
            "UserFillUp:Ask": (
                "UserFillUp",
                {
                    "enable_tips": True,
                    "tips": "Please upload the invoice.",
                    "inputs": {"invoice": {"name": "Invoice", "type": "file"}},
                },
                ["LLM:Read"],
            ),
            "LLM:Read": (
                "LLM",
                {"prompts": [{"role": "user", "content": "Due date? {UserFillUp:Ask@invoice}"}]},
                ["Message:Out"],
            ),
            "Message:Out": ("Message", {"content": ["{LLM:Read@content}"]}, []),
        }
    )
    agent_id = site.agent(dsl, title="Invoice form")
    pdf = tmp_path / "march.pdf"
    pdf.write_bytes(make_pdf([PDF_TEXT]))
    page = context.new_page()
    page.goto(site.page_url(agent_id))
    box = page.get_by_label("Your message")
    box.fill("start")
    box.press("Enter")
    form = page.locator("form.user-form")
    picker = form.get_by_label("Invoice")
    expect(picker).to_have_attribute("type", "file")
    expect(picker).to_have_attribute(
        "accept", ".txt,.text,.log,.md,.markdown,.htm,.html,.pdf,.docx,.csv,.json,.png,.jpg,.jpeg,.gif,.webp"
    )

    form.get_by_role("button", name="Send answers").click()
    expect(form.locator(".field-error:not([hidden])")).to_have_text("Please choose a file.")

    picker.set_input_files(str(pdf))
    expect(form.locator(".upload.done")).to_contain_text("march.pdf")
    shot(page, "files-4-field-uploaded")
    form.get_by_role("button", name="Send answers").click()
    expect(page.locator(".message.user .bubble").last).to_have_text("Invoice: march.pdf")
    expect(page.locator(".message.assistant .bubble").last).to_contain_text(PDF_TEXT)
    assert last_prompt(llm) == f"Due date? [file: march.pdf]\n{PDF_TEXT}"
    shot(page, "files-5-field-answered")
