"""The full-text index (api.db.fulltext) ranks the same items on SQLite, MariaDB and Postgres."""

from __future__ import annotations

import pytest

from api.db import db, init_database, write_transaction
from api.db.fulltext import FullTextIndex

DOCS = {
    "a": "Parsing a PDF document: the text layer is read page by page.",
    "b": "The retrieval component searches datasets and returns chunks.",
    "c": "Chunks are made by the naive method: split on delimiters, merged by tokens.",
    "d": "知识库检索：数据集的文本块按相关性排序。",
    "e": "PDF PDF PDF: a document about PDF files and nothing else.",
}


@pytest.fixture
def index(database_url):
    init_database(database_url, max_connections=4)
    with db.connection_context():
        index = FullTextIndex("chunk")
        with write_transaction():
            index.add("g1", DOCS.items())
            index.add("g2", [("z", "a PDF in another group")])
        yield index


def ids(hits):
    return [h.item_id for h in hits]


def test_search_ranks_by_bm25_within_the_groups_asked(index):
    hits = index.search(["g1"], "pdf document")
    assert ids(hits) == ["e", "a"]
    assert hits[0].score > hits[1].score > 0
    assert hits[0].term_similarity == hits[1].term_similarity == 1  # both hold every term
    assert ids(index.search(["g1", "g2"], "pdf")) == ["e", "z", "a"]
    assert ids(index.search(["g2"], "chunks")) == []
    assert index.search(["g1"], "") == []


def test_cjk_query_finds_by_bigrams(index):
    assert ids(index.search(["g1"], "知识库")) == ["d"]
    assert ids(index.search(["g1"], "检索数据")) == ["d"]


def test_short_and_stop_words_are_found_on_every_backend(index):
    # MariaDB's own parser drops words under 3 characters and "the", "a", "is"...
    assert set(ids(index.search(["g1"], "a"))) == {"a", "e"}
    assert "c" in ids(index.search(["g1"], "by"))


def test_removed_items_and_groups_are_not_found(index):
    with write_transaction():
        index.remove(["e"])
    assert ids(index.search(["g1"], "pdf")) == ["a"]
    with write_transaction():
        index.remove_groups(["g1"])
    assert ids(index.search(["g1", "g2"], "pdf")) == ["z"]


def test_limit_caps_the_candidates(index):
    assert len(index.search(["g1"], "the", limit=1)) == 1


def test_repeated_terms_count_each_time(index):
    with write_transaction():
        index.add("g3", [("once", "zebra and more words here"), ("twice", "zebra zebra and more words")])
    assert ids(index.search(["g3"], "zebra")) == ["twice", "once"]
