"""Per-turn cost of a pause/resume form turn in process, side by side, durability matched.

One "turn" of the intake sample is what a client does for a form: a completion that
pauses at the form, then one that resumes it with the answers (two requests, two
committed snapshots). Every subject plays the same conversation and is timed over a
window of turns starting at turns 10, 100 and 1,000, in wall time and in this
process's CPU time (all its threads; a machine busy with other work disturbs it less).

Each subject has an instance of its own for each point, first played untimed up to
the point (aged: its conversation 9, 99, 999 turns long) on a database that has
already had ``--warmup`` turns (150) of another conversation, as a server's has. A new
SQLite file's WAL grows with each commit until its first checkpoint, and under
``synchronous=FULL`` a commit that makes the file longer syncs its new size too: a
cost a database pays once in its life, which turn 10 on a new file showed (the
floor's turn 10 took 1.74 ms, its turn 1,000 1.10). Then all the instances play
their windows **interleaved turn by turn** (A@10's turn 12, B@10's turn 12...,
A@100's turn 102, B@100's..., A@1000's turn 1002..., in an order drawn anew each round;
or, with ``--block N``, by blocks of N turns). The order is random (``--seed``), but for
one rule: no instance follows another of its own subject. So each subject follows each
of the others as often, give or take chance. That matters: a turn's cost depends on the
one before it. Right after LangGraph's, whose turn leaves the CPU's caches coldest, ours'
FULL turn took 1.35 ms against 1.05 after the two-commit floor's, and the floor + canvas'
1.11 against 0.85. The cyclic rotation used before kept every instance's predecessor
the same from round to round: ours always came right after LangGraph, the floor + canvas
after the two-commit floor. Each group ends with a table of every subject's wall time by the
subject that played just before it, the effect as this run measured it.

Figures are the median over the window with its spread (25th–75th percentile); a
ratio is the median of the per-turn ratios of two same-numbered turns, which ran
moments apart: two subjects' at a point, or, in the ``last/first`` column, a subject's
at the last point and at the first (turn 1,000 against turn 10, measured at the same
time, so that a machine slowing down during the run does not show as growth).
``LangGraph + SqliteSaver / floor sqlite, 1 commit`` is printed too: the ratio a turn
as cheap as the floor's minimal one would reach, the room there is for ours'
``LangGraph / ours``.

SQLite subjects run in WAL mode with the same ``synchronous`` setting, reported as two
row groups: ``NORMAL`` (our default) and ``FULL`` (SQLite's default, an fsync per
commit, which LangGraph's checkpointer gets unless told otherwise; ours gets it as a user
would, ``?synchronous=full`` on its database URL). Interleaved, ours' background checkpoint
runs while the other subjects play, so its WAL starts over as on an idle server; a server
under steady writes relies on the checkpoint being finished under the write lock instead
(api.db.database._Checkpointer). Where FULL runs, the report starts with this machine's
sync latency (:func:`sync_latency`): on a virtual machine a commit's sync can cost ten
times more after a stretch of CPU work than back to back, a wait in FULL's wall figures
that is the host's, not any subject's.

* **ours**: the turn service (read, canvas, one commit per request: the intake form's
  components are all side-effect-free, so no lease is taken), HTTP excluded
  (``bench/http.py`` measures over HTTP);
* **floor, 1 commit**: a real minimal turn per request, same driver, no ORM: read the
  snapshot row, parse it, append the exchange, write it back with a version check,
  append two message rows, commit (:class:`support.floor_app.Store`);
* **floor, 2 commits**: the same after a committed lease claim, as ours does;
* **floor + canvas** (SQLite): the 1-commit floor's transaction with the intake agent's
  real canvas run in it (``Canvas(text)``, the query or the form's answers, ``dump``)
  in place of the history append, and nothing around it (no cache of loaded canvases,
  no kept states, no telemetry). ``ours / floor + canvas`` is what ours' turn service
  costs beyond running the canvas; ``LangGraph + SqliteSaver / floor + canvas``, the
  most any service running this canvas could show;
* **LangGraph + SqliteSaver**: the same greet → interrupt → reply graph
  (``bench/support/intake_graph.py``), ``pip install -e '.[bench]'``.

With MariaDB and PostgreSQL reachable, ours and the floors also run on each (durability
is the server's, the same for all subjects of a group).

Turn by turn, every turn of a subject starts with the caches as the other subjects left
them (LangGraph's turn touches several MB): the lighter a subject's turn, the larger
the share of its time spent refilling them. A server process runs one engine's turns
one after another, which blocks of turns come closer to; ``--block 1,7`` runs both
(fresh subjects for each) and prints both, so the effect is shown, not chosen.

``--gap MS`` sleeps that long before each turn (untimed), as a client that takes a
moment between requests: a CPU that went idle runs the next turn slower (its caches
cold, here a virtual CPU the host used meanwhile), a fixed cost that weighs more on a
short turn than on a long one. Gaps are listed like blocks (``--gap 0,5``: a run each).

    .venv/bin/python bench/turns.py [--points 10,100,1000] [--window 61] [--warmup 150] [--block 1,7] [--gap 0,5]
        [--no-mysql] [--no-postgres]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid

from _path import BENCH, ROOT

sys.path.insert(0, os.path.join(BENCH, "support"))

from throwaway import mysql_database, postgres_database  # noqa: E402

ANSWERS = {"name": "Ann", "age": 41, "plan": "pro", "notes": "a short note"}


def intake_dsl() -> dict:
    with open(os.path.join(ROOT, "samples", "intake_form.json"), encoding="utf-8") as fh:
        return json.load(fh)["dsl"]


# ---------------------------------------------------------------- ours, in process
class Ours:
    """The turn service on its own database, in this process (one app per subject)."""

    def __init__(self, url: str, cache: bool = True):
        from api import create_app
        from api.config import canvas_limits
        from api.db import db
        from api.services import tokens
        from api.services.agents import create_agent
        from api.services.turns import TurnRequest

        # cache=False: the canvas cache off (api/services/canvas_cache.py), to compare.
        self.app = create_app({"DATABASE_URL": url, **({} if cache else {"CANVAS_CACHE_ENTRIES": 0})})
        self.database = db.obj
        with self.app.app_context():
            tenant = tokens.tenant_by_name(f"bench-{uuid.uuid4().hex[:6]}")
            self.tenant_id = tenant.id
            limits = canvas_limits(self.app.config)
            agent = create_agent(tenant.id, f"intake-{uuid.uuid4().hex[:6]}", intake_dsl(), "", limits)
            self.agent_id = agent.id
            self.svc = self.app.extensions["agentcanvas.turns"]
            # Looked up here, not in turn(): an import statement in the timed turn is the
            # bench's cost, not a server's (which imports once), and cold it was ~3% of it.
            self.request = TurnRequest
            self.models = db
            self.session_id = self._new_session()

    def _new_session(self) -> str:
        row, _ = self.svc.create_session(self.tenant_id, self.agent_id)
        return row.id

    def _bind(self) -> None:
        # Several subjects share the one models' handle. Not api.db.bind_database: that
        # closes the previous database's idle connections, which a server never does
        # between its turns (and each instance would then open one again every turn).
        if self.models.obj is not self.database:
            self.models.initialize(self.database)

    def turn(self, i: int, session_id: str | None = None) -> None:
        self._bind()
        with self.app.app_context():
            for body in ({"query": f"sign me up {i}"}, {"inputs": ANSWERS}):
                request = self.request(
                    self.tenant_id, self.agent_id, session_id=session_id or self.session_id, **body
                )
                result = self.svc.start(request, inline=True).wait()
                assert result.status in ("paused", "succeeded"), result

    def warm(self, turns: int) -> None:
        """``turns`` turns of another conversation on the same database."""
        self._bind()
        with self.app.app_context():
            other = self._new_session()
        for i in range(turns):
            self.turn(i, other)

    def close(self) -> None:
        cache = self.svc.canvases
        if cache.enabled:
            print(f"  canvas cache: {cache.hits} hits, {cache.misses} misses", file=sys.stderr)
        from api import stop_background

        stop_background(self.app)  # its parse threads poll the database this run then drops
        self.database.close_all()


# ---------------------------------------------------------------- the floor
class Floor:
    """:class:`support.floor_app.Store`: one or two commits per request."""

    def __init__(self, url: str, two_commits: bool, synchronous: str = "normal"):
        from floor_app import Store

        from agent.canvas import Canvas

        canvas = Canvas(intake_dsl())
        canvas.reset()
        self.store = Store(url, synchronous)
        self.store.seed(str(canvas), 2)  # s0 the conversation measured, s1 another (warm)
        self.two_commits = two_commits

    def turn(self, i: int, session_id: str = "s0") -> None:
        for user in (f"sign me up {i}", json.dumps(ANSWERS)):
            assert self.store.turn(session_id, user, "Thanks", self.two_commits) > 0

    def warm(self, turns: int) -> None:
        """``turns`` turns of another conversation on the same database."""
        for i in range(turns):
            self.turn(i, "s1")

    def close(self) -> None:
        self.store.conn().close()


class FloorCanvas(Floor):
    """The floor's transaction, one commit a request, with a real canvas run in it: the
    snapshot loaded (``Canvas(text)``), the request's query or form answers run, the
    canvas dumped and written back (:func:`support.floor_app.canvas_turn`). No service
    around it (no cache of loaded canvases, no kept states, no telemetry): the least a
    turn running this canvas can cost."""

    def __init__(self, url: str, synchronous: str = "normal"):
        super().__init__(url, False, synchronous)
        from floor_app import canvas_turn

        self.canvas_turn = canvas_turn

    def turn(self, i: int, session_id: str = "s0") -> None:
        for user, body in (
            (f"sign me up {i}", {"query": f"sign me up {i}"}),
            (json.dumps(ANSWERS), {"inputs": ANSWERS}),
        ):
            assert self.store.turn(session_id, user, "", run=self.canvas_turn(body)) > 0


# ---------------------------------------------------------------- LangGraph
class LangGraphSqlite:
    def __init__(self, path: str, synchronous: str):
        from intake_graph import builder
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.types import Command

        self.conn = sqlite3.connect(path, check_same_thread=False)
        saver = SqliteSaver(self.conn)
        saver.setup()  # WAL, as ours
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        self.app = builder.compile(checkpointer=saver)
        self.cfg = {"configurable": {"thread_id": "bench"}}
        self.Command = Command

    def turn(self, i: int, cfg: dict | None = None) -> None:
        self.app.invoke({"query": f"sign me up {i}"}, cfg or self.cfg)
        self.app.invoke(self.Command(resume=ANSWERS), cfg or self.cfg)

    def warm(self, turns: int) -> None:
        """``turns`` turns of another conversation (thread) on the same database."""
        for i in range(turns):
            self.turn(i, {"configurable": {"thread_id": "warm"}})

    def close(self) -> None:
        self.conn.close()


# ---------------------------------------------------------------- running
def _order(players: list[tuple[str, int]], rng: random.Random, last: tuple[str, int] | None) -> list:
    """``players`` ((subject, point) pairs) in a random order in which none follows an
    instance of its own subject, the first included (it follows ``last``, the previous
    round's last player): with one instance a subject, a turn never follows its own. Drawn again
    until it fits: about 10 draws for 3 subjects at 3 points, fewer with more subjects."""
    if len({name for name, _ in players}) < 2:
        return rng.sample(players, len(players))
    while True:
        order = rng.sample(players, len(players))
        if all(a[0] != b[0] for a, b in itertools.pairwise([last or ("", 0), *order])):
            return order


CLOCKS = {"wall": time.perf_counter, "CPU": time.process_time}


def play(
    instances: dict[int, dict[str, object]],
    window: int,
    block: int = 1,
    gap: float = 0.0,
    warmup: int = 0,
    rng: random.Random | None = None,
    after: dict[str, dict[str, list[float]]] | None = None,
) -> dict[str, dict[str, dict[int, list[float]]]]:
    """Every subject plays the conversation, interleaved; the timed windows.

    ``instances`` holds, for each point p, one instance of every subject: each first
    plays ``warmup`` turns of another conversation on its database, then turns 1..p-1
    of the one measured, untimed, on its own (aging it to the point). Then every instance
    of every point plays its window of turns (p..p+window-1), interleaved by blocks of
    ``block`` turns: A@10 plays turns 10..10+block-1, then B@10..., A@100 its turns
    100.., B@100..., in an order drawn anew for each block from ``rng`` (:func:`_order`:
    none follows another instance of its own subject). ``block=1`` is turn by turn. The k-th turn
    of every window so runs moments apart from every other's: a machine that slows down
    during the run slows all points alike, and turn 1,000 against turn 10 compares like
    with like. With ``gap`` (seconds), each timed turn comes after a sleep that long,
    not timed. Each timed turn is measured twice: wall time, and this process's CPU
    time (every thread's: LangGraph runs its nodes in a pool), which a busy machine
    disturbs less. Returns ``{clock: {subject: {point: [seconds per turn]}}}``; ``after``,
    if given, gets each timed turn's wall time under the subject that played just before
    it (``{subject: {predecessor: [seconds]}}``, every point's turns together).
    """
    points = sorted(instances)
    names = list(instances[points[0]])
    for p in points:
        for subject in instances[p].values():
            subject.warm(warmup)
            for i in range(1, p):
                subject.turn(i)
        print(f"  aged to turn {p}", file=sys.stderr)
    times = {clock: {n: {p: [] for p in points} for n in names} for clock in CLOCKS}
    rng = rng or random.Random(1)
    players = [(n, p) for p in points for n in names]
    last: tuple[str, int] | None = None
    last_played: str | None = None
    for first in range(0, window, block):
        order = _order(players, rng, last)
        last = order[-1]
        for name, p in order:
            subject = instances[p][name]
            for i in range(p + first, p + min(first + block, window)):
                if gap:
                    time.sleep(gap)
                wall, cpu = time.perf_counter(), time.process_time()
                subject.turn(i)
                took = time.perf_counter() - wall
                times["wall"][name][p].append(took)
                times["CPU"][name][p].append(time.process_time() - cpu)
                if after is not None and last_played is not None:
                    after.setdefault(name, {}).setdefault(last_played, []).append(took)
                last_played = name
    return times


def sync_latency(folder: str, syncs: int = 200) -> list[tuple[float, tuple[float, float, float]]]:
    """This machine's ``fdatasync`` of a commit's worth of WAL frames (4 pages, each
    with its 24-byte header, appended as SQLite writes them), back to back and after
    0.3 and 1 ms of CPU work: ``[(work seconds, quartiles of the sync in seconds)]``.

    Under ``synchronous=FULL`` every commit waits for one. On a virtual machine a CPU
    left idle during the wait may be woken late when the disk answers, where it had
    worked a while since its last wait: on one 2-core KVM guest a sync took 0.07-0.10 ms
    back to back, 0.13-0.97 ms (median) after 0.3 ms of work and 0.7-1.3 ms after 1 ms,
    whatever wrote the file (with its other CPU kept busy, 0.07 ms after 1 ms).
    Each turn's wall figure under FULL carries that wait once per commit, the CPU
    figure does not; the probe prints how much of it this machine adds."""
    path = os.path.join(folder, "sync-probe")
    frame = b"\0" * 24 + os.urandom(4096)
    found = []
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for work in (0.0, 0.0003, 0.001):
            took = []
            for _ in range(syncs):
                os.write(fd, frame * 4)
                start = time.perf_counter()
                os.fdatasync(fd)
                took.append(time.perf_counter() - start)
                until = time.perf_counter() + work
                while time.perf_counter() < until:  # busy: the CPU does not go idle
                    pass
            found.append((work, quartiles(took)))
    finally:
        os.close(fd)
        os.unlink(path)
    return found


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, statistics.median(values), q3


def report(group: str, times: dict[str, dict[int, list[float]]], points: list[int], clock: str) -> None:
    ours = next(n for n in times if n.startswith("ours"))
    langgraph = next((n for n in times if n.startswith("LangGraph")), None)
    floor = next((n for n in times if n.startswith("floor") and n.endswith(", 1 commit")), None)
    rows = [(other, ours) if other == langgraph else (ours, other) for other in times if other != ours]
    canvas_floor = next((n for n in times if n.startswith("floor") and n.endswith("+ canvas")), None)
    if langgraph and floor:
        # The ratio a turn as cheap as the floor's (one commit a request) would show.
        rows.append((langgraph, floor))
    if langgraph and canvas_floor:
        # ... and one as cheap as the canvas run in that transaction: the most any
        # service running this canvas could show.
        rows.append((langgraph, canvas_floor))
    labels = [" / ".join("ours" if n == ours else n for n in pair) for pair in rows]
    # One name column for both tables, so that every figure sits under its turn's heading.
    width = max(30, *map(len, times), *(2 + len(label) for label in labels))
    head = "".join(f"{'turn ' + str(p):>24}" for p in points)
    print(f"\n{group}: {clock} ms per pause+resume turn, median [25th–75th percentile]")
    print(f"{'subject':<{width}}{head}{'last/first':>12}")
    for name, by_point in times.items():
        cells = ""
        for p in points:
            q1, q2, q3 = quartiles(by_point[p])
            cells += f"{f'{q2 * 1000:.2f} [{q1 * 1000:.2f}–{q3 * 1000:.2f}]':>24}"
        # The k-th turns of the first and last windows ran moments apart (play).
        pairs = zip(by_point[points[-1]], by_point[points[0]], strict=True)
        growth = statistics.median(last / first for last, first in pairs)
        print(f"{name:<{width}}{cells}{growth:>11.2f}x")
    print("paired per-turn ratios, median [25th–75th percentile]:")
    for (top, bottom), label in zip(rows, labels, strict=True):
        cells = ""
        for p in points:
            pairs = [a / b for a, b in zip(times[top][p], times[bottom][p], strict=True)]
            q1, q2, q3 = quartiles(pairs)
            cells += f"{f'{q2:.2f}x [{q1:.2f}–{q3:.2f}]':>24}"
        print(f"  {label:<{width - 2}}{cells}")


def report_after(group: str, names: list[str], after: dict[str, dict[str, list[float]]]) -> None:
    """Each subject's wall time per turn by the subject whose turn ran just before it (every
    point's turns together): what a turn pays for the caches its predecessor left it."""
    width = max(30, *(len(n) + 4 for n in names))
    print(f"\n{group}: wall ms per pause+resume turn, median (turns), by the subject that played just before")
    print(f"{'subject':<{width}}" + "".join(f"{f'after {i}':>14}" for i in range(1, len(names) + 1)))
    for i, name in enumerate(names, 1):
        cells = ""
        for before in names:
            taken = after.get(name, {}).get(before, [])
            cells += f"{f'{statistics.median(taken) * 1000:.2f} ({len(taken)})' if taken else '-':>14}"
        print(f"{f'{i} {name}':<{width}}{cells}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--points", default="10,100,1000")
    parser.add_argument(
        "--window",
        type=int,
        default=61,
        # With the order drawn each round, a median over 21 turns moved by up to 25% from
        # one seed to the next (a turn's predecessor matters); over 61, by 2-4%.
        help="turns timed at each point (the median is over them)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=150,
        help="turns of another conversation each database has had before the one measured starts",
    )
    parser.add_argument("--no-mysql", action="store_true")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--durability", default="normal,full", help="SQLite synchronous settings to run")
    parser.add_argument(
        "--block",
        default="1",
        help="turns a subject plays before the next takes over (comma-separated: one run each)",
    )
    parser.add_argument(
        "--gap",
        default="0",
        help="ms of idle before each turn, untimed (comma-separated: one run each, by blocks of the first --block)",
    )
    parser.add_argument("--uncached", action="store_true", help="also run ours with the canvas cache off")
    parser.add_argument(
        "--seed", type=int, default=1, help="of the order the subjects play in, drawn each round"
    )
    args = parser.parse_args()
    points = [int(p) for p in args.points.split(",")]
    tmp = tempfile.mkdtemp(prefix="agentcanvas-bench-")
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401

        langgraph = True
    except ImportError:
        langgraph = False
        print("LangGraph not installed: pip install -e '.[bench]' to compare", file=sys.stderr)

    cleanups: list = []

    def sqlite_subjects(sync: str, tag: str) -> dict[str, object]:
        subjects: dict[str, object] = {
            "ours sqlite": Ours(f"sqlite:///{tmp}/ours-{tag}.db?synchronous={sync}"),
            **(
                {
                    "ours sqlite, uncached": Ours(
                        f"sqlite:///{tmp}/ours-nc-{tag}.db?synchronous={sync}", cache=False
                    )
                }
                if args.uncached
                else {}
            ),
            "floor sqlite, 1 commit": Floor(f"sqlite:///{tmp}/floor1-{tag}.db", False, sync),
            "floor sqlite, 2 commits": Floor(f"sqlite:///{tmp}/floor2-{tag}.db", True, sync),
            "floor sqlite + canvas": FloorCanvas(f"sqlite:///{tmp}/floorc-{tag}.db", sync),
        }
        if langgraph:
            subjects["LangGraph + SqliteSaver"] = LangGraphSqlite(f"{tmp}/langgraph-{tag}.db", sync)
        return subjects

    def server_subjects(backend: str, throwaway) -> dict[str, object]:  # noqa: ANN001 - a function
        urls = []
        for _ in range(4 if args.uncached else 3):
            url, drop = throwaway()
            cleanups.append(drop)
            urls.append(url)
        return {
            f"ours {backend}": Ours(urls[0]),
            **({f"ours {backend}, uncached": Ours(urls[3], cache=False)} if args.uncached else {}),
            f"floor {backend}, 1 commit": Floor(urls[1], False),
            f"floor {backend}, 2 commits": Floor(urls[2], True),
        }

    def make_groups(block: int, gap: float) -> list[tuple[str, dict[int, dict[str, object]]]]:
        """Fresh subjects on fresh databases, one of each for each point, for a run
        interleaved by blocks of ``block`` (``gap`` ms of idle before each turn)."""
        how = "turn by turn" if block == 1 else f"by blocks of {block} turns"
        if gap:
            how += f", {gap:g} ms idle before each turn"
        tag = f"b{block}-g{gap:g}"
        groups: list[tuple[str, dict[int, dict[str, object]]]] = []
        for sync in args.durability.split(","):
            groups.append(
                (
                    f"SQLite WAL, synchronous={sync.upper()}, interleaved {how}",
                    {p: sqlite_subjects(sync, f"{sync}-{tag}-t{p}") for p in points},
                )
            )
        if not args.no_mysql:
            groups.append(
                (
                    f"MariaDB (server durability, the same for all), interleaved {how}",
                    {p: server_subjects("mariadb", mysql_database) for p in points},
                )
            )
        if not args.no_postgres:
            groups.append(
                (
                    f"PostgreSQL (server durability, the same for all), interleaved {how}",
                    {p: server_subjects("postgres", postgres_database) for p in points},
                )
            )
        return groups

    try:
        results = []
        blocks = [int(b) for b in args.block.split(",")]
        gaps = [float(g) for g in args.gap.split(",")]
        # each block size without idle (where 0 is one of the gaps), then each other gap by the first block size
        runs = [(b, 0.0) for b in blocks if 0 in gaps] + [(blocks[0], g) for g in gaps if g]
        for block, gap in runs:
            for group, instances in make_groups(block, gap):
                print(f"  playing {group}", file=sys.stderr)
                after: dict[str, dict[str, list[float]]] = {}
                times = play(
                    instances, args.window, block, gap / 1000, args.warmup, random.Random(args.seed), after
                )
                results.append((group, times, after))
                for subjects in instances.values():
                    for subject in subjects.values():
                        subject.close()
        if any(sync.lower() != "normal" for sync in args.durability.split(",")):
            print(
                "\nthis machine's fdatasync of a commit's WAL frames (4 pages), median [25th–75th percentile]:"
            )
            for work, (q1, q2, q3) in sync_latency(tmp):
                after_work = f"after {work * 1000:g} ms of CPU work" if work else "back to back"
                print(f"  {after_work:<28}{q2 * 1000:.2f} ms [{q1 * 1000:.2f}–{q3 * 1000:.2f}]")
        for group, times, after in results:
            for clock, by_clock in times.items():
                report(group, by_clock, points, clock)
            report_after(group, list(times["wall"]), after)
    finally:
        for drop in cleanups:
            drop()
        shutil.rmtree(tmp, ignore_errors=True)  # its SQLite files: 44 MB a durability
    return 0


if __name__ == "__main__":
    sys.exit(main())
