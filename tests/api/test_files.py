"""Files in conversations over the API (SQLite, MariaDB, Postgres): upload, download,
isolation between tenants and embed visitors, limits, every bad input, and files
reaching the model through ``files`` and ``file`` form fields."""

from __future__ import annotations

import io
import secrets

import pytest

from api.db import FilePiece, SchemaVersion, Session, SessionFile, UploadFile, db, init_database, now_ms
from api.services.retention import RetentionSettings, sweep
from tests.api.conftest import Api, dsl_of, make_token
from tests.files import make_pdf, make_png
from tests.llm_server import LLMServer

PDF_TEXT = "The launch code is tangerine"


@pytest.fixture
def llm():
    with LLMServer() as server:
        yield server


@pytest.fixture
def app(app_factory, llm):
    # Pieces of 1,000 bytes: every stored file here spans several of them.
    return app_factory(
        SETTINGS={"llm": llm.settings(max_retries=0, vision=True)},
        FILES={"piece_bytes": 1000, "max_files_per_request": 3},
        LIMITS={"max_file_bytes": 20_000},
    )


def upload(api: Api, agent_id: str, *files: tuple[str, bytes], path: str | None = None, **form):
    data = {"file": [(io.BytesIO(content), name) for name, content in files], **form}
    return api.post(path or f"/agents/{agent_id}/upload", data=data, content_type="multipart/form-data")


def llm_dsl(prompt: str = "{sys.query}", inputs: dict | None = None) -> dict:
    dsl = dsl_of(
        {
            "LLM:Read": ("LLM", {"prompts": [{"role": "user", "content": prompt}]}, ["Message:Out"]),
            "Message:Out": ("Message", {"content": ["{LLM:Read@content}"]}, []),
        }
    )
    dsl["components"]["begin"]["obj"]["params"]["inputs"] = inputs or {}
    return dsl


def form_dsl() -> dict:
    """Begin → UserFillUp asking for a file and a number → LLM reading the file → Message."""
    dsl = dsl_of(
        {
            "UserFillUp:Ask": (
                "UserFillUp",
                {
                    "enable_tips": True,
                    "tips": "Send the contract",
                    "inputs": {
                        "contract": {"name": "Contract", "type": "file"},
                        "copies": {"name": "Copies", "type": "integer"},
                    },
                },
                ["LLM:Read"],
            ),
            "LLM:Read": (
                "LLM",
                {"prompts": [{"role": "user", "content": "Read:\n{UserFillUp:Ask@contract}"}]},
                ["Message:Out"],
            ),
            "Message:Out": ("Message", {"content": ["{LLM:Read@content}"]}, []),
        }
    )
    return dsl


def session_row(session_id: str) -> dict:
    with db.connection_context():
        return Session.select().where(Session.id == session_id).dicts().get()


def test_upload_answers_descriptors_and_the_owner_downloads_the_same_bytes(api: Api, other: Api):
    agent = api.create_agent(llm_dsl())
    pdf = make_pdf([PDF_TEXT] + [f"page {n}" for n in range(2, 8)])
    resp = upload(api, agent, ("report.pdf", pdf))
    assert resp.status_code == 200, resp.json
    d = resp.json["data"]
    assert set(d) >= {"id", "name", "size", "extension", "mime_type", "created_by", "created_at"}
    assert (d["name"], d["size"], d["extension"], d["mime_type"]) == (
        "report.pdf",
        len(pdf),
        "pdf",
        "application/pdf",
    )
    with db.connection_context():
        assert FilePiece.select().where(FilePiece.file_id == d["id"], FilePiece.part == "data").count() > 1

    got = api.get(f"/agents/attachments/{d['id']}/download")
    assert got.status_code == 200 and got.data == pdf
    assert got.headers["Content-Type"] == "application/pdf"
    assert "report.pdf" in got.headers["Content-Disposition"]

    for resp in (
        other.get(f"/agents/attachments/{d['id']}/download"),
        other.get("/agents/attachments/nope/download"),
    ):
        assert resp.status_code == 404 and resp.json["code"] == 102
    assert upload(other, agent, ("a.txt", b"hi")).status_code == 404  # another tenant's agent


