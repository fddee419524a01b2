"""What a turn costs on a warm CPU cache and on a cold one, subject by subject.

``bench/turns.py`` plays its subjects turn by turn: each turn comes right after another
subject's, whose work has pushed the one measured out of the CPU's caches. Its tables
"by the subject that played just before" show how much that weighs: ours' FULL turn
took 0.87 ms after one of its own, 1.3-1.7 ms after another subject's. This script
measures that cost alone, so that a ratio can be read as what it is made of.

Each round, every subject in turn (in an order drawn anew each round): one turn untimed,
one timed right after it (**warm**: its code, its objects and its database pages are in
the caches), then every cache line of a ``--sweep`` MB buffer written (more than this
machine's last-level cache), then one more turn timed (**cold**). Subjects: ours, the
floor + canvas and the one-commit floor of ``bench/turns.py``, and LangGraph +
SqliteSaver where it is installed, all on SQLite with the same ``--synchronous``.

Printed: each subject's median wall ms per pause+resume turn, warm and cold, with the
25th-75th percentile, what the cold turn added, and the paired per-round ratios of
LangGraph to each subject, warm and cold.

What a cold turn adds depends little on the subject's own code. On a 2-core Intel Xeon
VM (150 rounds), under ``full`` it was 0.24 ms for ours, 0.19 for the floor + canvas and
0.19 for the one-commit floor, whose few lines of Python could not account for it. Under
``normal``, where no commit syncs, the floor's was 0.09 ms. The other 0.10 came with its
two synced commits: the kernel's sync path to reload, besides SQLite and the interpreter.
A subject whose turn syncs pays that reload however lean its own code is. LangGraph's
turn, with eleven synced commits, added 0.13 ms.

    .venv/bin/python bench/cold.py [--synchronous normal|full] [--rounds 150] [--sweep 64]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time

from _path import load_bench

turns = load_bench("turns")  # bench/turns.py's subjects

LANGGRAPH = "LangGraph + SqliteSaver"


def subjects(tmp: str, sync: str) -> dict[str, object]:
    found: dict[str, object] = {
        "ours sqlite": turns.Ours(f"sqlite:///{tmp}/ours.db?synchronous={sync}"),
        "floor sqlite + canvas": turns.FloorCanvas(f"sqlite:///{tmp}/floorc.db", sync),
        "floor sqlite, 1 commit": turns.Floor(f"sqlite:///{tmp}/floor1.db", False, sync),
    }
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401 - only whether it is there
    except ImportError:  # find_spec of a dotted name raises too when langgraph is missing
        print("LangGraph not installed: pip install -e '.[bench]' to compare", file=sys.stderr)
        return found
    found[LANGGRAPH] = turns.LangGraphSqlite(f"{tmp}/langgraph.db", sync)
    return found


def play(
    players: dict[str, object], rounds: int, sweep_mb: int, seed: int
) -> dict[str, dict[str, list[float]]]:
    """``{subject: {"warm": [s], "cold": [s]}}``, one of each a round."""
    sweep = bytearray(sweep_mb << 20)
    zeros = bytes(len(sweep) // 64)
    times: dict[str, dict[str, list[float]]] = {name: {"warm": [], "cold": []} for name in players}
    rng = random.Random(seed)
    for r in range(rounds):
        for name in rng.sample(list(players), len(players)):
            subject = players[name]
            turn = 1000 + 3 * r  # each round's turns are new ones of the conversation
            subject.turn(turn)
            start = time.perf_counter()
            subject.turn(turn + 1)
            times[name]["warm"].append(time.perf_counter() - start)
            sweep[::64] = zeros  # a write to every cache line
            start = time.perf_counter()
            subject.turn(turn + 2)
            times[name]["cold"].append(time.perf_counter() - start)
    return times


def report(times: dict[str, dict[str, list[float]]], sync: str, rounds: int, sweep_mb: int) -> None:
    def spread(values: list[float]) -> str:
        q1, _, q3 = statistics.quantiles(values, n=4)
        return f"{statistics.median(values) * 1e3:.2f} [{q1 * 1e3:.2f}-{q3 * 1e3:.2f}]"

    print(
        f"\nSQLite WAL, synchronous={sync.upper()}: wall ms per pause+resume turn, median [25th-75th],"
        f" {rounds} rounds, cache swept with {sweep_mb} MB"
    )
    print(f"{'subject':28s}{'warm':>22s}{'cold':>22s}{'cold - warm':>14s}")
    for name, got in times.items():
        added = statistics.median(got["cold"]) - statistics.median(got["warm"])
        print(f"{name:28s}{spread(got['warm']):>22s}{spread(got['cold']):>22s}{added * 1e3:>14.2f}")
    if LANGGRAPH in times:
        print("paired per-round ratios, median [25th-75th]:")
        for name in times:
            if name == LANGGRAPH:
                continue
            cells = []
            for state in ("warm", "cold"):
                ratios = [a / b for a, b in zip(times[LANGGRAPH][state], times[name][state], strict=True)]
                q1, _, q3 = statistics.quantiles(ratios, n=4)
                cells.append(f"{statistics.median(ratios):.2f}x [{q1:.2f}-{q3:.2f}]")
            print(f"  {LANGGRAPH} / {name:24s}{cells[0]:>22s}{cells[1]:>22s}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--synchronous", default="normal,full", help="SQLite synchronous settings to run")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--sweep", type=int, default=64, help="MB written between the warm and the cold turn")
    parser.add_argument("--warmup", type=int, default=150, help="turns of another conversation first")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for sync in args.synchronous.split(","):
        tmp = tempfile.mkdtemp(prefix="agentcanvas-bench-")
        players = subjects(tmp, sync)
        try:
            for subject in players.values():
                subject.warm(args.warmup)
                for i in range(1, 1000):  # the conversation measured, aged to turn 1,000
                    subject.turn(i)
            report(play(players, args.rounds, args.sweep, args.seed), sync, args.rounds, args.sweep)
        finally:
            for subject in players.values():
                subject.close()
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
