"""RAGFlow's ``naive`` chunking: split on delimiters, merge to about N tokens.

    chunks = naive_chunks(["first section...", "second..."], chunk_token_num=512, delimiter="\\n")

* Each section (a page, a paragraph block: what the parser gives) is split after
  every delimiter. ``delimiter`` is a string of single-character delimiters; a
  multi-character delimiter is written between backticks (``"\\n`##`"``), as in RAGFlow.
* Consecutive pieces are merged while the chunk stays within ``chunk_token_num``
  tokens (``cl100k_base``); small sections share a chunk, so a short page or
  paragraph does not become a tiny chunk of its own.
* A piece longer than the limit is cut between words (whitespace), and text with no
  spaces (CJK) between characters: never inside a word.

The result is deterministic: the same text and settings give the same chunks, in
the same order (a parse resumed by another worker relies on it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from agent.llm.tokens import encoding

DEFAULT_CHUNK_TOKENS = 512
DEFAULT_DELIMITER = "\n"
MAX_CHUNK_TOKENS = 8192


def _delimiter_pattern(delimiter: str) -> re.Pattern:
    multi = re.findall(r"`([^`]+)`", delimiter or "")
    single = re.sub(r"`[^`]+`", "", delimiter or "")
    options = sorted({*multi, *single}, key=len, reverse=True)
    if not options:
        options = [DEFAULT_DELIMITER]
    return re.compile("(" + "|".join(re.escape(o) for o in options) + ")")


def _tokens(text: str) -> int:
    return len(encoding().encode(text, disallowed_special=())) if text else 0


def _split_long(piece: str, limit: int) -> list[str]:
    """Cut ``piece`` into parts of at most ``limit`` tokens, between words."""
    words = re.findall(r"\S+\s*|\s+", piece)
    parts: list[str] = []
    current: list[str] = []
    size = 0
    for word in words:
        n = _tokens(word)
        if n > limit:
            # One "word" longer than a chunk (CJK text, a long URL): cut between characters.
            if current:
                parts.append("".join(current))
                current, size = [], 0
            text = word
            while text:
                cut = _longest_prefix(text, limit)
                parts.append(text[:cut])
                text = text[cut:]
            continue
        if current and size + n > limit:
            parts.append("".join(current))
            current, size = [], 0
        current.append(word)
        size += n
    if current:
        parts.append("".join(current))
    return parts


def _longest_prefix(text: str, limit: int) -> int:
    """The length of the longest prefix of ``text`` within ``limit`` tokens (at least 1 character)."""
    low, high = 1, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if _tokens(text[:mid]) <= limit:
            low = mid
        else:
            high = mid - 1
    return low


def naive_chunks(
    sections: Iterable[str], chunk_token_num: int = DEFAULT_CHUNK_TOKENS, delimiter: str = DEFAULT_DELIMITER
) -> list[str]:
    """The chunks of ``sections`` (see the module docstring); blank chunks are dropped."""
    limit = max(1, min(int(chunk_token_num or DEFAULT_CHUNK_TOKENS), MAX_CHUNK_TOKENS))
    pattern = _delimiter_pattern(delimiter)
    chunks: list[str] = []
    current: list[str] = []
    size = 0

    def flush() -> None:
        nonlocal current, size
        text = "".join(current).strip()
        if text:
            chunks.append(text)
        current, size = [], 0

    for section in sections:
        if not section or not section.strip():
            continue
        parts = pattern.split(section)
        # Keep each delimiter with the piece it ends.
        pieces = ["".join(parts[i : i + 2]) for i in range(0, len(parts), 2)]
        for piece in pieces:
            if not piece.strip():
                if current:
                    current.append(piece)
                continue
            n = _tokens(piece)
            if n > limit:
                flush()
                for part in _split_long(piece, limit):
                    current, size = [part], _tokens(part)
                    flush()
                continue
            if current and size + n > limit:
                flush()
            current.append(piece)
            size += n
        if current and not current[-1].endswith("\n"):
            current.append("\n")
    flush()
    return chunks


def token_count(text: str) -> int:
    """Tokens of a chunk's text (``cl100k_base``)."""
    return _tokens(text)