def test_deleting_the_agent_deletes_its_files(api: Api):
    agent = api.create_agent(llm_dsl())
    d = upload(api, agent, ("a.txt", b"bye")).json["data"]
    assert api.delete(f"/agents/{agent}").status_code == 200
    assert api.get(f"/agents/attachments/{d['id']}/download").status_code == 404
    with db.connection_context():
        assert FilePiece.select().count() == 0


def test_several_files_in_one_request_answer_a_list(api: Api):
    agent = api.create_agent(llm_dsl())
    resp = upload(api, agent, ("a.md", b"# Title\nbody"), ("dot.png", make_png()))
    assert resp.status_code == 200, resp.json
    assert [(d["name"], d["mime_type"]) for d in resp.json["data"]] == [
        ("a.md", "text/markdown"),
        ("dot.png", "image/png"),
    ]


BAD_UPLOADS = [
    ([], 400, "no file"),
    ([("setup.exe", b"MZ...")], 400, "supported documents: txt, md, html, pdf, docx, csv, json; images: png"),
    ([("locked.pdf", make_pdf(["x"], password="pw"))], 400, "needs a password"),
    ([("scan.pdf", make_pdf([""]))], 400, "no text layer"),
    ([("empty.txt", b"")], 400, "is empty"),
    ([("fake.png", b"not an image")], 400, "not a PNG image"),
    ([("big.txt", b"x" * 20_001)], 413, "AGENTCANVAS_MAX_FILE_BYTES"),
    ([("a.txt", b"1"), ("b.txt", b"2"), ("c.txt", b"3"), ("d.txt", b"4")], 400, "the limit is 3"),
    ([("good.txt", b"fine"), ("bad.docx", b"PK not a docx")], 400, "not a readable DOCX"),
]


def test_bad_uploads_are_refused_in_words_and_nothing_is_stored(api: Api):
    agent = api.create_agent(llm_dsl())
    for files, status, words in BAD_UPLOADS:
        resp = upload(api, agent, *files)
        assert resp.status_code == status, (files, resp.json)
        assert words in resp.json["message"], (files, resp.json)
        with db.connection_context():
            assert UploadFile.select().count() == 0 and FilePiece.select().count() == 0


def test_a_body_over_the_upload_limit_is_413(api: Api):
    agent = api.create_agent(llm_dsl())
    # 3 files × 20,000 bytes + 1 MiB for the form: this body is larger.
    resp = upload(api, agent, ("huge.txt", b"x" * (3 * 20_000 + 1024 * 1024 + 10)))
    assert resp.status_code == 413 and resp.json["code"] == 101


def test_files_on_a_completion_reach_the_model_text_and_image(api: Api, llm: LLMServer):
    agent = api.create_agent(llm_dsl())
    pdf = upload(api, agent, ("report.pdf", make_pdf([PDF_TEXT]))).json["data"]
    png = upload(api, agent, ("dot.png", make_png())).json["data"]
    resp = api.ask(agent, None, "what does it say?", files=[pdf, png["id"]])
    assert resp.status_code == 200, resp.json
    content = llm.chat_requests()[-1]["messages"][-1]["content"]
    assert content[0]["type"] == "text" and PDF_TEXT in content[0]["text"]
    assert content[1]["type"] == "image_url" and content[1]["image_url"]["url"].startswith(
        "data:image/png;base64,"
    )
    # The transcript names the files (sent as a descriptor and as a bare id alike).
    user = api.session(agent, resp.json["data"]["session_id"])["message"][-2]
    assert [f["name"] for f in user["files"]] == ["report.pdf", "dot.png"]


def test_a_file_gone_after_a_turn_is_not_found_by_the_next_turn_of_the_agent(api: Api, llm: LLMServer):
    """The turns of an agent share the services that keep no state (api.services.turns),
    not the file service, which remembers the rows it read: the next turn reads anew."""
    agent = api.create_agent(llm_dsl())
    file_id = upload(api, agent, ("note.txt", b"read me")).json["data"]["id"]
    session = api.create_session(agent)
    assert api.ask(agent, session, "read", files=[file_id]).status_code == 200
    with db.connection_context():
        UploadFile.delete().where(UploadFile.id == file_id).execute()
    resp = api.ask(agent, session, "again", files=[file_id])
    assert resp.status_code == 400 and set(resp.json["data"]["errors"]) == {"files"}, resp.json


