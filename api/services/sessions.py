"""Reading, listing and deleting sessions (their state is written only by :mod:`api.services.turns`)."""

from __future__ import annotations

import json

from peewee import Expression, ModelSelect

from api.db import MessageLog, Session, date_of, write_transaction
from api.errors import ArgumentError
from api.services import history
from api.services.agents import get_agent
from api.services.retention import trash_sessions
from api.services.turns import effective_status, turn_service

ORDER_FIELDS = ("create_time", "update_time")
_SUMMARY_FIELDS = (
    Session.id,
    Session.tenant_id,
    Session.agent_id,
    Session.agent_version_id,
    Session.name,
    Session.user_id,
    Session.source,
    Session.version,
    Session.status,
    Session.pending_form,
    Session.lease_owner,
    Session.lease_expires,
    Session.task_id,
    Session.round,
    Session.prompt_tokens,
    Session.completion_tokens,
    Session.total_tokens,
    Session.last_error,
    Session.create_time,
    Session.update_time,
)


def list_sessions(
    tenant_id: str,
    agent_id: str,
    page: int,
    page_size: int,
    orderby: str,
    desc: bool,
    session_id: str | None = None,
    user_id: str | None = None,
    with_dsl: bool = False,
) -> tuple[list[Session], int]:
    """One page of the agent's sessions in ``orderby`` order (ties by id, in the same
    direction), and how many there are.

    By ``update_time`` (the default; every turn sets it, so it has no index) the page is
    read through ``update_mark``, its 10-minute step, indexed with ``agent_id``: only the
    sessions in the steps the first ``page * page_size`` sessions fall in are read and
    sorted, not all of the agent's (:func:`_steps_of_first`).
    """
    get_agent(tenant_id, agent_id)
    # The agent is the tenant's (get_agent), so its sessions are: counted by agent_id
    # alone, on its index (with tenant_id: a read of every row, 25x slower at 100,000).
    cond = Session.agent_id == agent_id
    if session_id:
        cond &= Session.id == session_id
    if user_id:
        cond &= Session.user_id == user_id
    total = Session.select().where(cond).count()
    query = _select(with_dsl).where(cond & (Session.tenant_id == tenant_id))
    if orderby == "update_time":
        steps = _steps_of_first(cond, page * page_size, desc)
        if steps is not None:
            query = query.where(steps)
    rows = list(query.order_by(*Session.listing_order(orderby, desc)).paginate(page, page_size))
    return rows, total


def _steps_of_first(cond: Expression, n: int, desc: bool) -> Expression | None:
    """The ``update_mark`` steps that hold the first ``n`` sessions matching ``cond`` by
    ``update_time`` (latest first with ``desc``): the n-th session in ``update_mark``
    order (read on its index) and every one in a step at or before it in that order;
    ``None`` (all) when there are fewer than ``n``.

    Exact: a step's sessions all come before the next step's in ``update_time`` order,
    and at least ``n`` sessions are in the steps up to the n-th's, so no session in a
    later step is among the first ``n``.
    """
    mark = Session.update_mark
    edge = (
        Session.select(mark)
        .where(cond)
        .order_by(mark.desc() if desc else mark.asc())
        .limit(1)
        .offset(n - 1)
        .scalar()
    )
    if edge is None:
        return None
    return mark >= edge if desc else mark <= edge


def get_session(tenant_id: str, agent_id: str, session_id: str, with_dsl: bool = False) -> Session:
    """The session with its summary fields, and with ``with_dsl`` its state (``snapshot``,
    as :func:`state_of` reads it)."""
    get_agent(tenant_id, agent_id)
    fields = (*_SUMMARY_FIELDS, history.STATE) if with_dsl else _SUMMARY_FIELDS
    return turn_service().find_session(tenant_id, agent_id, session_id, fields=fields)


def _select(with_dsl: bool) -> ModelSelect:
    """Sessions' summary fields, and with ``with_dsl`` their state (``snapshot``)."""
    if not with_dsl:
        return Session.select(*_SUMMARY_FIELDS)
    return history.select_with_state(*_SUMMARY_FIELDS, history.STATE)


