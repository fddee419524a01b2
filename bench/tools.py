"""CodeExec start-to-result time against a bare interpreter, side by side.

For a trivial program in Python and in JavaScript, times (interleaved, so both see
the same machine load):

* ``CodeExec``: a canvas running one CodeExec node (the bubblewrap sandbox with its
  rlimits, the runner, JSON in and out) — from ``run()`` to the result;
* ``bare``: ``python3 -c`` / ``node -e`` of the same program, started with
  ``subprocess.run`` in the same minimal environment the sandbox gives, its output read.

Prints p50 and p99 of each and the ratio CodeExec / bare.

    .venv/bin/python bench/tools.py [--repeat 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import _path  # noqa: F401 - the project on the path, bench/ off it

from agent import sandbox  # noqa: E402
from agent.canvas import Canvas  # noqa: E402

# The environment the sandbox gives its program. Inheriting the server's instead would
# charge the bare run for whatever it holds (NODE_EXTRA_CA_CERTS alone makes node read
# the whole CA bundle at start, about 0.2 s here).
BARE_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}

PROGRAMS = {
    "python": (
        "def main(n):\n    return {'sum': sum(range(n))}\n",
        ["/usr/bin/python3", "-c", "import json; print(json.dumps({'sum': sum(range(100))}))"],
    ),
    "javascript": (
        "function main(args) { let s = 0; for (let i = 0; i < args.n; i++) s += i; return {sum: s}; }\n"
        "module.exports = { main };\n",
        [
            "/usr/bin/node",
            "-e",
            "let s = 0; for (let i = 0; i < 100; i++) s += i; console.log(JSON.stringify({sum: s}))",
        ],
    ),
}


def canvas_for(lang: str, script: str) -> str:
    dsl = {
        "components": {
            "begin": {
                "obj": {"component_name": "Begin", "params": {}},
                "downstream": ["CodeExec:Run"],
                "upstream": [],
            },
            "CodeExec:Run": {
                "obj": {
                    "component_name": "CodeExec",
                    "params": {"lang": lang, "script": script, "arguments": {"n": 100}},
                },
                "downstream": [],
                "upstream": ["begin"],
            },
        },
        "path": [],
        "history": [],
        "retrieval": [],
    }
    return json.dumps(dsl)


def time_codeexec(dsl: str) -> float:
    canvas = Canvas(dsl, services={"tools": {"codeexec": {"timeout_seconds": 30}}})
    started = time.perf_counter()
    events = list(canvas.run(query="go"))
    elapsed = time.perf_counter() - started
    assert events[-1]["data"]["status"] == "succeeded", events[-1]
    return elapsed


def time_bare(command: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, check=True, env=BARE_ENV)
    elapsed = time.perf_counter() - started
    assert b"4950" in done.stdout
    return elapsed


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=60)
    args = parser.parse_args()
    missing = sandbox.available()
    if missing:
        print(f"cannot run: {missing}", file=sys.stderr)
        return 1
    print(f"CodeExec vs a bare interpreter, {args.repeat} runs each, interleaved (ms)")
    print(f"{'language':<11} {'what':<9} {'p50':>8} {'p99':>8}   ratio p50 / p99")
    for lang, (script, bare) in PROGRAMS.items():
        dsl = canvas_for(lang, script)
        time_codeexec(dsl)  # warm both (imports, page cache)
        time_bare(bare)
        ours, theirs = [], []
        for _ in range(args.repeat):
            ours.append(time_codeexec(dsl))
            theirs.append(time_bare(bare))
        o50, o99, b50, b99 = (pct(ours, 0.5), pct(ours, 0.99), pct(theirs, 0.5), pct(theirs, 0.99))
        print(
            f"{lang:<11} {'CodeExec':<9} {o50 * 1000:8.1f} {o99 * 1000:8.1f}   {o50 / b50:5.2f}x / {o99 / b99:5.2f}x"
        )
        print(f"{'':<11} {'bare':<9} {b50 * 1000:8.1f} {b99 * 1000:8.1f}")
        print(
            f"{'':<11} mean CodeExec {statistics.mean(ours) * 1000:.1f} ms, bare {statistics.mean(theirs) * 1000:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
