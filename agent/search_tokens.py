"""The one tokenizer of full-text search, and the BM25 formula, for every backend.

Datasets' chunks (and RAGFlow Memory messages) are indexed by the database's own
full-text index (SQLite FTS5, MySQL/MariaDB FULLTEXT, Postgres ``tsvector``); what
each index receives is the output of :func:`tokenize`, never the raw text, so that
every backend sees the same terms and a query finds the same chunks on all of them.

* Text is NFKC-normalised and lower-cased; a token is a run of letters and digits
  (``_`` and punctuation separate words: ``user_id`` is ``user``, ``id``).
* CJK text (Han, Hiragana, Katakana, Hangul) has no spaces: each run of it becomes
  its overlapping character bigrams (``知识库`` → ``知识``, ``识库``); a single CJK
  character stands alone.
* No stemming and no stop words: a query matches the words it contains.

Scores are BM25 (k1 = 1.2, b = 0.75, Lucene's idf), computed by :func:`bm25` from
the statistics the index reports, so the number does not depend on the backend;
:func:`bm25_reference` scales them to a similarity in [0, 1].
Pure Python, no database: ``agent`` imports nothing from ``api``.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable

K1 = 1.2
B = 0.75

_WORD = re.compile(r"[^\W_]+")
# Han (with extensions and compatibility ideographs), Hiragana, Katakana, Hangul.
_CJK = re.compile(
    "([\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\u1100-\u11ff\U00020000-\U0002ebef]+)"
)


def tokenize(text: str) -> list[str]:
    """The search terms of ``text``, in order, repeats kept (term frequency counts)."""
    if not text:
        return []
    text = unicodedata.normalize("NFKC", text).lower()
    out: list[str] = []
    for word in _WORD.findall(text):
        if not _CJK.search(word):
            out.append(word)
            continue
        for i, part in enumerate(_CJK.split(word)):
            if not part:
                continue
            if i % 2 == 0:  # between CJK runs: a latin word or digits
                out.append(part)
            elif len(part) == 1:
                out.append(part)
            else:
                out.extend(part[j : j + 2] for j in range(len(part) - 1))
    return out


def query_terms(text: str) -> list[str]:
    """The distinct terms of a query, in first-seen order."""
    return list(dict.fromkeys(tokenize(text)))


def idf(documents: int, frequency: int) -> float:
    """Lucene's BM25 idf: ``ln(1 + (N - df + 0.5) / (df + 0.5))`` (never negative)."""
    return math.log(1.0 + (documents - frequency + 0.5) / (frequency + 0.5))


def bm25(
    terms: Iterable[str],
    term_counts: dict[str, int],
    length: int,
    average_length: float,
    frequencies: dict[str, int],
    documents: int,
) -> float:
    """The BM25 score of one document for the query ``terms``.

    Args:
        terms: the distinct query terms.
        term_counts: how often each term occurs in the document.
        length: the document's length in terms.
        average_length: the mean length over the searched documents.
        frequencies: in how many searched documents each term occurs.
        documents: how many documents are searched.
    """
    norm = K1 * (1 - B + B * length / (average_length or 1.0))
    score = 0.0
    for term in terms:
        tf = term_counts.get(term, 0)
        if tf:
            score += idf(documents, frequencies.get(term, 0)) * tf * (K1 + 1) / (tf + norm)
    return score


def bm25_reference(terms: Iterable[str], frequencies: dict[str, int], documents: int) -> float:
    """The score of a document of average length that holds each query term once.

    A score divided by this (capped at 1) is a term similarity that does not depend
    on the other documents found, and reads like RAGFlow's: the share of the query's
    weight the document covers. A document with every query term scores 1.
    """
    return sum(idf(documents, frequencies.get(t, 0)) for t in terms)