def test_unknown_and_foreign_files_on_a_completion_are_400_naming_files(api: Api, other: Api, llm: LLMServer):
    agent = api.create_agent(llm_dsl())
    theirs = other.create_agent(llm_dsl())
    foreign = upload(other, theirs, ("secret.txt", b"their secret")).json["data"]
    session = api.create_session(agent)
    before = session_row(session)
    for files in (["no-such-file"], [foreign], [{"name": "x"}], "not a list"):
        resp = api.ask(agent, session, "hi", files=files)
        assert resp.status_code == 400, resp.json
        if isinstance(files, list):
            assert set(resp.json["data"]["errors"]) == {"files"}
    assert session_row(session) == before
    assert not llm.chat_requests()


def test_a_form_answered_with_a_pdf_sends_its_text_and_a_rejected_answer_changes_nothing(
    api: Api, other: Api, llm: LLMServer
):
    agent = api.create_agent(form_dsl())
    first = api.ask(agent, None, "start")
    assert first.json["data"]["event"] == "user_inputs"
    session = first.json["data"]["session_id"]
    theirs = other.create_agent(llm_dsl())
    foreign = upload(other, theirs, ("x.txt", b"not yours")).json["data"]["id"]
    mine = upload(api, agent, ("contract.pdf", make_pdf([PDF_TEXT]))).json["data"]

    before = session_row(session)
    for answer in (
        {"contract": "nope", "copies": 2},
        {"contract": foreign, "copies": 2},
        {"contract": 7, "copies": 2},
    ):
        resp = api.ask(agent, session, "", inputs=answer)
        assert resp.status_code == 400, resp.json
        assert set(resp.json["data"]["errors"]) == {"contract"}
        assert session_row(session) == before  # byte for byte: nothing lost, nothing advanced

    resp = api.ask(agent, session, "", inputs={"contract": {"value": [mine]}, "copies": "2"})
    assert resp.status_code == 200, resp.json
    sent = llm.chat_requests()[-1]["messages"][-1]["content"]
    assert sent == f"Read:\n[file: contract.pdf]\n{PDF_TEXT}"


def test_embed_visitors_use_only_their_own_files(app, api: Api):
    agent = api.create_agent(llm_dsl())
    embed = make_token(app, "tenant-a", "embed")
    client = app.test_client()
    alice, bob = secrets.token_hex(16), secrets.token_hex(16)

    def bot_upload(user_id, name, content):
        return client.post(
            f"/api/v1/agentbots/{agent}/upload",
            data={"file": [(io.BytesIO(content), name)], "user_id": user_id},
            headers={"Authorization": f"Bearer {embed}"},
            content_type="multipart/form-data",
        )

    resp = bot_upload(alice, "notes.txt", b"alice's notes")
    assert resp.status_code == 200, resp.json
    file_id = resp.json["data"]["id"]
    assert resp.json["data"]["created_by"] == alice
    assert bot_upload(None, "notes.txt", b"x").status_code == 400  # no visitor id
    assert upload(api, agent, ("n.txt", b"x"), path=f"/agentbots/{agent}/upload").status_code == 401

    def bot_ask(user_id):
        return client.post(
            f"/api/v1/agentbots/{agent}/completions",
            json={"question": "read", "user_id": user_id, "files": [file_id], "stream": False},
            headers={"Authorization": f"Bearer {embed}"},
        )

    assert bot_ask(alice).status_code == 200
    refused = bot_ask(bob)
    assert refused.status_code == 400 and "not found" in refused.json["data"]["errors"]["files"]
    # The tenant owns its visitors' files: the API may download them.
    assert api.get(f"/agents/attachments/{file_id}/download").data == b"alice's notes"


