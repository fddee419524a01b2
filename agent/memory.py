"""Conversation memory of the LLM-backed nodes (docs/design.md §8).

Each LLM, Agent and Categorize node remembers its own exchanges: the rendered user
prompt it sent and the answer it got. Where that memory lives:

* **session memory** (the default): ``canvas.memory[node_id]``, a list of entries
  kept in the snapshot, so it lasts as long as the session;
* **keyed memory**: a node with ``memory_key`` (e.g. ``"{sys.user_id}"``) reads from
  ``canvas.services["memory_store"]`` (a :class:`MemoryStore` the host scopes to
  one tenant and agent) and does **not** write during the run: its new entries are
  collected in ``canvas.memory_writes[(node_id, key)]`` and the host commits them
  with the turn (the API in the turn's one transaction; a library user with
  :meth:`InMemoryStore.commit`). A turn that fails commits nothing: the canvas
  clears ``memory_writes`` when a run fails.
* **conversation history** (``history_source: "conversation"``): the session's user
  queries and final answers, RAGFlow and Dify style; nothing is written.

An entry is ``{"role": "user"|"assistant", "content": text, "tokens": n}``; ``tokens``
caches the entry's token count (:func:`agent.llm.tokens.message_tokens`) so that
building a prompt never re-counts the history.

Which history a prompt gets (:func:`select_history`): the last ``window`` single
messages (``message_history_window_size``: 1–100, 20 when absent, 0 for none); if
that slice starts with an assistant message it is dropped, so history starts with a
user message; then whole oldest pairs are dropped until the history fits the token
budget (:func:`history_budget`). The cost depends on the window, never on how long
the conversation has been.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agent.errors import MemoryStoreError
from agent.llm.tokens import message_tokens

if TYPE_CHECKING:
    from agent.canvas import Canvas

MAX_WINDOW = 100
DEFAULT_WINDOW = 20
# The history budget when the model's context size is not configured.
UNKNOWN_CONTEXT_BUDGET = 2000
ROLES = ("user", "assistant")


def make_entry(role: str, content: str) -> dict:
    """A memory entry with its token count cached."""
    return {"role": role, "content": content, "tokens": message_tokens(content)}


def entry_tokens(entry: dict) -> int:
    """The entry's cached token count (counted once and stored if missing)."""
    tokens = entry.get("tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        tokens = message_tokens(entry.get("content") or "")
        entry["tokens"] = tokens
    return tokens


def history_budget(context_size: int | None, max_tokens: int, prompt_tokens: int) -> int:
    """Tokens the history may take: context − max_tokens − prompt, or 2,000 if unknown."""
    if not context_size:
        return UNKNOWN_CONTEXT_BUDGET
    return max(0, int(context_size) - max(0, int(max_tokens or 0)) - int(prompt_tokens))


def select_history(entries: Sequence[dict], window: int, budget: int) -> list[dict]:
    """The ``{role, content}`` messages to send as history (see the module docstring).

    Args:
        entries: the node's memory, oldest first.
        window: how many recent single messages to consider (0: none).
        budget: the most tokens the result may take.
    """
    if window <= 0 or not entries:
        return []
    recent = list(entries[-window:])
    if recent[0].get("role") == "assistant":
        recent = recent[1:]
    total = sum(entry_tokens(e) for e in recent)
    start = 0
    while total > budget and start < len(recent):
        # Drop the oldest whole pair: a user message and the answers up to the next one.
        end = start + 1
        while end < len(recent) and recent[end].get("role") != "user":
            end += 1
        total -= sum(entry_tokens(e) for e in recent[start:end])
        start = end
    return [{"role": e["role"], "content": e["content"]} for e in recent[start:]]


@runtime_checkable
class MemoryStore(Protocol):
    """Keyed memory that outlives a session, scoped by the host to one tenant and agent.

    The runtime only reads through it; the host commits a turn's
    ``canvas.memory_writes`` itself (the API inside the turn's transaction). A store
    used by the REST API also lists and deletes a key's memory
    (``GET/DELETE /agents/<id>/memory/<key>``): see :class:`InMemoryStore` for the
    whole interface.
    """

    def load(self, node_id: str, key: str, limit: int = MAX_WINDOW) -> list[dict]:
        """The most recent ``limit`` entries of ``node_id`` under ``key``, oldest first.

        Raise any exception if the memory cannot be read: the node then fails with
        :class:`~agent.errors.MemoryStoreError` rather than run without memory.
        """
        ...


class InMemoryStore:
    """A dict-backed :class:`MemoryStore` for library use and tests.

    One instance holds memory for many agents; :meth:`for_agent` gives the view a
    canvas of one agent must get (pass it as ``services={"memory_store": view}``), so
    two agents never see each other's memory even with the same node ids and keys.

        store = InMemoryStore()
        canvas = Canvas(dsl, services={"memory_store": store.for_agent("agent-1")})
        events = list(canvas.run(query="hi", user_id="u1"))
        if events[-1]["event"] != "workflow_finished" or events[-1]["data"]["status"] == "succeeded":
            store.for_agent("agent-1").commit(canvas.memory_writes)

    Each (node, key) keeps its last :data:`MAX_WINDOW` entries: no window reads more.
    """

    def __init__(self, _data: dict | None = None, _scope: tuple[str, str] = ("", "")):
        self._data: dict[tuple, list[dict]] = {} if _data is None else _data
        self._scope = _scope

    def for_agent(self, agent_id: str, tenant_id: str = "") -> InMemoryStore:
        """The view of one (tenant, agent); views share this store's data."""
        return InMemoryStore(self._data, (tenant_id, agent_id))

    def load(self, node_id: str, key: str, limit: int = MAX_WINDOW) -> list[dict]:
        entries = self._data.get((*self._scope, node_id, key), [])
        return copy.deepcopy(entries[-limit:] if limit > 0 else [])

    def commit(self, writes: dict[tuple[str, str], list[dict]]) -> None:
        """Append a turn's ``canvas.memory_writes``."""
        for (node_id, key), entries in writes.items():
            kept = self._data.setdefault((*self._scope, node_id, key), [])
            kept.extend(copy.deepcopy(entries))
            del kept[: max(0, len(kept) - MAX_WINDOW)]

    def entries(self, key: str) -> dict[str, list[dict]]:
        """Every node's memory under ``key`` (what ``GET /agents/<id>/memory/<key>`` lists)."""
        return {
            k[2]: copy.deepcopy(v)
            for k, v in self._data.items()
            if k[:2] == self._scope and k[3] == key and v
        }

    def delete(self, key: str) -> int:
        """Forget ``key`` in every node; returns how many entries were removed."""
        gone = [k for k in self._data if k[:2] == self._scope and k[3] == key]
        return sum(len(self._data.pop(k)) for k in gone)


class NodeMemory:
    """The memory one node reads and writes during one run.

    Args:
        canvas: the running canvas.
        node_id: the node's id (a tool's id for an Agent used as a tool).
        key: the rendered memory key, or ``None`` for session memory.
        source: ``"node"`` (its own exchanges) or ``"conversation"`` (the session's
            user queries and final answers; read only).
    """

    def __init__(self, canvas: Canvas, node_id: str, key: str | None = None, source: str = "node"):
        self.canvas = canvas
        self.node_id = node_id
        self.key = key
        self.source = source

    def entries(self, window: int) -> list[dict]:
        """At least the last ``window`` entries, oldest first (validated)."""
        if window <= 0:
            return []
        if self.source == "conversation":
            return self._conversation(window)
        if self.key is None:
            entries = self.canvas.memory.get(self.node_id, [])
            if not isinstance(entries, list):
                raise MemoryStoreError(
                    f"{self.node_id}: the session memory in the snapshot is {type(entries).__name__}, "
                    f"not a list of messages; the snapshot is damaged (reset the session)"
                )
            return self._checked(entries[-window:], "the session memory")
        store = self.canvas.services.get("memory_store")
        if store is None:
            raise MemoryStoreError(
                f"{self.node_id}: memory_key is set but no memory store is configured; the host must pass "
                f"services={{'memory_store': ...}} (e.g. agent.memory.InMemoryStore) to the Canvas"
            )
        try:
            loaded = store.load(self.node_id, self.key, window)
        except Exception as e:  # noqa: BLE001 - any store failure fails the node loudly
            raise MemoryStoreError(
                f"{self.node_id}: cannot read memory for key {self.key!r}: {type(e).__name__}: {e}"
            ) from e
        if not isinstance(loaded, list):
            raise MemoryStoreError(
                f"{self.node_id}: the memory store returned {type(loaded).__name__} for key {self.key!r}, "
                f"not a list of messages"
            )
        pending = self.canvas.memory_writes.get((self.node_id, self.key), [])
        return self._checked(loaded, f"memory key {self.key!r}") + pending

    def append(self, user: str, assistant: str) -> None:
        """Remember one successful exchange."""
        if self.source == "conversation":
            return
        new = [make_entry("user", user), make_entry("assistant", assistant)]
        if self.key is None:
            kept = self.canvas.memory.setdefault(self.node_id, [])
            kept.extend(new)
            del kept[: max(0, len(kept) - MAX_WINDOW)]
        else:
            self.canvas.memory_writes.setdefault((self.node_id, self.key), []).extend(new)

    def _conversation(self, window: int) -> list[dict]:
        out = []
        for item in self.canvas.history[-window:]:
            if isinstance(item, dict):
                role, content = item.get("role"), item.get("content")
            elif isinstance(item, (list, tuple)) and len(item) == 2:
                role, content = item
            else:
                continue
            if role in ROLES and isinstance(content, str):
                # message_tokens is cached by text, so a long conversation is not re-counted.
                out.append({"role": role, "content": content, "tokens": message_tokens(content)})
        return out

    def _checked(self, entries: list, where: str) -> list[dict]:
        for i, e in enumerate(entries):
            if not isinstance(e, dict) or e.get("role") not in ROLES or not isinstance(e.get("content"), str):
                raise MemoryStoreError(
                    f"{self.node_id}: {where} holds a malformed message at position {i} ({str(e)[:80]!r}); "
                    f"expected {{'role': 'user'|'assistant', 'content': text}}"
                )
        return entries
