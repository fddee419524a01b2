"""SQLite WAL pages written per committed request: ours against the floor.

Each subject plays the intake form's pause/resume conversation (two requests per
turn, as ``bench/turns.py``) on its own SQLite file with automatic checkpoints off;
after a warm-up the WAL is emptied, a window of turns is played, and the frames the
WAL grew by are counted (one frame = one database page written by a commit). Pages
written is what a commit costs SQLite beyond the statements themselves: every page a
transaction dirties is copied to the WAL at ``COMMIT`` and back at the checkpoint.
Over HTTP they are most of the kernel time a request of ours takes beyond the floor's
(two ``pwrite`` calls a page: ``bench/kernel.py``).

``--by-table`` also says whose pages they are: each frame's page is looked up in
SQLite's ``dbstat`` table (the table or index it belongs to, its kind: leaf, internal,
overflow), and page 1, which holds the free-page list's head and the file's size.

``--sessions N`` plays ours' turns round robin over N sessions, as a server holds many
conversations (the floor keeps its one row): an index entry that moves then leaves one
leaf and lands on another, where with one session both are the same page. Give a
``--warmup`` of at least 6 turns a session (12 requests: every session's ring of kept
states full) to measure sessions that have been going a while; with fewer, each window
also adds kept states.

``--prompt-bytes N`` gives the intake agent's DSL N bytes more, as a long prompt text
(RAGFlow's templates carry prompts of several KB): a state that takes several pages,
most of them the DSL, the same from one turn to the next.

    .venv/bin/python bench/wal.py [--warmup 30] [--turns 100] [--keep 10] [--sessions 1] [--by-table]
        [--prompt-bytes 0]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sqlite3
import struct
import sys
import tempfile

from _path import load_bench

turns = load_bench("turns")  # bench/turns.py's subjects
Floor, Ours = turns.Floor, turns.Ours


def wal_frames(path: str) -> int:
    """Frames in the WAL of database ``path`` (its file's size, header and frame headers out)."""
    page = sqlite3.connect(path).execute("PRAGMA page_size").fetchone()[0]
    try:
        size = os.path.getsize(path + "-wal")
    except FileNotFoundError:
        return 0
    return max(0, size - 32) // (page + 24)


def wal_pages(path: str) -> list[int]:
    """The page number of every frame in the WAL of database ``path``, in order."""
    with open(path + "-wal", "rb") as fh:
        wal = fh.read()
    page_size = struct.unpack(">I", wal[8:12])[0]
    salts = wal[16:24]
    pages = []
    for offset in range(32, len(wal) - 24 - page_size + 1, 24 + page_size):
        if wal[offset + 8 : offset + 16] != salts:  # left from before the WAL started over
            break
        pages.append(struct.unpack(">I", wal[offset : offset + 4])[0])
    return pages


def page_owners(path: str) -> dict[int, str]:
    """``{page: "table or index: kind"}`` of database ``path`` as it is now (WAL included);
    page 1 is the file's header. Empty where SQLite was built without ``dbstat``."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT name, pageno, pagetype FROM dbstat").fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        conn.close()
    owners = {page: f"{name}: {kind}" for name, page, kind in rows}
    owners[1] = "page 1 (free list, file size)"
    return owners


def print_by_table(path: str, requests: int) -> None:
    owners = page_owners(path)
    if not owners:
        print("  (this SQLite has no dbstat table: pages not attributed)")
        return
    counts = collections.Counter(owners.get(page, "free now") for page in wal_pages(path))
    for owner, count in counts.most_common():
        print(f"  {count / requests:6.2f}  {owner}")


def truncate_wal(path: str) -> None:
    conn = sqlite3.connect(path)
    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    conn.close()
    assert not busy, "the WAL could not be checkpointed (a reader holds it)"


def no_autocheckpoint(database: object) -> None:
    database.checkpoint_every = 0  # nor in the background (api.db.database._Checkpointer)
    pragmas = dict(database._pragmas)
    pragmas["wal_autocheckpoint"] = 0
    database._pragmas = list(pragmas.items())
    database.close_all()


def measure(name: str, subject: object, path: str, warmup: int, turns: int, by_table: bool = False) -> float:
    for i in range(1, warmup + 1):
        subject.turn(i)
    truncate_wal(path)
    for i in range(warmup + 1, warmup + turns + 1):
        subject.turn(i)
    frames = wal_frames(path)
    per_request = frames / (2 * turns)
    print(f"{name:<28}{frames:>8} frames  {per_request:6.2f} pages per request")
    if by_table:
        print_by_table(path, 2 * turns)
    return per_request


def with_prompt_text(extra: int) -> None:
    """The subjects' intake DSL (``turns.intake_dsl``) with ``extra`` bytes more in the text
    of the Message that answers a minor (a component the conversation never reaches)."""
    intake = turns.intake_dsl

    def dsl() -> dict:
        made = intake()
        words = "policy text " * (extra // 12)
        made["components"]["Message:Minor"]["obj"]["params"]["content"] = [
            f"Sorry {{UserFillUp:Intake@name}}. {words}"
        ]
        return made

    turns.intake_dsl = dsl


class RoundRobin:
    """:class:`Ours` playing turn ``i`` in the ``i % count``-th of its ``count`` sessions."""

    def __init__(self, ours: Ours, count: int):
        self.ours = ours
        with ours.app.app_context():
            made = [ours.svc.create_session(ours.tenant_id, ours.agent_id)[0].id for _ in range(count - 1)]
        self.sessions = [ours.session_id, *made]

    def turn(self, i: int) -> None:
        self.ours.session_id = self.sessions[i % len(self.sessions)]
        self.ours.turn(i)

    def close(self) -> None:
        self.ours.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--keep", type=int, default=None, help="session.keep_snapshots for ours")
    parser.add_argument("--sessions", type=int, default=1, help="ours' turns go round robin over this many")
    parser.add_argument("--by-table", action="store_true", help="pages per request by table and index")
    parser.add_argument("--prompt-bytes", type=int, default=0, help="bytes of prompt text added to the DSL")
    args = parser.parse_args()
    if args.prompt_bytes:
        with_prompt_text(args.prompt_bytes)
    tmp = tempfile.mkdtemp(prefix="agentcanvas-wal-")
    try:
        measure_both(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def measure_both(args: argparse.Namespace, tmp: str) -> None:
    ours_path = f"{tmp}/ours.db"
    ours = Ours(f"sqlite:///{ours_path}")
    if args.keep is not None:
        ours.svc.keep_snapshots = args.keep
    no_autocheckpoint(ours.database)
    if args.sessions > 1:
        ours = RoundRobin(ours, args.sessions)
    floor_path = f"{tmp}/floor.db"
    floor = Floor(f"sqlite:///{floor_path}", False)
    floor.store.conn().execute("PRAGMA wal_autocheckpoint=0")
    name = "ours" if args.sessions == 1 else f"ours, {args.sessions} sessions"
    if args.prompt_bytes:
        name += f", DSL +{args.prompt_bytes} B"
    measure(name, ours, ours_path, args.warmup, args.turns, args.by_table)
    measure("floor, 1 commit", floor, floor_path, args.warmup, args.turns, args.by_table)
    ours.close()
    floor.close()


if __name__ == "__main__":
    sys.exit(main())