def test_per_turn_file_limit_counts_attached_files(app_factory, llm: LLMServer):
    app = app_factory(SETTINGS={"llm": llm.settings()}, LIMITS={"max_files_per_turn": 1})
    api = Api(app, make_token(app, "tenant-a"))
    agent = api.create_agent(llm_dsl())
    a = upload(api, agent, ("a.txt", b"one")).json["data"]["id"]
    b = upload(api, agent, ("b.txt", b"two")).json["data"]["id"]
    resp = api.ask(agent, None, "hi", files=[a, b])
    assert resp.status_code == 400 and "max_files_per_turn" in resp.json["data"]["errors"]["files"]


def test_directory_store_keeps_bytes_out_of_the_database(app_factory, tmp_path, llm: LLMServer):
    app = app_factory(
        SETTINGS={"llm": llm.settings()}, FILES={"store": "directory", "directory": str(tmp_path / "files")}
    )
    api = Api(app, make_token(app, "tenant-a"))
    agent = api.create_agent(llm_dsl())
    d = upload(api, agent, ("n.md", b"# Notes\nremember the milk")).json["data"]
    with db.connection_context():
        assert FilePiece.select().count() == 0
    assert api.get(f"/agents/attachments/{d['id']}/download").data == b"# Notes\nremember the milk"
    assert api.ask(agent, None, "read", files=[d["id"]]).status_code == 200
    assert "remember the milk" in llm.chat_requests()[-1]["messages"][-1]["content"]


# ---------------------------------------------------------------------- files and sessions
HOUR = 3600


def later(seconds: float) -> int:
    return now_ms() + int(seconds * 1000)


def sweep_files(api: Api, when: int | None = None, ttl: int = 0):
    """One sweep with the app's settings and this session lifetime; returns its report."""
    settings = RetentionSettings.from_config(api.app.config)
    settings.session_ttl_seconds = ttl
    with api.app.app_context(), db.connection_context():
        return sweep(settings, now=when)


def downloadable(api: Api, file_id: str) -> bool:
    return api.get(f"/agents/attachments/{file_id}/download").status_code == 200


def stored_rows(file_id: str) -> int:
    with db.connection_context():
        return (
            UploadFile.select().where(UploadFile.id == file_id).count()
            + FilePiece.select().where(FilePiece.file_id == file_id).count()
            + SessionFile.select().where(SessionFile.file_id == file_id).count()
        )


def test_a_deleted_sessions_files_go_with_it_unless_another_session_uses_them(api: Api, llm: LLMServer):
    agent = api.create_agent(llm_dsl())
    shared, own = (
        upload(api, agent, (f"{n}.txt", n.encode() * 1500)).json["data"]["id"] for n in ("ab", "cd")
    )
    first, second = api.create_session(agent), api.create_session(agent)
    assert api.ask(agent, first, "read", files=[shared, own]).status_code == 200
    assert api.ask(agent, second, "read", files=[shared]).status_code == 200
    form_agent = api.create_agent(form_dsl())
    answered = api.ask(form_agent, None, "start").json["data"]["session_id"]
    contract = upload(api, form_agent, ("contract.pdf", make_pdf([PDF_TEXT]))).json["data"]
    resp = api.ask(form_agent, answered, "", inputs={"contract": {"value": [contract]}, "copies": 1})
    assert resp.status_code == 200, resp.json

    api.delete(f"/agents/{agent}/sessions", json={"ids": [first]})
    api.delete(f"/agents/{form_agent}/sessions", json={"ids": [answered]})
    assert downloadable(api, own)  # until the sweep, like the session's messages
    assert sweep_files(api).files == 2
    assert not downloadable(api, own) and stored_rows(own) == 0
    assert not downloadable(api, contract["id"]) and stored_rows(contract["id"]) == 0
    # The other session still reads the file it shares, in its next turns too.
    assert downloadable(api, shared)
    assert api.ask(agent, second, "again", files=[shared]).status_code == 200
    assert "ab" * 10 in llm.chat_requests()[-1]["messages"][-1]["content"]

    api.delete(f"/agents/{agent}/sessions", json={"ids": [second]})
    assert sweep_files(api).files == 1
    assert not downloadable(api, shared) and stored_rows(shared) == 0


