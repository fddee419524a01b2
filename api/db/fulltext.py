"""The full-text index: tokens of :mod:`agent.search_tokens`, kept by the database's own index.

One table, ``fulltext_entry``, holds every indexed item of every kind: a **scope**
names the kind (``"chunk"`` for dataset chunks, ``"memory"`` for RAGFlow Memory
messages), a **group** is what a search is limited to (a dataset id, a memory id),
and an **item** is the thing found (a chunk id, a message id). Its ``terms`` column
holds the item's tokens joined by spaces, each encoded by the backend so that its
full-text index keeps it as one word; the database's own index does the matching:

* SQLite: an FTS5 table over ``fulltext_entry`` (external content, kept in step here);
* MySQL/MariaDB: a ``FULLTEXT`` index on ``terms``; tokens are written ``t_<token>`` so
  that none is shorter than ``innodb_ft_min_token_size`` or on the stop-word list;
* PostgreSQL: a GIN index on ``to_tsvector('simple', terms)``; tokens are written as
  ``t<hex of their UTF-8>`` so that the text-search parser keeps each one whole (it
  would split ``a-b`` or CJK text). CockroachDB and YugabyteDB have the same index.

Use::

    index = FullTextIndex("chunk")
    with write_transaction():                      # the caller's transaction
        index.add(dataset_id, [(chunk_id, text), ...])
        index.remove([chunk_id, ...])
    hits = index.search([dataset_id], "how do I parse a pdf", limit=1024)
    # [Hit(item_id, group_id, score, term_similarity), ...] best first

Ranking is the same on every backend: the database's index picks up to ``limit``
candidates that hold at least one query term (by its own relevance), then each is
scored by BM25 (:func:`agent.search_tokens.bm25`) with document frequencies,
document count and average length counted over the searched groups. Everything
that differs between backends is in the :class:`_Backend` subclasses at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from peewee import Database, fn

from agent.search_tokens import bm25, bm25_reference, query_terms, tokenize
from api.db.database import db, insert_rows, is_postgres, is_sqlite
from api.db.models import FullTextEntry

#: Items added per INSERT statement.
BATCH = 500
_COLUMNS = ("scope", "group_id", "item_id", "length", "terms")


@dataclass(frozen=True)
class Hit:
    """A found item: its BM25 ``score`` and ``term_similarity`` (the score scaled to [0, 1],
    see :func:`agent.search_tokens.bm25_reference`)."""

    item_id: str
    group_id: str
    score: float
    term_similarity: float


class FullTextIndex:
    """The index of one scope (see the module docstring). Cheap to make; holds no state."""

    def __init__(self, scope: str):
        if not scope or len(scope) > 32:
            raise ValueError(f"scope {scope!r} must be 1-32 characters")
        self.scope = scope

    def add(self, group_id: str, items: Iterable[tuple[str, str]]) -> None:
        """Index ``(item_id, text)`` pairs under ``group_id`` (in the caller's transaction)."""
        self.add_tokens(group_id, ((item_id, tokenize(text)) for item_id, text in items))

    def add_tokens(self, group_id: str, items: Iterable[tuple[str, Sequence[str]]]) -> None:
        """Index ``(item_id, tokens)`` pairs already tokenized with :func:`agent.search_tokens.tokenize`."""
        backend = _backend()
        rows = [
            {
                "scope": self.scope,
                "group_id": group_id,
                "item_id": item_id,
                "length": len(tokens),
                "terms": " ".join(backend.encode(t) for t in tokens),
            }
            for item_id, tokens in items
        ]
        for start in range(0, len(rows), BATCH):
            backend.insert(rows[start : start + BATCH])

    def remove(self, item_ids: Iterable[str]) -> None:
        """Drop the entries of these items (in the caller's transaction)."""
        ids = list(item_ids)
        for start in range(0, len(ids), BATCH):
            part = ids[start : start + BATCH]
            _backend().delete((FullTextEntry.scope == self.scope) & FullTextEntry.item_id.in_(part))

    def remove_groups(self, group_ids: Iterable[str]) -> None:
        """Drop every entry of these groups (a deleted dataset)."""
        groups = list(group_ids)
        if groups:
            _backend().delete((FullTextEntry.scope == self.scope) & FullTextEntry.group_id.in_(groups))

    def search(self, group_ids: Sequence[str], query: str | Sequence[str], limit: int = 1024) -> list[Hit]:
        """The items of ``group_ids`` holding any term of ``query``, best BM25 first (at most ``limit``)."""
        terms = query_terms(query) if isinstance(query, str) else list(dict.fromkeys(query))
        groups = list(dict.fromkeys(group_ids))
        if not terms or not groups or limit <= 0:
            return []
        backend = _backend()
        candidates = backend.candidates(self.scope, groups, terms, limit)
        if not candidates:
            return []
        documents, total_length = backend.totals(self.scope, groups)
        frequencies = {t: backend.frequency(self.scope, groups, t) for t in terms}
        average = total_length / documents if documents else 1.0
        reference = bm25_reference(terms, frequencies, documents) or 1.0
        # Terms are stored space-separated: with every space doubled, each occurrence of a
        # term is its own " term " (counted in C, without splitting every candidate).
        padded = [(t, f" {backend.encode(t)} ") for t in terms]
        hits = []
        for item_id, group_id, length, stored in candidates:
            text = " " + stored.replace(" ", "  ") + " "
            counts = {t: text.count(p) for t, p in padded}
            score = bm25(terms, counts, length, average, frequencies, documents)
            if score > 0:
                hits.append(Hit(item_id, group_id, score, min(score / reference, 1.0)))
        hits.sort(key=lambda h: (-h.score, h.item_id))
        return hits


def create_schema(database: Database) -> None:
    """Create the entry table and the backend's index if missing (a migration)."""
    _backend_for(database).create(database)


# ---------------------------------------------------------------------- backends
class _Backend:
    """What differs between databases. Every method runs on the bound database ``db``."""

    def encode(self, token: str) -> str:
        """The word the full-text index keeps for ``token``."""
        return token

    def create(self, database: Database) -> None:
        raise NotImplementedError

    def insert(self, rows: list[dict]) -> None:
        insert_rows("fulltext_entry", _COLUMNS, [tuple(r[c] for c in _COLUMNS) for r in rows])

    def delete(self, where) -> None:  # noqa: ANN001 - a peewee expression
        FullTextEntry.delete().where(where).execute()

    def candidates(
        self, scope: str, groups: list[str], terms: list[str], limit: int
    ) -> list[tuple[str, str, int, str]]:
        """``(item_id, group_id, length, terms)`` of up to ``limit`` items matching any term."""
        raise NotImplementedError

    def frequency(self, scope: str, groups: list[str], term: str) -> int:
        """In how many items of ``groups`` ``term`` occurs."""
        raise NotImplementedError

    def totals(self, scope: str, groups: list[str]) -> tuple[int, int]:
        """``(items, sum of their lengths)`` in ``groups``."""
        row = (
            FullTextEntry.select(fn.COUNT(FullTextEntry.id), fn.SUM(FullTextEntry.length))
            .where((FullTextEntry.scope == scope) & FullTextEntry.group_id.in_(groups))
            .tuples()
            .first()
        )
        return int(row[0] or 0), int(row[1] or 0)


class _Sqlite(_Backend):
    """FTS5 with external content: ``fulltext_fts`` indexes ``fulltext_entry``'s columns."""

    def create(self, database: Database) -> None:
        FullTextEntry.create_table(safe=True)
        database.execute_sql(
            "CREATE VIRTUAL TABLE IF NOT EXISTS fulltext_fts USING fts5("
            "scope, group_id, terms, content='fulltext_entry', content_rowid='id', "
            "tokenize=\"unicode61 remove_diacritics 0 tokenchars '_-'\")"
        )

    def insert(self, rows: list[dict]) -> None:
        super().insert(rows)
        # External content: tell FTS5 about the new rows (item ids are unique in a scope).
        marks = ", ".join("?" * len(rows))
        db.execute_sql(
            "INSERT INTO fulltext_fts (rowid, scope, group_id, terms) SELECT id, scope, group_id, terms "
            f"FROM fulltext_entry WHERE scope = ? AND item_id IN ({marks})",
            (rows[0]["scope"], *(r["item_id"] for r in rows)),
        )

    def delete(self, where) -> None:  # noqa: ANN001
        rows = list(
            FullTextEntry.select(
                FullTextEntry.id, FullTextEntry.scope, FullTextEntry.group_id, FullTextEntry.terms
            )
            .where(where)
            .tuples()
        )
        for row in rows:
            # External content: FTS5 forgets a row when told its old values.
            db.execute_sql(
                "INSERT INTO fulltext_fts (fulltext_fts, rowid, scope, group_id, terms) "
                "VALUES ('delete', ?, ?, ?, ?)",
                row,
            )
        ids = [r[0] for r in rows]
        for start in range(0, len(ids), BATCH):
            FullTextEntry.delete().where(FullTextEntry.id.in_(ids[start : start + BATCH])).execute()

    @staticmethod
    def _match(scope: str, groups: list[str], terms: list[str], any_term: bool = True) -> str:
        def quoted(value: str) -> str:
            return '"' + value.replace('"', '""') + '"'

        words = (" OR " if any_term else " AND ").join(quoted(t) for t in terms)
        group_part = " OR ".join(quoted(g) for g in groups)
        return f"scope : {quoted(scope)} AND group_id : ({group_part}) AND terms : ({words})"

    def candidates(self, scope, groups, terms, limit):
        cursor = db.execute_sql(
            "SELECT e.item_id, e.group_id, e.length, e.terms FROM fulltext_entry e JOIN ("
            " SELECT rowid AS id FROM fulltext_fts WHERE fulltext_fts MATCH ?"
            " ORDER BY bm25(fulltext_fts, 0.0, 0.0, 1.0) LIMIT ?) f ON f.id = e.id",
            (self._match(scope, groups, terms), limit),
        )
        return [(r[0], r[1], int(r[2]), r[3]) for r in cursor.fetchall()]

    def frequency(self, scope, groups, term):
        cursor = db.execute_sql(
            "SELECT COUNT(*) FROM fulltext_fts WHERE fulltext_fts MATCH ?",
            (self._match(scope, groups, [term]),),
        )
        return int(cursor.fetchone()[0])


class _Mysql(_Backend):
    """InnoDB ``FULLTEXT`` on ``terms``; groups filtered by the ``(scope, group_id)`` index."""

    def encode(self, token: str) -> str:
        return "t_" + token

    def create(self, database: Database) -> None:
        FullTextEntry.create_table(safe=True)
        names = {i.name for i in database.get_indexes(FullTextEntry._meta.table_name)}
        if "fulltext_entry_terms_ft" not in names:
            database.execute_sql("CREATE FULLTEXT INDEX fulltext_entry_terms_ft ON fulltext_entry (terms)")

    def _where(self, groups: list[str]) -> tuple[str, list]:
        marks = ", ".join(["%s"] * len(groups))
        return f"scope = %s AND group_id IN ({marks})", groups

    def candidates(self, scope, groups, terms, limit):
        where, params = self._where(groups)
        words = " ".join(self.encode(t) for t in terms)
        cursor = db.execute_sql(
            f"SELECT item_id, group_id, length, terms FROM fulltext_entry WHERE {where} "
            f"AND MATCH(terms) AGAINST (%s IN NATURAL LANGUAGE MODE) "
            f"ORDER BY MATCH(terms) AGAINST (%s IN NATURAL LANGUAGE MODE) DESC LIMIT %s",
            [scope, *params, words, words, limit],
        )
        return [(r[0], r[1], int(r[2]), r[3]) for r in cursor.fetchall()]

    def frequency(self, scope, groups, term):
        where, params = self._where(groups)
        cursor = db.execute_sql(
            f"SELECT COUNT(*) FROM fulltext_entry WHERE {where} AND MATCH(terms) AGAINST (%s IN BOOLEAN MODE)",
            [scope, *params, "+" + self.encode(term)],
        )
        return int(cursor.fetchone()[0])


class _Postgres(_Backend):
    """A GIN index on ``to_tsvector('simple', terms)``; groups filtered by the ``(scope, group_id)`` index."""

    VECTOR = "to_tsvector('simple', terms)"

    def encode(self, token: str) -> str:
        return "t" + token.encode("utf-8").hex()

    def create(self, database: Database) -> None:
        FullTextEntry.create_table(safe=True)
        database.execute_sql(
            f"CREATE INDEX IF NOT EXISTS fulltext_entry_terms_gin ON fulltext_entry USING GIN ({self.VECTOR})"
        )

    def _where(self, groups: list[str]) -> tuple[str, list]:
        marks = ", ".join(["%s"] * len(groups))
        return f"scope = %s AND group_id IN ({marks})", groups

    def candidates(self, scope, groups, terms, limit):
        where, params = self._where(groups)
        query = " | ".join(self.encode(t) for t in terms)
        cursor = db.execute_sql(
            f"SELECT item_id, group_id, length, terms FROM fulltext_entry WHERE {where} "
            f"AND {self.VECTOR} @@ to_tsquery('simple', %s) "
            f"ORDER BY ts_rank({self.VECTOR}, to_tsquery('simple', %s)) DESC LIMIT %s",
            [scope, *params, query, query, limit],
        )
        return [(r[0], r[1], int(r[2]), r[3]) for r in cursor.fetchall()]

    def frequency(self, scope, groups, term):
        where, params = self._where(groups)
        cursor = db.execute_sql(
            f"SELECT COUNT(*) FROM fulltext_entry WHERE {where} AND {self.VECTOR} @@ to_tsquery('simple', %s)",
            [scope, *params, self.encode(term)],
        )
        return int(cursor.fetchone()[0])


def _backend_for(database) -> _Backend:  # noqa: ANN001 - a Database or the proxy
    if is_sqlite(database):
        return _SQLITE
    return _POSTGRES if is_postgres(database) else _MYSQL


def _backend() -> _Backend:
    return _backend_for(db)


_SQLITE = _Sqlite()
_MYSQL = _Mysql()
_POSTGRES = _Postgres()
