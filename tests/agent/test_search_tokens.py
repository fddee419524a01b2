"""The search tokenizer and BM25: the same terms for every backend."""

from __future__ import annotations

from agent.search_tokens import bm25, bm25_reference, query_terms, tokenize


def test_words_are_lower_cased_letters_and_digits():
    assert tokenize("Hello, World! user_id=42 Ｆｕｌｌ-width café") == [
        "hello",
        "world",
        "user",
        "id",
        "42",
        "full",
        "width",
        "café",
    ]


def test_cjk_runs_become_overlapping_bigrams_and_latin_inside_stays_a_word():
    assert tokenize("知识库检索") == ["知识", "识库", "库检", "检索"]
    assert tokenize("用PDF文件") == ["用", "pdf", "文件"]
    assert tokenize("한국어") == ["한국", "국어"]
    assert tokenize("") == []


def test_query_terms_are_distinct_in_order():
    assert query_terms("the cat and the hat") == ["the", "cat", "and", "hat"]


def test_bm25_prefers_rarer_terms_and_shorter_documents():
    freqs = {"rare": 1, "common": 90}
    rare = bm25(["rare", "common"], {"rare": 1}, 10, 10.0, freqs, 100)
    common = bm25(["rare", "common"], {"common": 1}, 10, 10.0, freqs, 100)
    assert rare > common > 0
    short = bm25(["rare"], {"rare": 1}, 5, 10.0, freqs, 100)
    long = bm25(["rare"], {"rare": 1}, 50, 10.0, freqs, 100)
    assert short > long
    # Every term once at average length: the reference score.
    once = bm25(["rare", "common"], {"rare": 1, "common": 1}, 10, 10.0, freqs, 100)
    assert abs(once / bm25_reference(["rare", "common"], freqs, 100) - 1) < 1e-9
