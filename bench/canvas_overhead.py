"""Runtime cost per turn (load snapshot + run + dump) as a conversation grows.

For each sample, the conversation is played to turn N (10, 100, 1,000); then the
turn N+1 is timed many times from the same snapshot: ``Canvas(snapshot)``, run it,
``str(canvas)``. The intake sample's turn is a pause and a resume (two runs, two
snapshot round trips), as a client drives it. Prints the median per turn, the
ratio to turn 10 measured in the same run, and the snapshot size.

``--parts`` then splits the intake turn at turn 300 into what each part costs, as
the turn service runs it (blocking: ``trace=False``, with its context; the collector
frozen after setup as the server's workers do): each run, the two ``str()`` and a
``Canvas(text)``, the best of 5 rounds (a busy machine only adds time).

    .venv/bin/python bench/canvas_overhead.py [--repeat 200] [--parts]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

import _path  # noqa: E402, F401 - the project on the path, bench/ off it

from agent.canvas import Canvas  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANSWERS = {"name": "Ann", "age": "41", "plan": "pro", "notes": "a short note"}


def load(name: str) -> str:
    with open(os.path.join(ROOT, "samples", f"{name}.json"), encoding="utf-8") as fh:
        return json.dumps(json.load(fh)["dsl"])


def turn_greeting(snapshot: str, i: int) -> str:
    canvas = Canvas(snapshot)
    for _ in canvas.run(query=f"message number {i}", user_id="bench"):
        pass
    return str(canvas)


def turn_intake(snapshot: str, i: int) -> str:
    canvas = Canvas(snapshot)
    for _ in canvas.run(query=f"sign me up {i}", user_id="bench"):
        pass
    canvas = Canvas(str(canvas))
    for _ in canvas.run(inputs=ANSWERS):
        pass
    return str(canvas)


def parts(snapshot: str, repeat: int) -> dict[str, float]:
    """Microseconds per part of the intake turn from ``snapshot`` (best of 5 rounds)."""
    context = {"user_id": "bench", "conversation_id": "c" * 32, "agent_id": "a" * 32, "invoke_from": "api"}
    best: dict[str, float] = {}
    for _ in range(5):
        spent = dict.fromkeys(("pause run", "resume run", "2 x str()", "Canvas(text)"), 0.0)
        for i in range(repeat):
            t0 = time.perf_counter()
            canvas = Canvas(snapshot)
            t1 = time.perf_counter()
            for _ in canvas.run(
                query="sign me up", trace=False, task_id=f"t{i}", message_id=f"m{i}", **context
            ):
                pass
            t2 = time.perf_counter()
            text = str(canvas)
            t3 = time.perf_counter()
            canvas = Canvas(text)
            t4 = time.perf_counter()
            for _ in canvas.run(inputs=ANSWERS, trace=False):
                pass
            t5 = time.perf_counter()
            str(canvas)
            t6 = time.perf_counter()
            spent["Canvas(text)"] += (t1 - t0 + t4 - t3) / 2
            spent["pause run"] += t2 - t1
            spent["resume run"] += t5 - t4
            spent["2 x str()"] += t3 - t2 + t6 - t5
        for key, total in spent.items():
            best[key] = min(best.get(key, float("inf")), total / repeat * 1e6)
    return best


def measure(turn, snapshot: str, at: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        turn(snapshot, at)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--parts", action="store_true", help="also split the intake turn at turn 300")
    args = parser.parse_args()
    points = (10, 100, 1000)
    print(f"{'sample':<10} {'turn':>6} {'median ms/turn':>15} {'vs turn 10':>11} {'snapshot bytes':>15}")
    worst = 0.0
    for name, turn in (("greeting", turn_greeting), ("intake", turn_intake)):
        snapshot = load("greeting" if name == "greeting" else "intake_form")
        done = 0
        base = None
        for at in points:
            while done < at - 1:
                done += 1
                snapshot = turn(snapshot, done)
            cost = measure(turn, snapshot, at, args.repeat)
            base = base or cost
            worst = max(worst, cost / base)
            print(f"{name:<10} {at:>6} {cost * 1000:>15.3f} {cost / base:>10.2f}x {len(snapshot):>15,}")
    print(f"\nworst ratio turn N / turn 10: {worst:.2f}x (goal: turn 1,000 at most 1.3x turn 10)")
    if args.parts:
        snapshot = load("intake_form")
        for i in range(300):
            snapshot = turn_intake(snapshot, i)
        gc.collect()
        gc.freeze()
        print("\nintake turn 300, us per part (best of 5 rounds):")
        for key, us in parts(snapshot, args.repeat).items():
            print(f"  {key:<14} {us:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
