"""How long building an LLM node's prompt takes as its memory grows.

For histories of 10, 100 and 1,000 messages, one turn's prompt is built the way the
LLM component builds it — read the node's memory, count the prompt's tokens, pick the
window, fit it into the token budget, and count the new exchange's tokens for storing
— side by side with a naive build that re-counts every message of the history each
turn and then trims it to the budget (as RAGFlow's ``message_fit_in`` does). Every
turn uses a new prompt text, so no count is served from a cache that a real new turn
would not hit.

    python bench/memory.py            # prints the table; exits 1 if the goal is missed

Goal: the 1,000-message prompt costs at most 2× the 10-message one.
"""

from __future__ import annotations

import random
import statistics
import sys
import time

import _path  # noqa: E402, F401 - the project on the path, bench/ off it

from agent.canvas import Canvas  # noqa: E402
from agent.llm.tokens import MESSAGE_OVERHEAD, encoding, messages_tokens  # noqa: E402
from agent.memory import NodeMemory, history_budget, make_entry, select_history  # noqa: E402

SIZES = (10, 100, 1000)
WINDOWS = (20, 100)
CONTEXT, MAX_TOKENS = 8192, 512
ROUNDS = 7  # timing repeats; the median is reported
TURNS = 40  # turns per repeat
NODE = "LLM:Bench"
WORDS = "the a support invoice plan model token budget window memory answer user agent canvas flow".split()


def sentence(rng: random.Random, n: int = 40) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randint(0, 999)) for _ in range(n))


def make_canvas(size: int, rng: random.Random) -> Canvas:
    dsl = {
        "components": {
            "begin": {"obj": {"component_name": "Begin", "params": {}}, "downstream": [NODE], "upstream": []},
            NODE: {"obj": {"component_name": "LLM", "params": {}}, "downstream": [], "upstream": ["begin"]},
        },
        "path": [],
        "history": [],
        "retrieval": [],
    }
    canvas = Canvas(dsl)
    canvas.memory[NODE] = [
        make_entry("user" if i % 2 == 0 else "assistant", sentence(rng)) for i in range(size)
    ]
    return canvas


def ours(canvas: Canvas, window: int, system: str, prompt: str, reply: str) -> list[dict]:
    memory = NodeMemory(canvas, NODE)
    head = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    budget = history_budget(CONTEXT, MAX_TOKENS, messages_tokens(head))
    history = select_history(memory.entries(window), window, budget)
    make_entry("user", prompt), make_entry("assistant", reply)  # what storing the exchange counts
    return [head[0], *history, head[1]]


def naive(canvas: Canvas, window: int, system: str, prompt: str, reply: str) -> list[dict]:
    enc = encoding()
    count = lambda text: len(enc.encode(text, disallowed_special=())) + MESSAGE_OVERHEAD  # noqa: E731
    entries = canvas.memory[NODE]
    history = [{"role": e["role"], "content": e["content"]} for e in entries]
    sizes = [count(m["content"]) for m in history]  # the whole history, every turn
    budget = CONTEXT - MAX_TOKENS - count(system) - count(prompt)
    recent = history[-window:]
    kept = sizes[-window:]
    while recent and (sum(kept) > budget or recent[0]["role"] == "assistant"):
        recent, kept = recent[1:], kept[1:]
    count(prompt), count(reply)
    return [{"role": "system", "content": system}, *recent, {"role": "user", "content": prompt}]


def per_turn(build, canvas: Canvas, window: int, rng: random.Random) -> float:
    texts = [(sentence(rng, 30), sentence(rng, 20), sentence(rng, 40)) for _ in range(TURNS)]
    samples = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for system, prompt, reply in texts:
            build(canvas, window, system, prompt, reply)
        samples.append((time.perf_counter() - t0) / TURNS)
        # New texts for the next repeat: a real turn never re-counts the same prompt.
        texts = [(s + " x", p + " y", r + " z") for s, p, r in texts]
    return statistics.median(samples)


def main() -> int:
    rng = random.Random(7)
    encoding()  # load the BPE once, outside the timings
    ok = True
    print(
        f"prompt build per turn (median of {ROUNDS}×{TURNS} turns; context {CONTEXT}, max_tokens {MAX_TOKENS})"
    )
    print(
        f"{'window':>6} {'history':>8} {'ours µs':>9} {'naive µs':>9} {'naive/ours':>10} {'ours vs 10':>10}"
    )
    for window in WINDOWS:
        base = None
        for size in SIZES:
            canvas = make_canvas(size, rng)
            same = ours(canvas, window, "s", "p", "r") == naive(canvas, window, "s", "p", "r")
            assert same, "the two builds disagree on the history"
            t_ours = per_turn(ours, canvas, window, rng)
            t_naive = per_turn(naive, canvas, window, rng)
            base = base or t_ours
            growth = t_ours / base
            print(
                f"{window:>6} {size:>8} {t_ours * 1e6:>9.1f} {t_naive * 1e6:>9.1f} "
                f"{t_naive / t_ours:>9.1f}× {growth:>9.2f}×"
            )
            if size == SIZES[-1] and growth > 2.0:
                ok = False
    print("goal (1,000 messages ≤ 2× 10 messages):", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
