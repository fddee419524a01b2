"""A session's earlier states, for regenerate and undo (docs/design.md §15).

Each committed turn keeps the snapshot the session had **before** it: the row of
:class:`~api.db.SessionSnapshot` with ``round=r`` is the state after ``r`` turns, the
one turn ``r + 1`` ran from. Only the last ``keep`` such rows of the active branch are
kept (``session.keep_snapshots``, default 10; 0 keeps none, and then there is nothing
to regenerate or undo): the state after round ``r`` is written to slot ``r % keep`` of
the session, in place of the one ``keep`` rounds older.

* **Undo** restores the state after ``round - 1`` turns.
* **Regenerate** runs the last turn again (its query, form answers and files, read
  from the message log) from that same state.

Both take back the last turn: its messages stay in the log marked ``abandoned``; the
keyed memory it wrote is removed, and the session's history and node memory are those
of the restored snapshot. So what the next turn sees follows the active branch only.

A kept state is the snapshot's text as it was, copied by the database from the
session row just before the turn's ``UPDATE`` replaces it (:func:`keep_current`):
the turn neither compresses it (zlib cost more CPU than the rest of the commit) nor
sends it. Postgres compresses such values itself (TOAST); on SQLite and MySQL a kept
state takes the snapshot's size. Rows kept zlib-compressed by earlier versions are
still read (:func:`unpack`).
These functions run inside the turn service's one end-of-turn transaction
(:mod:`api.services.turns`), which alone writes a session's state.
"""

from __future__ import annotations

import json
import zlib

from peewee import fn

from api.db import MemoryEntry, MessageLog, Session, SessionSnapshot, db, now_ms
from api.db.database import is_postgres, is_sqlite
from api.db.prepared import Prepared
from api.errors import Conflict


def kept_snapshot(session_id: str, round_no: int) -> str:
    """The kept state after ``round_no`` turns.

    Raises:
        Conflict: there is none (no turn to take back, or it is older than the kept ones).
    """
    if round_no < 0:
        raise Conflict(f"session {session_id!r} has no turn to take back yet")
    row = (
        SessionSnapshot.select(SessionSnapshot.packed)
        .where((SessionSnapshot.session_id == session_id) & (SessionSnapshot.round == round_no))
        .order_by(SessionSnapshot.id.desc())
        .first()
    )
    if row is None:
        raise Conflict(
            f"session {session_id!r} keeps no state from before its last turn: only the last "
            f"session.keep_snapshots turns can be regenerated or undone (0 keeps none)"
        )
    return unpack(row.packed)


def unpack(packed: str | bytes | memoryview) -> str:
    """A kept state as text: kept as it was (the snapshot's UTF-8, or text on SQLite), or
    zlib-compressed, as earlier versions kept it."""
    if isinstance(packed, str):
        return packed
    data = bytes(packed)
    if data[:1] == b"{":  # a snapshot is a JSON object; zlib's first byte is never "{"
        return data.decode("utf-8")
    return zlib.decompress(data).decode("utf-8")


def last_request(session_id: str, round_no: int) -> dict:
    """What the user sent in turn ``round_no`` of the active branch: ``{query, inputs, files}``.

    Raises:
        Conflict: the message log has no such turn.
    """
    row = (
        MessageLog.select(MessageLog.content, MessageLog.meta)
        .where(
            (MessageLog.session_id == session_id)
            & (MessageLog.round == round_no)
            & (MessageLog.role == "user")
            & (MessageLog.abandoned == False)  # noqa: E712 - peewee builds SQL from ==
        )
        .order_by(MessageLog.id.desc())
        .first()
    )
    if row is None:
        raise Conflict(f"session {session_id!r} has no turn {round_no} to regenerate")
    meta = json.loads(row.meta) if row.meta else {}
    return {"query": row.content, "inputs": meta.get("inputs") or None, "files": meta.get("files") or None}


def _copy_current(m):  # noqa: ANN001, ANN202 - a Prepared builder
    """``INSERT … SELECT`` into the session's slot, or over the state kept there: the
    session's snapshot as it is now, copied by the database."""
    snapshot = Session.snapshot
    if is_postgres(db):
        snapshot = fn.convert_to(Session.snapshot, "UTF8")  # text into bytea
    query = Session.select(Session.id, m("slot"), Session.round, snapshot, m("now")).where(
        (Session.id == m("session_id")) & (Session.version == m("version"))
    )
    return SessionSnapshot.insert_from(
        query,
        [
            SessionSnapshot.session_id,
            SessionSnapshot.slot,
            SessionSnapshot.round,
            SessionSnapshot.packed,
            SessionSnapshot.create_time,
        ],
    ).on_conflict(
        # MySQL names no target: its ON DUPLICATE KEY UPDATE takes any unique key (the one there is).
        conflict_target=[SessionSnapshot.session_id, SessionSnapshot.slot]
        if is_sqlite(db) or is_postgres(db)
        else None,
        preserve=[SessionSnapshot.round, SessionSnapshot.packed, SessionSnapshot.create_time],
    )


# Every turn runs it: compiled once per database (api.db.prepared).
_KEEP_CURRENT = Prepared(_copy_current)


def keep_current(session_id: str, version: int, round_no: int, keep: int) -> None:
    """Keep the session's snapshot as it is (at ``version``: the state after ``round_no``
    turns) before the turn's ``UPDATE`` replaces it, in slot ``round_no % keep``.

    The database copies the snapshot itself (``INSERT … SELECT``): nothing is sent or
    compressed, and it goes with the transaction's next statement, the ``UPDATE``
    (``Prepared.send``: on MySQL no round trip of its own). The slot's row, the state
    ``keep`` rounds older, is written over in place (SQLite: its leaf and overflow page,
    where adding a row and deleting the old ones every ``keep`` turns wrote four pages a
    turn, its index and the table's interior page too; MySQL: no index entry, and no
    range ``DELETE`` that could lock other sessions' rows).
    """
    if keep > 0:
        _KEEP_CURRENT.send(session_id=session_id, version=version, slot=round_no % keep, now=now_ms())


def take_back_after(session_id: str, round_no: int, keep_base: bool) -> None:
    """Abandon the turns after ``round_no``: mark their messages, remove their keyed memory
    and the kept states they made. ``keep_base`` keeps the state after ``round_no`` turns
    (a regenerate runs from it and goes on from there; an undo makes it current)."""
    MessageLog.update(abandoned=True).where(
        (MessageLog.session_id == session_id)
        & (MessageLog.round > round_no)
        & (MessageLog.abandoned == False)  # noqa: E712
    ).execute()
    MemoryEntry.delete().where(
        (MemoryEntry.session_id == session_id) & (MemoryEntry.round > round_no)
    ).execute()
    first_dropped = round_no + 1 if keep_base else round_no
    SessionSnapshot.delete().where(
        (SessionSnapshot.session_id == session_id) & (SessionSnapshot.round >= first_dropped)
    ).execute()
