"""Keyed LLM memory in the database (docs/design.md §8): the store a turn's canvas reads, and the
REST views' list and forget.

A node with ``memory_key`` (e.g. ``"{sys.user_id}"``) remembers its exchanges under
that key beyond one session. The turn service gives each canvas a
:class:`DatabaseMemoryStore` scoped to the turn's (tenant, agent), so memory never
crosses agents or tenants. The runtime only reads through it; the new entries it
collects in ``canvas.memory_writes`` are written by :meth:`DatabaseMemoryStore.commit`
inside the turn's one end-of-turn transaction (:mod:`api.services.turns`), so a turn's
snapshot, messages and memory are committed together or not at all.

Each (tenant, agent, key, node) keeps its newest :data:`agent.memory.MAX_WINDOW`
entries: no memory window reads more. The trim uses only ``ORDER BY ... LIMIT ...
OFFSET`` and a ranged ``DELETE``, which every MySQL-compatible engine (TiDB, Vitess)
accepts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from peewee import Expression

from agent.memory import MAX_WINDOW, entry_tokens
from api.db import MemoryEntry, db, now_ms, write_transaction
from api.errors import ArgumentError
from api.services.agents import get_agent

#: The longest memory key and node id stored (the columns' size; see MemoryEntry).
MAX_ID_CHARS = 255
_SHORTER = {
    "memory key": "make memory_key render a shorter id, such as {sys.user_id}",
    "node id": "give the component a shorter id",
}


def id_problem(what: str, value: object) -> str | None:
    """Why ``value`` cannot be a ``"memory key"`` or ``"node id"``, or ``None`` if it can."""
    if not isinstance(value, str) or not value.strip():
        return f"the {what} must be non-empty text, got {value!r}"
    if value != value.strip():
        return (
            f"the {what} {value!r} has spaces around it; keys are stored without them: use {value.strip()!r}"
        )
    if len(value) > MAX_ID_CHARS:
        return (
            f"the {what} {value[:40]!r}… is {len(value)} characters long; the limit is {MAX_ID_CHARS} "
            f"({_SHORTER[what]})"
        )
    return None


def key_hash(key: str) -> str:
    """What rows are found by: exact whatever the database's collation (see MemoryEntry)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _checked(node_id: str, key: str) -> None:
    for what, value in (("memory key", key), ("node id", node_id)):
        problem = id_problem(what, value)
        if problem:
            raise ValueError(problem)


