"""What the parts of ours' turn cost: ours with one part switched off, side by side.

Each subject plays the intake form's pause/resume conversation (two requests a turn, as
``bench/turns.py``) on its own SQLite file: ours as it is, ours with one part of its
turn switched off (below), and ``floor sqlite + canvas`` (bench/turns.py), the least a
turn running this canvas costs. They play **by blocks** of ``--block`` turns (20), in an
order drawn anew each round, for ``--rounds`` rounds (60), each block timed in this
process's CPU time (every thread's: ours' checkpoint thread counts). Printed: each
subject's median CPU per pause+resume turn, and the median over rounds of its ratio to
ours as it is in the same round. By blocks, not turn by turn: a part's cost is a few
percent, smaller than what the cache misses a turn pays after another subject's
(bench/turns.py) move a single turn by; within a block, a subject's turns follow each
other, as a server's do.

The parts, each switched off for its own subject only while that subject plays (the
switch is this script's, not a setting: every one of them is something a user relies on):

* **message log**: the two rows a turn adds to the session's transcript (what
  ``GET .../sessions/<id>/messages`` and RAGFlow's session listing show): neither made
  nor written;
* **message log INSERT**: the rows made, the ``INSERT`` not run;
* **message log index**: the ``(session_id, id)`` index that finds a session's
  messages, dropped from that subject's database;
* **telemetry**: the turn's metrics, log context and (here disabled anyway) span.

``--page`` also measures, on a bare SQLite file with the same settings, what one more
page written by a transaction costs: a transaction updating a 6 KB row, against the same
with a second small row updated on a page of its own, and with two message rows
appended (with and without an index on them).

    .venv/bin/python bench/service_parts.py [--block 20] [--rounds 60] [--synchronous normal] [--page]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable

from _path import load_bench

turns = load_bench("turns")  # bench/turns.py's subjects

from api.services import turns as service  # noqa: E402


class _NoObserver:
    """A turn observer that observes nothing (telemetry.TurnObserver's interface)."""

    def __init__(self, *args: object):
        pass

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

    def active(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def lease_taken(self) -> None:
        pass

    def finish(self, outcome: str | None) -> None:
        pass


_NO_TELEMETRY = types.SimpleNamespace(
    TurnObserver=_NoObserver,
    metrics=lambda: types.SimpleNamespace(
        canvas_cache=types.SimpleNamespace(adder=lambda _name: lambda _n: None)
    ),
)


def _swap(owner: object, name: str, value: object) -> Callable[[], None]:
    """Set ``owner.name`` to ``value``; returns what sets it back."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    return lambda: setattr(owner, name, old)


def _no_log() -> Callable[[], None]:
    return _swap(service, "_log_rows", lambda *args: (None, 0))


def _no_insert() -> Callable[[], None]:
    statement = service._APPEND_EXCHANGE
    statement.send = lambda *args, **named: None  # the instance's, over the class's method
    return lambda: delattr(statement, "send")  # the class's again


def _no_telemetry() -> Callable[[], None]:
    return _swap(service, "telemetry", _NO_TELEMETRY)


def _drop_log_index(subject: turns.Ours) -> None:
    with subject.app.app_context():
        names = subject.database.execute_sql(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'message_log'"
            " AND sql IS NOT NULL"
        ).fetchall()
        if not names:
            sys.exit("the message log has no index to drop: this script needs updating")
        for (name,) in names:
            subject.database.execute_sql(f'DROP INDEX "{name}"')


def play(args: argparse.Namespace, tmp: str) -> None:
    sync = args.synchronous
    # subject -> the switch that turns its part off for one of its blocks (and returns what turns it on)
    switches: dict[str, Callable[[], Callable[[], None]] | None] = {
        "ours": None,
        "ours, no message log": _no_log,
        "ours, no message log INSERT": _no_insert,
        "ours, no message log index": None,
        "ours, no telemetry": _no_telemetry,
    }
    subjects: dict[str, object] = {
        name: turns.Ours(f"sqlite:///{tmp}/ours-{i}.db?synchronous={sync}") for i, name in enumerate(switches)
    }
    _drop_log_index(subjects["ours, no message log index"])
    subjects["floor sqlite + canvas"] = turns.FloorCanvas(f"sqlite:///{tmp}/floorc.db", sync)
    for subject in subjects.values():
        subject.warm(args.warmup)
    cpu: dict[str, list[float]] = {name: [] for name in subjects}
    rng = random.Random(args.seed)
    for r in range(args.rounds):
        for name in rng.sample(list(subjects), len(subjects)):
            switch = switches.get(name)
            restore = switch() if switch else None
            try:
                first = 1 + r * args.block
                start = time.process_time()
                for i in range(first, first + args.block):
                    subjects[name].turn(i)
                cpu[name].append((time.process_time() - start) / args.block)
            finally:
                if restore:
                    restore()
    for subject in subjects.values():
        subject.close()
    print(
        f"\nSQLite WAL, synchronous={sync.upper()}, by blocks of {args.block} turns, {args.rounds} rounds:"
        " CPU ms per pause+resume turn, median; its ratio to ours in the same round,"
        " median [25th–75th percentile]"
    )
    for name, times in cpu.items():
        ratios = [t / base for t, base in zip(times, cpu["ours"], strict=True)]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        print(
            f"  {name:<30}{statistics.median(times) * 1000:8.3f} ms"
            f"{statistics.median(ratios):10.3f} [{q1:.3f}–{q3:.3f}]"
        )


def page_cost(args: argparse.Namespace, tmp: str) -> None:
    """Microseconds of CPU per transaction on a bare SQLite file: one more page written."""
    session = "68aa9da808884fecb4095517bed4d89a"
    message = (session, 1, "user", "sign me up 12", "68aa9da8-0888-4fec-bdd8-71f4579b799b", None, 0, 1)
    append = (
        "INSERT INTO m (session_id, round, role, content, message_id, meta, abandoned, create_time)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?), (?, ?, ?, ?, ?, ?, ?, ?)"
    )

    def database(name: str, index: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(os.path.join(tmp, name), isolation_level=None)
        conn.execute("PRAGMA journal_mode=wal")
        conn.execute(f"PRAGMA synchronous={args.synchronous}")
        conn.execute("CREATE TABLE s (id TEXT PRIMARY KEY, v INTEGER, snapshot BLOB)")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER)")
        conn.execute(
            "CREATE TABLE m (id INTEGER NOT NULL PRIMARY KEY, session_id VARCHAR(32) NOT NULL,"
            " round INTEGER, role VARCHAR(16), content TEXT, message_id VARCHAR(64), meta TEXT,"
            " abandoned INTEGER, create_time INTEGER)"
        )
        if index:
            conn.execute("CREATE INDEX m_session ON m (session_id, id)")
        conn.execute("INSERT INTO s VALUES (?, 0, ?)", (session, b"x" * 6000))
        conn.execute("INSERT INTO t VALUES (1, 0)")
        conn.execute("BEGIN")
        for _ in range(3000):  # other sessions' messages, so that the index has some depth
            other = f"{random.getrandbits(128):032x}"
            conn.execute(append, (other, *message[1:], other, *message[1:]))
        conn.execute("COMMIT")
        return conn

    extra = {
        "a 6 KB row updated": None,
        "... and a row on another page": "UPDATE t SET v = v + 1 WHERE id = 1",
        "... and 2 message rows, no index": append,
        "... and 2 message rows, indexed": append,
    }
    conns = {name: database(f"page-{i}.db", name.endswith("indexed")) for i, name in enumerate(extra)}
    micros: dict[str, list[float]] = {name: [] for name in extra}
    rng = random.Random(args.seed)
    for _ in range(args.rounds):
        for name in rng.sample(list(extra), len(extra)):
            conn, sql = conns[name], extra[name]
            start = time.process_time()
            for i in range(100):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("UPDATE s SET v = v + 1, snapshot = ? WHERE id = ?", (b"y" * 6000, session))
                if sql == append:
                    conn.execute(sql, (*message, *message))
                elif sql:
                    conn.execute(sql)
                conn.execute("COMMIT")
                if i % 50 == 49:  # as ours' checkpoint thread, every 100 commits or so
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            micros[name].append((time.process_time() - start) / 100 * 1e6)
    print(
        f"\nbare SQLite, synchronous={args.synchronous.upper()}: CPU us per transaction, median of"
        f" {args.rounds} rounds of 100"
    )
    for name, values in micros.items():
        print(f"  {name:<36}{statistics.median(values):8.1f} us")
    for conn in conns.values():
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--block", type=int, default=20, help="turns a subject plays before the next")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=150, help="turns of another conversation first")
    parser.add_argument("--synchronous", default="normal", choices=("normal", "full"))
    parser.add_argument("--page", action="store_true", help="also what one more page written costs")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="agentcanvas-bench-")
    try:
        play(args, tmp)
        if args.page:
            page_cost(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