def test_expired_sessions_take_their_files_and_unused_uploads_go_after_the_lifetime(api: Api):
    agent = api.create_agent(llm_dsl())
    used, unused = (upload(api, agent, (f"{n}.txt", b"text")).json["data"]["id"] for n in ("used", "unused"))
    session = api.create_session(agent)
    assert api.ask(agent, session, "read", files=[used]).status_code == 200

    assert sweep_files(api, later(HOUR - 60), ttl=HOUR).files == 0
    assert downloadable(api, used) and downloadable(api, unused)
    report = sweep_files(api, later(HOUR + 60), ttl=HOUR)
    assert (report.expired, report.files) == (1, 2)
    assert not downloadable(api, used) and not downloadable(api, unused)
    assert stored_rows(used) == stored_rows(unused) == 0


def test_files_uploaded_before_sessions_kept_them_are_left_alone(api: Api):
    """Migration 15 marks existing uploads not sweepable: which sessions read them is unknown."""
    agent = api.create_agent(llm_dsl())
    old = upload(api, agent, ("old.txt", b"from before")).json["data"]["id"]
    session = api.create_session(agent)
    assert api.ask(agent, session, "read", files=[old]).status_code == 200
    with db.connection_context():
        UploadFile.update(sweepable=False).where(UploadFile.id == old).execute()
    api.delete(f"/agents/{agent}/sessions", json={"ids": [session]})
    assert sweep_files(api, later(10 * HOUR), ttl=HOUR).files == 0
    assert downloadable(api, old)


def test_the_sweep_removes_a_directory_stores_files(app_factory, tmp_path, llm: LLMServer):
    folder = tmp_path / "files"
    app = app_factory(
        SETTINGS={"llm": llm.settings()}, FILES={"store": "directory", "directory": str(folder)}
    )
    api = Api(app, make_token(app, "tenant-a"))
    agent = api.create_agent(llm_dsl())
    file_id = upload(api, agent, ("n.md", b"# Notes")).json["data"]["id"]
    session = api.create_session(agent)
    assert api.ask(agent, session, "read", files=[file_id]).status_code == 200
    assert len(list(folder.rglob(f"{file_id}.*"))) == 2

    api.delete(f"/agents/{agent}/sessions", json={"ids": [session]})
    assert sweep_files(api).files == 1
    assert list(folder.rglob(f"{file_id}.*")) == []


def test_deleting_the_agent_removes_a_directory_stores_files(app_factory, tmp_path, llm: LLMServer):
    folder = tmp_path / "files"
    app = app_factory(
        SETTINGS={"llm": llm.settings()}, FILES={"store": "directory", "directory": str(folder)}
    )
    api = Api(app, make_token(app, "tenant-a"))
    agent, kept = api.create_agent(llm_dsl()), api.create_agent(llm_dsl())
    gone = upload(api, agent, ("n.md", b"# Notes")).json["data"]["id"]
    other = upload(api, kept, ("m.md", b"# Mine")).json["data"]["id"]
    assert api.delete(f"/agents/{agent}").status_code == 200
    assert list(folder.rglob(f"{gone}.*")) == []
    assert len(list(folder.rglob(f"{other}.*"))) == 2 and downloadable(api, other)


def test_migration_15_leaves_earlier_uploads_to_their_agent(api: Api, database_url):
    agent = api.create_agent(llm_dsl())
    earlier = upload(api, agent, ("old.txt", b"from before")).json["data"]["id"]
    session = api.create_session(agent)
    with api.app.app_context():
        db.execute_sql(f"ALTER TABLE {UploadFile._meta.table_name} DROP COLUMN sweepable")
        db.execute_sql(f"DROP TABLE {SessionFile._meta.table_name}")
        SchemaVersion.delete().where(SchemaVersion.version == 15).execute()
    init_database(database_url, max_connections=4)

    assert api.ask(agent, session, "read", files=[earlier]).status_code == 200
    later_id = upload(api, agent, ("new.txt", b"from after")).json["data"]["id"]
    assert api.ask(agent, session, "read", files=[later_id]).status_code == 200
    api.delete(f"/agents/{agent}/sessions", json={"ids": [session]})
    assert sweep_files(api).files == 1
    assert downloadable(api, earlier) and not downloadable(api, later_id)