class DatabaseMemoryStore:
    """The :class:`agent.memory.MemoryStore` of one (tenant, agent), kept in ``memory_entry``.

    Args:
        tenant_id: the agent's tenant.
        agent_id: the agent whose nodes remember.
        taken_back: ``(session_id, round)`` for a regenerate: the entries that session's
            turns after ``round`` wrote are not read (the turn commits their removal).
    """

    def __init__(self, tenant_id: str, agent_id: str, taken_back: tuple[str, int] | None = None):
        self.tenant_id = tenant_id
        self.agent_id = agent_id
        self.taken_back = taken_back

    def _scope(self, key: str) -> Expression:
        return (
            (MemoryEntry.tenant_id == self.tenant_id)
            & (MemoryEntry.agent_id == self.agent_id)
            & (MemoryEntry.key_hash == key_hash(key))
            & MemoryEntry.memory_id.is_null()  # not a RAGFlow Memory's message
        )

    def load(self, node_id: str, key: str, limit: int = MAX_WINDOW) -> list[dict]:
        """The newest ``limit`` entries of ``node_id`` under ``key``, oldest first.

        Raises:
            ValueError: the key or node id cannot be stored (empty or too long).
            peewee.PeeweeException: the database cannot be read (the node then fails).
        """
        _checked(node_id, key)
        if limit <= 0:
            return []
        cond = self._scope(key) & (MemoryEntry.node_id == node_id)
        if self.taken_back is not None:
            session_id, round_no = self.taken_back
            cond &= (
                MemoryEntry.session_id.is_null()
                | (MemoryEntry.session_id != session_id)
                | (MemoryEntry.round <= round_no)
            )
        # The canvas runs in the turn's worker thread, which holds no connection.
        with db.connection_context():
            rows = list(
                MemoryEntry.select(MemoryEntry.role, MemoryEntry.content, MemoryEntry.tokens)
                .where(cond)
                .order_by(MemoryEntry.id.desc())
                .limit(limit)
                .tuples()
            )
        return [
            {"role": role, "content": content, "tokens": tokens} for role, content, tokens in reversed(rows)
        ]

    def commit(
        self,
        writes: dict[tuple[str, str], list[dict]],
        session_id: str | None = None,
        round_no: int | None = None,
    ) -> None:
        """Append a turn's ``canvas.memory_writes`` and trim each group to its newest entries.

        The turn service calls it inside the end-of-turn transaction, naming the turn
        (``session_id``, ``round_no``) so that an undo or regenerate of that turn can take
        its entries back; called outside one, it opens its own.

        Raises:
            ValueError: a key or node id cannot be stored (nothing is written).
        """
        if not writes:
            return
        for node_id, key in writes:
            _checked(node_id, key)
        if db.in_transaction():
            self._write(writes, session_id, round_no)
        else:
            with write_transaction():
                self._write(writes, session_id, round_no)

    def _write(
        self, writes: dict[tuple[str, str], list[dict]], session_id: str | None, round_no: int | None
    ) -> None:
        now = now_ms()
        rows = [
            {
                "tenant_id": self.tenant_id,
                "agent_id": self.agent_id,
                "key_hash": key_hash(key),
                "memory_key": key,
                "node_id": node_id,
                "role": entry["role"],
                "content": entry["content"],
                "tokens": entry_tokens(entry),
                "session_id": session_id,
                "round": round_no,
                "create_time": now,
            }
            for (node_id, key), entries in writes.items()
            for entry in entries
        ]
        if not rows:
            return
        MemoryEntry.insert_many(rows).execute()
        for node_id, key in writes:
            group = self._scope(key) & (MemoryEntry.node_id == node_id)
            # The id of the newest entry that no longer fits; it and all older ones go.
            cutoff = (
                MemoryEntry.select(MemoryEntry.id)
                .where(group)
                .order_by(MemoryEntry.id.desc())
                .limit(1)
                .offset(MAX_WINDOW)
                .scalar()
            )
            if cutoff is not None:
                MemoryEntry.delete().where(group & (MemoryEntry.id <= cutoff)).execute()

    def entries(self, key: str, node_ids: Iterable[str] = ()) -> dict[str, list[dict]]:
        """Every node's memory under ``key`` (or only ``node_ids``'), oldest first per node."""
        query = MemoryEntry.select().where(self._scope(key))
        node_ids = list(node_ids)
        if node_ids:
            query = query.where(MemoryEntry.node_id.in_(node_ids))
        out: dict[str, list[dict]] = {}
        for row in query.order_by(MemoryEntry.node_id, MemoryEntry.id):
            out.setdefault(row.node_id, []).append(
                {
                    "role": row.role,
                    "content": row.content,
                    "tokens": row.tokens,
                    "create_time": row.create_time,
                }
            )
        return out

    def delete(self, key: str) -> int:
        """Forget ``key`` in every node of the agent; returns how many entries were removed."""
        with write_transaction():
            return MemoryEntry.delete().where(self._scope(key)).execute()


def _store(tenant_id: str, agent_id: str, key: str) -> DatabaseMemoryStore:
    """The store of the tenant's agent (404 for another tenant's), after checking ``key``."""
    get_agent(tenant_id, agent_id)
    problem = id_problem("memory key", key)
    if problem:
        raise ArgumentError(problem)
    return DatabaseMemoryStore(tenant_id, agent_id)


def list_memory(tenant_id: str, agent_id: str, key: str, node_id: str | None = None) -> dict:
    """``{key, agent_id, nodes: {node_id: [entries, newest last]}, total}``."""
    entries = _store(tenant_id, agent_id, key).entries(key, [node_id] if node_id else ())
    return {
        "key": key,
        "agent_id": agent_id,
        "nodes": entries,
        "total": sum(len(v) for v in entries.values()),
    }


def forget(tenant_id: str, agent_id: str, key: str) -> dict:
    """Delete everything the agent remembers under ``key``: ``{key, agent_id, deleted}``."""
    deleted = _store(tenant_id, agent_id, key).delete(key)
    return {"key": key, "agent_id": agent_id, "deleted": deleted}
