"""Compaction of an LLM-backed node's memory (docs/design.md §15), as Dify 1.17 does for agents.

A node with ``compaction: true`` (or ``{"max_summary_tokens": N}``, default 500) does
not simply forget what its window or token budget drops: the model summarises the
dropped messages, with the summary so far, into a **running summary** that is sent as
a system message before the history and kept in the node's memory (the snapshot's
``memory["<node id>#summary"]``). The summarised messages then leave the memory.

* A summary is made only by a successful call; a failed summary call leaves memory
  and summary as they were and the node answers with the plain window.
* The summary is bounded: the call asks for at most ``max_summary_tokens`` and the
  text is cut to that many tokens whatever the model returns.
* Its tokens count in the node's usage like any other call.
* When it compacts, it summarises the dropped messages and the older half of what
  would still fit, so that the next turns fit without another summary call.
* Within one run, when tool rounds fill the context, old tool results are cleared
  first (the most recent round's are kept): see :func:`clear_old_tool_results`.

Only the node's session memory is compacted (not ``memory_key``, not
``history_source: "conversation"``: those are refused at load time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent.llm.tokens import count_tokens, message_tokens, messages_tokens, truncate_tokens

DEFAULT_MAX_SUMMARY_TOKENS = 500
MAX_SUMMARY_TOKENS = 8000
SUMMARY_SUFFIX = "#summary"
SUMMARY_INTRO = "Summary of the earlier conversation:\n"
CLEARED = "[tool result cleared to save context: {tokens} tokens]"
_INSTRUCTION = (
    "You keep a running summary of a conversation. Merge the summary so far and the new messages into "
    "one summary of at most {limit} tokens. Keep names, facts, numbers, decisions, the user's preferences "
    "and open questions; leave out greetings and repetition. Answer with the summary only."
)


def parse_setting(value: Any) -> int | None:
    """``compaction`` as its ``max_summary_tokens`` (``None``: off); ``ValueError`` says what is wrong."""
    if value in (None, False, "", {}):
        return None
    if value is True:
        return DEFAULT_MAX_SUMMARY_TOKENS
    if isinstance(value, dict):
        unknown = set(value) - {"max_summary_tokens"}
        if unknown:
            raise ValueError(
                f"compaction takes only 'max_summary_tokens'; unknown: {', '.join(sorted(unknown))}"
            )
        limit = value.get("max_summary_tokens", DEFAULT_MAX_SUMMARY_TOKENS)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SUMMARY_TOKENS:
            raise ValueError(
                f"compaction.max_summary_tokens must be a whole number from 1 to {MAX_SUMMARY_TOKENS}, got {limit!r}"
            )
        return limit
    raise ValueError(f"compaction must be true, false or {{'max_summary_tokens': N}}, got {value!r}")


def summary_key(node_id: str) -> str:
    return node_id + SUMMARY_SUFFIX


def stored_summary(memory: dict, node_id: str) -> str:
    """The node's running summary in the snapshot's memory ('' when none)."""
    kept = memory.get(summary_key(node_id))
    if isinstance(kept, list) and kept and isinstance(kept[0], dict):
        return str(kept[0].get("content") or "")
    return ""


def summary_messages(summary: str) -> list[dict]:
    """What goes before the history: the summary as one system message (none when empty)."""
    return [{"role": "system", "content": SUMMARY_INTRO + summary}] if summary else []


def split_for_summary(entries: Sequence[dict], kept: int) -> int:
    """How many of the oldest ``entries`` to summarise when only the last ``kept`` fit.

    The older half of what fits goes too (so the next turns fit without another
    summary), and what stays starts with a user message.
    """
    cut = len(entries) - kept // 2
    while cut < len(entries) and entries[cut].get("role") != "user":
        cut += 1
    return min(cut, len(entries))


def summary_request(summary: str, entries: Sequence[dict], limit: int) -> list[dict]:
    """The messages that ask the model for the new running summary."""
    lines = [f"{e['role']}: {e['content']}" for e in entries]
    parts = []
    if summary:
        parts.append("Summary so far:\n" + summary)
    parts.append("New messages:\n" + "\n".join(lines))
    return [
        {"role": "system", "content": _INSTRUCTION.format(limit=limit)},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def bounded(text: str, limit: int) -> str:
    return truncate_tokens(text.strip(), limit)


def apply(memory: dict, node_id: str, summarised: int, summary: str) -> None:
    """Keep ``summary`` and drop the ``summarised`` oldest entries of the node's memory."""
    kept = memory.get(node_id)
    if isinstance(kept, list):
        del kept[:summarised]
    memory[summary_key(node_id)] = [
        {"role": "assistant", "content": summary, "tokens": message_tokens(summary)}
    ]


def clear_old_tool_results(messages: list[dict], limit: int) -> int:
    """Replace the oldest tool results by a short note until ``messages`` fit ``limit`` tokens.

    The results of the most recent round (the tool messages after the last assistant
    message) are kept. Returns how many results were cleared.
    """
    total = messages_tokens(messages)
    if total <= limit:
        return 0
    last_call = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    cleared = 0
    for i, message in enumerate(messages[:last_call]):
        if total <= limit:
            break
        if message.get("role") != "tool" or str(message.get("content", "")).startswith(
            "[tool result cleared"
        ):
            continue
        before = count_tokens(str(message.get("content") or ""))
        note = CLEARED.format(tokens=before)
        messages[i] = {**message, "content": note}
        total -= before - count_tokens(note)
        cleared += 1
    return cleared
