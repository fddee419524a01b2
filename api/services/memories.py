"""RAGFlow's long-term Memory (``/memories``, ``/messages``; ragflow-sdk 0.27's
``create_memory``, ``list_memory``, ``delete_memory``, ``add_message``,
``search_message``, ``get_recent_messages``).

A Memory belongs to a tenant. Saving a conversation into it (``POST /messages``, or a
Message component's ``memory_ids`` after a successful turn) stores a **raw** message
("User Input: …\\nAgent Response: …") at once; when the Memory also has
``semantic``, ``episodic`` or ``procedural`` types, its LLM extracts those from the
exchange **afterwards**, in a background thread of the process (:class:`Extractor`),
so the turn's latency does not include it.

Storage is the one of keyed memory: a Memory's messages are :class:`~api.db.MemoryEntry`
rows with ``memory_id`` set (``role`` = message type, ``memory_key`` = user id), and
searched through the same tokenizer and full-text index as datasets
(:class:`api.db.fulltext.FullTextIndex`, scope ``"memory"``). ``memory_size`` caps a
Memory's stored text (characters of its messages): past it the oldest go first (FIFO).
Embeddings are not computed (``embd_id`` is kept but search is by terms).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Any

from peewee import fn

from agent.llm.client import ChatClient
from agent.llm.config import resolve_model
from api.db import Memory, MemoryEntry, date_of, db, now_ms, write_transaction
from api.db.fulltext import FullTextIndex
from api.errors import ArgumentError, NotFound
from api.http import field
from api.services.memory import key_hash

log = logging.getLogger("agentcanvas.memories")

TYPES = ("raw", "semantic", "episodic", "procedural")
EXTRACTED = TYPES[1:]
MAX_MEMORY_SIZE = 1024 * 1024 * 1024
_INDEX = FullTextIndex("memory")
_SETTABLE = (
    "name",
    "avatar",
    "description",
    "llm_id",
    "embd_id",
    "memory_type",
    "memory_size",
    "forgetting_policy",
    "temperature",
    "permissions",
    "system_prompt",
    "user_prompt",
)


# ---------------------------------------------------------------------- checks
def _text(body: dict, name: str, limit: int, required: bool = False) -> str | None:
    value = field(body, name, str, required=required, max_length=limit)
    if required and not value.strip():
        raise ArgumentError(f"{name!r} must not be empty")
    return value.strip() if value is not None and name == "name" else value


def _types(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ArgumentError(f"'memory_type' must be a list from {', '.join(TYPES)}, got {value!r}")
    types = list(dict.fromkeys(v.strip().lower() for v in value))
    unknown = [t for t in types if t not in TYPES]
    if unknown:
        raise ArgumentError(f"'memory_type' {unknown[0]!r} is not one of {', '.join(TYPES)}")
    if "raw" not in types:
        raise ArgumentError("'memory_type' must include 'raw' (the saved conversation itself)")
    return [t for t in TYPES if t in types]


def _settings(body: dict, creating: bool) -> dict:
    out: dict[str, Any] = {}
    for name in ("name", "llm_id", "embd_id"):
        # llm_id and embd_id may be empty: the default provider; term search only.
        if creating and name != "name" and body.get(name) is None:
            raise ArgumentError(f"{name!r} is required ('' for the default)")
        value = _text(body, name, 128 if name == "name" else 255, required=creating and name == "name")
        if value is not None:
            out[name] = value
    for name, limit in (
        ("avatar", 65536),
        ("description", 65536),
        ("system_prompt", 65536),
        ("user_prompt", 65536),
    ):
        value = _text(body, name, limit)
        if value is not None:
            out[name] = value
    if creating or body.get("memory_type") is not None:
        out["memory_type"] = json.dumps(_types(body.get("memory_type")))
    if body.get("memory_size") is not None:
        size = body["memory_size"]
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_MEMORY_SIZE:
            raise ArgumentError(f"'memory_size' must be a whole number of bytes from 1 to {MAX_MEMORY_SIZE}")
        out["memory_size"] = size
    if body.get("forgetting_policy") is not None and body["forgetting_policy"] != "FIFO":
        raise ArgumentError("'forgetting_policy' can only be 'FIFO'")
    if body.get("temperature") is not None:
        value = body["temperature"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 2:
            raise ArgumentError(f"'temperature' must be a number from 0 to 2, got {value!r}")
        out["temperature"] = float(value)
    if body.get("permissions") is not None and body["permissions"] not in ("me", "team"):
        raise ArgumentError("'permissions' must be 'me' or 'team'")
    if body.get("permissions") is not None:
        out["permissions"] = body["permissions"]
    return out


# ---------------------------------------------------------------------- memories
def memory_json(memory: Memory) -> dict:
    return {
        "id": memory.id,
        "name": memory.name,
        "avatar": memory.avatar or None,
        "tenant_id": memory.tenant_id,
        "owner_name": "",
        "memory_type": json.loads(memory.memory_type),
        "storage_type": memory.storage_type,
        "embd_id": memory.embd_id,
        "llm_id": memory.llm_id,
        "permissions": memory.permissions,
        "description": memory.description,
        "memory_size": memory.memory_size,
        "forgetting_policy": memory.forgetting_policy,
        "temperature": memory.temperature,
        "system_prompt": memory.system_prompt,
        "user_prompt": memory.user_prompt,
        "create_time": memory.create_time,
        "create_date": date_of(memory.create_time),
        "update_time": memory.update_time,
        "update_date": date_of(memory.update_time),
    }


def get_memory(tenant_id: str, memory_id: str) -> Memory:
    memory = Memory.get_or_none((Memory.id == memory_id) & (Memory.tenant_id == tenant_id))
    if memory is None:
        raise NotFound(f"memory {memory_id!r} not found")
    return memory


def create_memory(tenant_id: str, body: dict) -> Memory:
    settings = _settings(body, creating=True)
    now = now_ms()
    with write_transaction():
        return Memory.create(tenant_id=tenant_id, create_time=now, update_time=now, **settings)


def update_memory(tenant_id: str, memory_id: str, body: dict) -> Memory:
    settings = _settings({k: body[k] for k in _SETTABLE if k in body}, creating=False)
    if not settings:
        raise ArgumentError(f"nothing to update: give one of {', '.join(_SETTABLE)}")
    with write_transaction():
        get_memory(tenant_id, memory_id)
        Memory.update(update_time=now_ms(), **settings).where(Memory.id == memory_id).execute()
        _forget_past_size(get_memory(tenant_id, memory_id))
    return get_memory(tenant_id, memory_id)


def delete_memory(tenant_id: str, memory_id: str) -> None:
    with write_transaction():
        get_memory(tenant_id, memory_id)
        MemoryEntry.delete().where(MemoryEntry.memory_id == memory_id).execute()
        _INDEX.remove_groups([memory_id])
        Memory.delete().where(Memory.id == memory_id).execute()


def list_memories(
    tenant_id: str, page: int, page_size: int, keywords: str | None, memory_type: str | None
) -> dict:
    query = Memory.select().where(Memory.tenant_id == tenant_id)
    if keywords:
        query = query.where(Memory.name.contains(keywords))
    if memory_type:
        for wanted in _types(["raw", *memory_type.split(",")]):
            if wanted != "raw" or "raw" in memory_type:
                query = query.where(Memory.memory_type.contains(f'"{wanted}"'))
    total = query.count()
    rows = query.order_by(*Memory.listing_order("create_time", True)).paginate(page, page_size)
    return {"memory_list": [memory_json(m) for m in rows], "total_count": total}


# ---------------------------------------------------------------------- messages
def message_json(row: MemoryEntry, score: float | None = None) -> dict:
    out = {
        "message_id": row.id,
        "message_type": row.role,
        "source_id": row.source_id,
        "memory_id": row.memory_id,
        "user_id": row.memory_key,
        "agent_id": row.agent_id,
        "session_id": row.session_id or "",
        "content": row.content,
        "valid_at": date_of(row.create_time),
        "invalid_at": None,
        "forget_at": None,
        "status": bool(row.status),
    }
    if score is not None:
        out["similarity"] = score
    return out


def _owned(tenant_id: str, memory_ids: Iterable[str], strict: bool = True) -> list[Memory]:
    """The tenant's Memories of these ids; another tenant's or a missing one is a 404
    (``strict``) or left out."""
    ids = list(dict.fromkeys(memory_ids))
    if not ids and strict:
        raise ArgumentError("'memory_id' is required: one Memory id or a list of them")
    found = {m.id: m for m in Memory.select().where(Memory.id.in_(ids) & (Memory.tenant_id == tenant_id))}
    missing = [i for i in ids if i not in found]
    if missing and strict:
        raise NotFound(f"memory {missing[0]!r} not found")
    if missing:
        log.warning("memory ids %s are not this tenant's (or gone): nothing saved there", missing)
    return [found[i] for i in ids if i in found]


def _store(memory: Memory, entries: list[dict]) -> list[int]:
    """Insert messages of one Memory and index them (in the caller's transaction)."""
    ids = []
    for entry in entries:
        row = MemoryEntry.create(
            tenant_id=memory.tenant_id,
            agent_id=entry.get("agent_id") or "",
            key_hash=key_hash(entry.get("user_id") or ""),
            memory_key=(entry.get("user_id") or "")[:255],
            node_id="",
            role=entry["message_type"],
            content=entry["content"],
            tokens=0,
            session_id=(entry.get("session_id") or "")[:32] or None,
            memory_id=memory.id,
            source_id=entry.get("source_id") or 0,
            create_time=now_ms(),
        )
        ids.append(row.id)
    _INDEX.add(memory.id, [(str(i), e["content"]) for i, e in zip(ids, entries, strict=True)])
    _forget_past_size(memory)
    return ids


def _forget_past_size(memory: Memory) -> None:
    """FIFO: drop the oldest messages until the Memory's text fits ``memory_size``."""
    size = fn.COALESCE(fn.SUM(fn.LENGTH(MemoryEntry.content).coerce(False)), 0).coerce(False)
    total = int(MemoryEntry.select(size).where(MemoryEntry.memory_id == memory.id).scalar() or 0)
    while total > memory.memory_size:
        oldest = list(
            MemoryEntry.select(MemoryEntry.id, fn.LENGTH(MemoryEntry.content).coerce(False).alias("n"))
            .where(MemoryEntry.memory_id == memory.id)
            .order_by(MemoryEntry.id)
            .limit(100)
            .tuples()
        )
        if not oldest:
            return
        doomed = []
        for entry_id, n in oldest:
            doomed.append(entry_id)
            total -= int(n or 0)
            if total <= memory.memory_size:
                break
        MemoryEntry.delete().where(MemoryEntry.id.in_(doomed)).execute()
        _INDEX.remove([str(i) for i in doomed])


def raw_content(user_input: str, agent_response: str) -> str:
    return f"User Input: {user_input}\nAgent Response: {agent_response}"


def save_exchange(
    tenant_id: str, memory_ids: list[str], exchange: dict, strict: bool = True
) -> list[tuple[str, int]]:
    """Save one exchange (``agent_id``, ``session_id``, ``user_id``, ``user_input``,
    ``agent_response``) as a raw message in each Memory; ``[(memory id, message id)]``.

    Runs in the caller's transaction when there is one (the turn's). Extraction of the
    other types is the caller's to queue (:meth:`Extractor.submit`) once it has
    committed. ``strict=False`` (a turn) leaves out ids that are not the tenant's.
    """
    saved = []
    for memory in _owned(tenant_id, memory_ids, strict):
        entry = {
            **exchange,
            "message_type": "raw",
            "content": raw_content(exchange["user_input"], exchange["agent_response"]),
        }
        saved.append((memory.id, _store(memory, [entry])[0]))
    return saved


def add_message(tenant_id: str, body: dict, extractor: Extractor) -> str:
    """``POST /messages``."""
    memory_ids = body.get("memory_id")
    if isinstance(memory_ids, str):
        memory_ids = [memory_ids]
    if not isinstance(memory_ids, list) or not memory_ids or not all(isinstance(m, str) for m in memory_ids):
        raise ArgumentError("'memory_id' must be a Memory id or a non-empty list of them")
    exchange = {}
    for name in ("agent_id", "session_id", "user_input", "agent_response"):
        exchange[name] = (
            _text(
                body,
                name,
                16 * 1024 * 1024 if name in ("user_input", "agent_response") else 255,
                required=name in ("user_input", "agent_response"),
            )
            or ""
        )
    exchange["user_id"] = _text(body, "user_id", 255) or ""
    with write_transaction():
        saved = save_exchange(tenant_id, memory_ids, exchange)
    extractor.submit(tenant_id, saved, exchange)
    return "All add to task."


def _filters(query, agent_id: str | None, session_id: str | None, user_id: str | None):  # noqa: ANN001, ANN202
    if agent_id:
        query = query.where(MemoryEntry.agent_id == agent_id)
    if session_id:
        query = query.where(MemoryEntry.session_id == session_id)
    if user_id:
        query = query.where(MemoryEntry.key_hash == key_hash(user_id))
    return query


def recent_messages(
    tenant_id: str, memory_ids: list[str], agent_id: str | None, session_id: str | None, limit: int
) -> list[dict]:
    """``GET /messages``: the newest messages of these Memories, newest first."""
    ids = [m.id for m in _owned(tenant_id, memory_ids)]
    query = MemoryEntry.select().where(MemoryEntry.memory_id.in_(ids) & (MemoryEntry.status == True))  # noqa: E712
    query = _filters(query, agent_id, session_id, None)
    return [message_json(r) for r in query.order_by(MemoryEntry.id.desc()).limit(limit)]


def search_messages(
    tenant_id: str,
    memory_ids: list[str],
    query: str,
    top_n: int,
    similarity_threshold: float,
    agent_id: str | None = None,
    session_id: str | None = None,
    user_id: str | None = None,
) -> list[dict]:
    """``GET /messages/search``: the best ``top_n`` messages for ``query`` (term search,
    the datasets' tokenizer and index), each with its ``similarity``."""
    if not query or not query.strip():
        raise ArgumentError("'query' is required")
    ids = [m.id for m in _owned(tenant_id, memory_ids)]
    hits = [
        h
        for h in _INDEX.search(ids, query, limit=max(top_n * 8, 64))
        if h.term_similarity >= similarity_threshold
    ]
    if not hits:
        return []
    rows = MemoryEntry.select().where(
        MemoryEntry.id.in_([int(h.item_id) for h in hits]) & (MemoryEntry.status == True)  # noqa: E712
    )
    by_id = {r.id: r for r in _filters(rows, agent_id, session_id, user_id)}
    out = [
        message_json(by_id[int(h.item_id)], round(h.term_similarity, 6))
        for h in hits
        if int(h.item_id) in by_id
    ]
    return out[:top_n]


def memory_messages(tenant_id: str, memory_id: str, page: int, page_size: int, keywords: str | None) -> dict:
    """``GET /memories/<id>``: its messages, newest first, paged."""
    get_memory(tenant_id, memory_id)
    query = MemoryEntry.select().where(MemoryEntry.memory_id == memory_id)
    if keywords:
        query = query.where(MemoryEntry.content.contains(keywords))
    total = query.count()
    rows = query.order_by(MemoryEntry.id.desc()).paginate(page, page_size)
    return {
        "messages": {"message_list": [message_json(r) for r in rows], "total_count": total},
        "storage_type": "table",
    }


def _message(tenant_id: str, memory_id: str, message_id: str) -> MemoryEntry:
    get_memory(tenant_id, memory_id)
    try:
        number = int(message_id)
    except ValueError:
        raise ArgumentError(f"message id {message_id!r} must be a whole number") from None
    row = MemoryEntry.get_or_none((MemoryEntry.id == number) & (MemoryEntry.memory_id == memory_id))
    if row is None:
        raise NotFound(f"message {message_id!r} of memory {memory_id!r} not found")
    return row


def message_content(tenant_id: str, memory_id: str, message_id: str) -> dict:
    return message_json(_message(tenant_id, memory_id, message_id))


def forget_message(tenant_id: str, memory_id: str, message_id: str) -> None:
    with write_transaction():
        row = _message(tenant_id, memory_id, message_id)
        MemoryEntry.delete().where(MemoryEntry.id == row.id).execute()
        _INDEX.remove([str(row.id)])


def set_message_status(tenant_id: str, memory_id: str, message_id: str, status: Any) -> None:
    if not isinstance(status, bool):
        raise ArgumentError("'status' must be true or false")
    with write_transaction():
        row = _message(tenant_id, memory_id, message_id)
        MemoryEntry.update(status=status).where(MemoryEntry.id == row.id).execute()


# ---------------------------------------------------------------------- extraction
_PROMPT = (
    "From the conversation below, extract what is worth remembering as JSON with the keys {types}: "
    'each a list of {{"content": text}}. semantic: lasting facts about the user or the world; '
    "episodic: what happened in this exchange; procedural: how-to steps or preferences for doing "
    "things. Answer with the JSON only; use empty lists when there is nothing."
)


class Extractor:
    """Extracts semantic, episodic and procedural messages with each Memory's LLM, in a
    background thread of this process, after the raw message is committed.

    Args:
        llm_settings: the ``llm`` settings (providers, the default provider).
    """

    def __init__(self, llm_settings: dict):
        self.llm_settings = llm_settings
        self._pool: ThreadPoolExecutor | None = None
        self._last: Future | None = None  # the latest queued; its one thread runs them in order
        self._lock = threading.Lock()

    def submit(self, tenant_id: str, saved: list[tuple[str, int]], exchange: dict) -> None:
        """Queue extraction for the raw messages just committed (``[(memory id, message id)]``)."""
        if not saved:
            return
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentcanvas-memory")
            self._last = self._pool.submit(self._run, tenant_id, saved, dict(exchange))

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for the queued extractions, at most ``timeout`` seconds (``None``: no
        limit); whether all have run."""
        with self._lock:
            pool, self._pool = self._pool, None
            last, self._last = self._last, None
        if pool is None:
            return True
        pool.shutdown(wait=timeout is None)
        return last is None or futures_wait([last], timeout).not_done == set()

    def _run(self, tenant_id: str, saved: list[tuple[str, int]], exchange: dict) -> None:
        for memory_id, raw_id in saved:
            try:
                with db.connection_context():
                    self._extract(tenant_id, memory_id, raw_id, exchange)
            except Exception:  # noqa: BLE001 - one failed extraction must not stop the next
                log.exception("memory %s: extraction from message %s failed", memory_id, raw_id)

    def _extract(self, tenant_id: str, memory_id: str, raw_id: int, exchange: dict) -> None:
        from agent.component.llm import parse_json_answer

        memory = Memory.get_or_none((Memory.id == memory_id) & (Memory.tenant_id == tenant_id))
        if memory is None:
            return
        types = [t for t in json.loads(memory.memory_type) if t in EXTRACTED]
        if not types:
            return
        model = resolve_model(memory.llm_id, self.llm_settings)
        system = memory.system_prompt or _PROMPT.format(types=", ".join(types))
        conversation = raw_content(exchange["user_input"], exchange["agent_response"])
        user = f"{memory.user_prompt}\n\n{conversation}" if memory.user_prompt else conversation
        result = ChatClient(model, who=f"memory {memory.name!r}").complete(
            [{"role": "system", "content": system}, {"role": "user", "content": user}],
            temperature=memory.temperature,
            response_format={"type": "json_object"},
        )
        found = parse_json_answer(result.content or "", f"memory {memory.name!r}")
        entries = []
        for kind in types:
            for item in (found.get(kind) or []) if isinstance(found, dict) else []:
                content = item.get("content") if isinstance(item, dict) else item
                if isinstance(content, str) and content.strip():
                    entries.append(
                        {**exchange, "message_type": kind, "content": content.strip(), "source_id": raw_id}
                    )
        if entries:
            with write_transaction():
                _store(memory, entries)