def state_of(row: Session) -> dict:
    """The state (the snapshot, parsed) of a session read with ``with_dsl``."""
    return json.loads(history.unpack(row.snapshot))


def transcript(
    session_id: str, page: int = 1, page_size: int = 100, abandoned: bool = True
) -> tuple[list[dict], int]:
    """One page of a session's message log and the number of messages in it.

    Page 1 holds the most recent ``page_size`` messages, page 2 the ones before them,
    and so on; each page is in order, oldest first. ``abandoned=False`` leaves out the
    messages a regenerate or an undo took back (what the embed page shows).
    """
    cond = MessageLog.session_id == session_id
    if not abandoned:
        cond &= MessageLog.abandoned == False  # noqa: E712 - peewee builds SQL from ==
    total = MessageLog.select().where(cond).count()
    rows = list(
        MessageLog.select()
        .where(cond)
        .order_by(MessageLog.id.desc())
        .limit(page_size)
        .offset((page - 1) * page_size)
    )
    return [_message_json(row) for row in reversed(rows)], total


def _message_json(row: MessageLog) -> dict:
    message = {
        "role": row.role,
        "content": row.content,
        "id": row.message_id or None,
        "round": row.round,
        "created_at": row.create_time / 1000,
    }
    if row.meta:
        message.update(json.loads(row.meta))
    if row.abandoned:
        message["abandoned"] = True
    return message


def messages_of(session_ids: list[str], page_size: int = 100) -> dict[str, list[dict]]:
    """The most recent ``page_size`` messages of each session, oldest first."""
    return {sid: transcript(sid, 1, page_size)[0] for sid in session_ids}


def delete_sessions(
    tenant_id: str, agent_id: str, ids: object, delete_all: bool = False
) -> tuple[int, list[str]]:
    """Delete the listed sessions of the agent, or all of them (``delete_all``);
    ``(deleted, errors)``, one error per bad id."""
    get_agent(tenant_id, agent_id)
    if delete_all:
        if ids:
            raise ArgumentError("give either 'ids' or 'delete_all': true, not both")
        with write_transaction():
            of_agent = Session.select(Session.id).where(
                (Session.agent_id == agent_id) & (Session.tenant_id == tenant_id)
            )
            return trash_sessions(of_agent), []
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise ArgumentError(
            "'ids' must be a non-empty list of session ids (or send 'delete_all': true to delete them all)"
        )
    errors = []
    unique = list(dict.fromkeys(ids))
    if len(unique) != len(ids):
        errors.append("duplicate session ids were given; each was deleted once")
    with write_transaction():
        found = {
            r.id
            for r in Session.select(Session.id).where(
                Session.id.in_(unique) & (Session.agent_id == agent_id) & (Session.tenant_id == tenant_id)
            )
        }
        for sid in unique:
            if sid not in found:
                errors.append(f"session {sid!r} of agent {agent_id!r} not found")
        # Gone for readers now; their messages and snapshots go with the next sweep.
        trash_sessions(list(found))
    return len(found), errors


def session_json(
    row: Session, messages: list[dict] | None = None, with_dsl: bool = False, paging: dict | None = None
) -> dict:
    """A session in RAGFlow's shape (``id``, ``agent_id``, ``message``, times) plus our state.

    ``paging`` (``messages_page``, ``messages_page_size``, ``messages_total``) tells
    which page of the transcript ``message`` is.
    """
    out = {
        "id": row.id,
        "agent_id": row.agent_id,
        "agent_version_id": row.agent_version_id,
        "name": row.name,
        "user_id": row.user_id,
        "source": row.source,
        "status": effective_status(row),
        "pending_form": row.pending_form,
        "version": row.version,
        "round": row.round,
        "task_id": row.task_id,
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "total_tokens": row.total_tokens,
        "last_error": row.last_error,
        "create_time": row.create_time,
        "create_date": date_of(row.create_time),
        "update_time": row.update_time,
        "update_date": date_of(row.update_time),
    }
    if messages is not None:
        out["message"] = messages
    if paging:
        out.update(paging)
    if with_dsl:
        out["dsl"] = state_of(row)
    return out
