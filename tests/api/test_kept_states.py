"""How a session's states are kept on SQLite: filled to their pages (api.services.history.fill_pages)."""

from __future__ import annotations

import json

import pytest

from api.db import SessionSnapshot, db
from api.services.history import fill_pages
from tests.api.conftest import Api, dsl_of

PAGE = 4096
ROOMY = 1 << 30  # a max_snapshot_bytes no state reaches


def state(size: int) -> bytes:
    """A snapshot-like JSON object of exactly ``size`` bytes."""
    head = b'{"history":"'
    return head + b"x" * (size - len(head) - 2) + b'"}'


def test_a_state_that_fits_on_one_page_is_kept_as_it_is():
    for size in (20, 1000, 3990):
        assert fill_pages(state(size), PAGE, ROOMY) == state(size)


def test_a_state_over_a_page_fills_its_pages_and_parses_the_same():
    for size in (6500, 7446, 7712, 8090):
        filled = fill_pages(state(size), PAGE, ROOMY)
        assert filled.startswith(state(size)) and filled[size:].strip() == b""
        assert json.loads(filled) == json.loads(state(size))
        # a leaf page's share (4096 - 35) and one overflow page (4096 - 4), less the row's other columns
        assert len(filled) == (PAGE - 35) + (PAGE - 4) - 52


def test_states_of_a_session_that_take_as_many_pages_have_one_size():
    # Each turn's state differs by a few bytes: filled, the row keeps its size, and
    # SQLite writes it over the old one in place.
    two_pages = {len(fill_pages(state(size), PAGE, ROOMY)) for size in range(6500, 8000, 37)}
    three_pages = {len(fill_pages(state(size), PAGE, ROOMY)) for size in range(10000, 12000, 37)}
    assert len(two_pages) == 1 and len(three_pages) == 1
    assert three_pages.pop() - two_pages.pop() == PAGE - 4  # one more overflow page, no more


def test_a_state_is_filled_only_where_the_spaces_add_at_most_a_quarter():
    # The spaces take the rest of the row's leaf page, which it would share otherwise.
    for size in (4100, 5337, 6400, 8200, 9600):
        assert fill_pages(state(size), PAGE, ROOMY) == state(size)
    assert len(fill_pages(state(12000), PAGE, ROOMY)) == (PAGE - 35) + 2 * (PAGE - 4) - 52
    for size in range(4000, 90000, 101):
        assert len(fill_pages(state(size), PAGE, ROOMY)) - size <= size // 4


def test_a_state_is_never_filled_past_the_snapshot_limit():
    # A filled state must load again: Canvas refuses a snapshot over max_snapshot_bytes.
    assert fill_pages(state(7000), PAGE, 7500) == state(7000)
    assert len(fill_pages(state(7000), PAGE, 8200)) == (PAGE - 35) + (PAGE - 4) - 52


def test_a_state_kept_as_text_or_on_another_database_is_left_as_it_is():
    assert fill_pages(state(7446).decode(), PAGE, ROOMY) == state(7446).decode()
    assert fill_pages(state(7446), 0, ROOMY) == state(7446)  # MySQL, Postgres: no page size


def test_other_page_sizes():
    filled = fill_pages(state(14000), 8192, ROOMY)
    assert len(filled) == (8192 - 35) + (8192 - 4) - 52
    assert fill_pages(state(8000), 8192, ROOMY) == state(8000)  # on its leaf page


def roomy_dsl() -> dict:
    """Echoes the query; its state holds a 6,500-character variable (a few pages)."""
    return dsl_of(
        {"Message:Out": ("Message", {"content": ["{sys.query}"]}, [])},
        variables={"notes": {"type": "string", "value": "n" * 6500}},
    )


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_sessions_states_over_a_page_are_kept_filled_and_go_on(api: Api):
    agent_id = api.create_agent(roomy_dsl())
    session_id = api.create_session(agent_id)
    for i in range(14):  # past a ring of 11 slots
        resp = api.ask(agent_id, session_id, f"question {i}")
        assert resp.status_code == 200, resp.json
    with db.connection_context():
        lengths = {
            row.slot: len(row.packed)
            for row in SessionSnapshot.select().where(SessionSnapshot.session_id == session_id)
        }
    # Every state has the size of the pages it takes (the same number for all): the next
    # one of its slot is written over it in place (slot 0's first, a new session's, was
    # written over by turn 11).
    filled = {(PAGE - 35) + k * (PAGE - 4) - 52 for k in range(1, 10)}
    assert len(lengths) == 11 and len(set(lengths.values())) == 1, lengths
    assert set(lengths.values()) <= filled, lengths
    # The filled states load: the session goes on, its state is whole, undo restores one.
    dsl = api.session(agent_id, session_id, dsl="true")["dsl"]
    assert dsl["history"][-1] == ["assistant", "question 13"]
    assert dsl["variables"]["notes"]["value"] == "n" * 6500
    resp = api.post(f"/agents/{agent_id}/sessions/{session_id}/undo", json={"stream": False})
    assert resp.status_code == 200, resp.json
    assert resp.json["data"]["data"]["content"] == "question 12"
    assert answer_of(api.ask(agent_id, session_id, "after")) == "after"


def answer_of(resp) -> str:
    assert resp.status_code == 200, resp.json
    return resp.json["data"]["data"]["content"]
