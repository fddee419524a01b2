"""Files in a turn, in the runtime alone: ``sys.files``, ``file`` form fields, what an
LLM node sends (documents as text within the budget, images as image parts) and what
its memory keeps (names only). The file service is the in-process one."""

from __future__ import annotations

import pytest

from agent.canvas import Canvas, Limits
from agent.errors import InputError
from agent.files import InMemoryFiles
from tests.agent.dsl_helpers import final, make_dsl, node, run
from tests.files import make_pdf, make_png
from tests.llm_server import LLMServer


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


def user_content(llm: LLMServer):
    return [m for m in llm.chat_requests()[-1]["messages"] if m["role"] == "user"][-1]["content"]


def chat_canvas(llm, files, *, prompt="{sys.query}", begin=None, limits=None, **settings):
    dsl = make_dsl(
        node("LLM:A", "LLM", {"prompts": [{"role": "user", "content": prompt}]}),
        node("Message:Out", "Message", {"content": ["{LLM:A@content}"]}),
        begin=begin,
    )
    services = {"llm_settings": llm.settings(**settings), "files": files}
    return Canvas(dsl, limits=limits, services=services)


def test_attached_pdf_reaches_the_model_as_text_and_memory_keeps_only_its_name(llm):
    files = InMemoryFiles()
    pdf = files.add("report.pdf", make_pdf(["Quarterly revenue was 42 tons of tea"]))
    canvas = chat_canvas(llm, files)
    events = run(canvas, "summarise", files=[pdf["id"]])
    assert final(events)["status"] == "succeeded"
    sent = user_content(llm)
    assert sent.startswith("summarise\n\n[file: report.pdf]\nQuarterly revenue was 42 tons of tea")
    assert canvas.globals["sys.files"] == [pdf]
    run(canvas, "and again?")
    second = llm.chat_requests()[-1]["messages"]
    remembered = [m["content"] for m in second if m["role"] == "user"][0]
    assert remembered == "summarise\n\n[attached: report.pdf]"


def test_an_image_goes_as_an_image_part_only_to_a_vision_model(llm):
    files = InMemoryFiles()
    png = files.add("dot.png", make_png())
    events = run(chat_canvas(llm, files, vision=True), "what colour?", files=[png])
    assert final(events)["status"] == "succeeded"
    parts = user_content(llm)
    assert parts[0] == {"type": "text", "text": "what colour?"}
    assert parts[1]["type"] == "image_url"
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")

    events = run(chat_canvas(llm, files), "what colour?", files=[png])
    data = final(events)
    assert data["status"] == "failed"
    assert "does not take images" in data["error"] and "AGENTCANVAS_LLM_VISION" in data["error"]


def test_documents_over_the_budget_are_cut_with_a_note(llm):
    files = InMemoryFiles()
    long_text = " ".join(f"word{i}" for i in range(3000))
    doc = files.add("long.txt", long_text.encode())
    llm_settings = {"model": "m", "context_size": 1200}
    events = run(chat_canvas(llm, files, **llm_settings), "read it", files=[doc])
    assert final(events)["status"] == "succeeded"
    sent = user_content(llm)
    assert "word0 word1" in sent and "word2999" not in sent
    assert "'long.txt' was cut to its first" in sent


def test_a_file_field_renders_the_files_text_where_the_prompt_references_it(llm):
    files = InMemoryFiles()
    pdf = files.add("cv.pdf", make_pdf(["Ada Lovelace, analyst"]))
    begin = {"inputs": {"cv": {"name": "Your CV", "type": "file"}}}
    canvas = chat_canvas(llm, files, prompt="Review this:\n{begin@cv}", begin=begin)
    events = run(canvas, "", inputs={"cv": {"value": [pdf]}})
    assert final(events)["status"] == "succeeded"
    sent = user_content(llm)
    # Rendered where it is referenced, and not sent a second time.
    assert sent == "Review this:\n[file: cv.pdf]\nAda Lovelace, analyst"
    assert canvas.components["begin"].outputs["cv"] == [pdf]


