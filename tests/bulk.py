"""Many rows at once, straight into the tables (for the retention test and bench/history.py).

peewee builds an ``INSERT`` of 10,000 rows slowly (a value object per cell); this
sends one prepared statement with ``executemany``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from peewee import Model

from api.db import MessageLog, Session, db, update_mark


def insert_rows(model: type[Model], rows: Sequence[dict]) -> None:
    """Insert ``rows`` (column → value; the model's defaults fill the rest) in one transaction."""
    database = db.obj
    fields = [f for f in model._meta.sorted_fields if not (f.primary_key and f.name not in rows[0])]
    defaults = {f.name: (f.default() if callable(f.default) else f.default) for f in fields}
    quote = database.quote
    columns = ", ".join(f"{quote[0]}{f.column_name}{quote[1]}" for f in fields)
    table = f"{quote[0]}{model._meta.table_name}{quote[1]}"
    sql = f"INSERT INTO {table} ({columns}) VALUES ({', '.join([database.param] * len(fields))})"
    values = [tuple(f.db_value(row.get(f.name, defaults[f.name])) for f in fields) for row in rows]
    with database.atomic():
        database.cursor().executemany(sql, values)


def idle_sessions(tenant_id: str, agent_id: str, version_id: str, count: int, when: int) -> list[str]:
    """``count`` sessions of the agent last used at ``when`` (ms), each with one message."""
    ids = [uuid.uuid4().hex for _ in range(count)]
    for start in range(0, count, 2000):
        part = ids[start : start + 2000]
        insert_rows(
            Session,
            [
                {
                    "id": sid,
                    "tenant_id": tenant_id,
                    "agent_id": agent_id,
                    "agent_version_id": version_id,
                    "create_time": when,
                    "update_time": when,
                    "update_mark": update_mark(when),
                    "expiry_mark": when,
                }
                for sid in part
            ],
        )
        insert_rows(
            MessageLog,
            [{"session_id": sid, "role": "assistant", "content": "Hi!", "create_time": when} for sid in part],
        )
    return ids
