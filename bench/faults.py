"""The database outage figures: a private MariaDB killed and restarted under 8 clients.

    .venv/bin/python bench/faults.py [--rounds N] [--down SECONDS]

Runs the scenario of ``tests/e2e/faults.py`` (2 workers, 8 clients on counter
sessions, the private mariadbd SIGKILLed mid-run and started again; the shared
MariaDB is never touched) and prints, per round and summed: turns acknowledged,
persisted, lost, double-applied, wrong "not saved" replies, "outcome unknown"
replies, the longest a session answered "busy" after the database was back, and the
seconds from the restart to the first successful turn; and for a ninth client that
sends first messages only (no session id): replies, acknowledged, lost (not stored
in the session the reply names), wrong "not saved", sessions left busy.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import _path  # noqa: F401 - the project root on sys.path

from tests.e2e.faults import run_outage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--down", type=float, default=2.0, help="seconds the database stays down")
    parser.add_argument("--after", type=float, default=5.0, help="seconds of load after the restart")
    args = parser.parse_args()
    for n in range(1, args.rounds + 1):
        with tempfile.TemporaryDirectory(prefix="agentcanvas-faults-") as folder:
            figures = run_outage(Path(folder), down=args.down, after=args.after)
        print(f"round {n} (8 clients and a first-message one, 2 workers, database down {args.down:g} s):")
        for line in figures.lines():
            print("  " + line)


if __name__ == "__main__":
    main()