def test_bad_files_are_per_field_errors_before_anything_changes(llm):
    files = InMemoryFiles()
    small = files.add("a.txt", b"hello")
    begin = {"inputs": {"doc": {"name": "Doc", "type": "file"}, "n": {"name": "N", "type": "integer"}}}
    canvas = chat_canvas(llm, files, begin=begin, limits=Limits(max_files_per_turn=2))
    before = str(canvas)
    with pytest.raises(InputError) as err:
        run(canvas, "x", inputs={"doc": "nope", "n": 1}, files=[small, small, small])
    assert err.value.errors == {
        "doc": "file 'nope' not found",
        "files": "3 files in one turn; the limit is 2 (max_files_per_turn)",
    }
    with pytest.raises(InputError) as err:
        run(canvas, "x", inputs={"doc": 42})
    assert "expected an uploaded file's id" in err.value.errors["doc"]
    assert str(canvas) == before
    assert not llm.chat_requests()


def test_uploads_are_checked_for_type_size_and_content():
    files = InMemoryFiles(max_file_bytes=100)
    with pytest.raises(ValueError, match="the limit is 100"):
        files.add("big.txt", b"x" * 101)
    with pytest.raises(ValueError, match=r"unsupported file type.*images: png"):
        files.add("run.exe", b"MZ")
    with pytest.raises(ValueError, match="not a PNG image"):
        files.add("fake.png", b"GIF89a....")
    with pytest.raises(ValueError, match="needs a password"):
        InMemoryFiles().add("locked.pdf", make_pdf(["x"], password="pw"))


def test_a_referenced_document_is_cut_to_the_budget_too_and_memory_keeps_its_name(llm):
    files = InMemoryFiles()
    doc = files.add("long.md", " ".join(f"w{i}" for i in range(20000)).encode())
    begin = {"inputs": {"doc": {"name": "Doc", "type": "file"}}}
    canvas = chat_canvas(llm, files, prompt="Summarise {begin@doc} briefly", begin=begin)
    events = run(canvas, "", inputs={"doc": doc["id"]})
    assert final(events)["status"] == "succeeded"
    sent = user_content(llm)
    assert sent.startswith("Summarise [file: long.md]\nw0 w1 w2") and sent.endswith(
        "fit the model's context] briefly"
    )
    assert "w19999" not in sent
    # The file answered in this turn's form is one of the turn's files: memory names it twice.
    assert canvas.memory["LLM:A"][0]["content"] == "Summarise [file: long.md] briefly\n\n[attached: long.md]"


def test_an_agent_node_gets_the_turns_files_too(llm):
    files = InMemoryFiles()
    doc = files.add("menu.html", b"<html><body><h1>Menu</h1><p>Soup of the day: lentil</p></body></html>")
    dsl = make_dsl(
        node("Agent:Waiter", "Agent", {"sys_prompt": "Answer from the menu.", "tools": []}),
        node("Message:Out", "Message", {"content": ["{Agent:Waiter@content}"]}),
    )
    canvas = Canvas(dsl, services={"llm_settings": llm.settings(), "files": files})
    events = run(canvas, "today's soup?", files=[doc])
    assert final(events)["status"] == "succeeded"
    assert user_content(llm) == "today's soup?\n\n[file: menu.html]\nMenu\n\nSoup of the day: lentil"


def test_the_session_total_of_files_is_bounded(llm):
    files = InMemoryFiles()
    a = files.add("a.txt", b"x" * 600)
    b = files.add("b.txt", b"y" * 600)
    canvas = chat_canvas(llm, files, limits=Limits(max_session_file_bytes=1000))
    assert final(run(canvas, "first", files=[a]))["status"] == "succeeded"
    before = str(canvas)
    with pytest.raises(InputError) as err:
        run(canvas, "second", files=[b])
    assert "the limit is 1000 (max_session_file_bytes): start a new session" in err.value.errors["files"]
    assert str(canvas) == before
