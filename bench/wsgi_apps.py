"""Ours' WSGI app against the floor's, called in this process, side by side.

At one client, ``bench/http.py``'s ratio is the ratio of the two servers' CPU time per
request: the client's work overlaps with the server's, so the server's CPU time is the
wall time, and the server's own part (gunicorn's parse, poll, hand-off and write, about
as much for both) is the same code for both. It is so the ratio of the two apps diluted
by that shared part. The apps' own ratio moves little from run to run where the HTTP
figure moves by several percent, so a change to ours' app of 2% shows here. On 2026-12-05
(2-core Xeon VM): ours 191 us, the floor 133 us, 1.43-1.45 (1.48 before the history's
entries were found by identity, ``agent/canvas.py`` ``_dropped``); over HTTP, 1.31-1.44.
The same day on a 2-core AMD EPYC VM: ours 237-263 us, the floor 182-191 us, 1.31-1.37;
over HTTP, 1.18-1.34. This loop runs each app on warm caches, 400 requests in a row; a
server runs it on colder ones (bench/cold.py), which weighs more on ours' larger turn:
read the ratio here as the direction and size of a change, not as the HTTP figure.

The apps are those ``bench/http.py`` serves, each on its own SQLite file: **ours**,
``api.create_app()`` (the whole app ``agentcanvas serve`` serves, the completion lane
in front of Flask included; built as bench/turns.py's ours), and the **floor**,
``bench/support/floor_app.make_app`` (with ``--floor-canvas`` also the **floor+canvas**). Each is called directly with environs
shaped like gunicorn's, holding the same request bodies and headers that
``bench/http.py`` sends (the intake form's question, then its answers, on ``--sessions``
sessions in turn), and its reply is read to the end. They play **by blocks** of
``--block`` requests, in an order drawn anew each round, for ``--rounds`` rounds, each
block timed in this thread's CPU time. Printed: each app's median CPU time per request,
and the median over rounds of its ratio to the floor's in the same round.

    .venv/bin/python bench/wsgi_apps.py [--rounds 20] [--block 400] [--sessions 8] [--floor-canvas]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

from _path import BENCH, load_bench

sys.path.insert(0, os.path.join(BENCH, "support"))

bench_http = load_bench("http")


def environ_for(path: str, body: dict, headers: dict[str, str]) -> tuple[dict, bytes]:
    """An environ as gunicorn makes one for a keep-alive ``POST`` of ``body`` as JSON (its
    ``wsgi.input`` set per call), and the body's bytes."""
    raw = json.dumps(body).encode()
    environ = {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "RAW_URI": path,
        "SERVER_PROTOCOL": "HTTP/1.1",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "REMOTE_ADDR": "127.0.0.1",
        "REMOTE_PORT": "50000",
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        "wsgi.errors": sys.stderr,
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(raw)),
        "HTTP_HOST": "127.0.0.1:8000",
        "HTTP_CONNECTION": "keep-alive",
    }
    for name, value in headers.items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    return environ, raw


class Subject:
    """A WSGI app and its requests: per session, the form's question then its answers."""

    def __init__(self, name: str, app: Callable, requests: list[list[tuple[dict, bytes]]]):
        self.name, self.app, self.requests = name, app, requests
        self.next = 0

    def play(self, count: int) -> float:
        """``count`` requests, the sessions in turn; CPU seconds per request."""
        app, requests = self.app, self.requests
        start = time.thread_time()
        for _ in range(count):
            k = self.next
            self.next += 1
            environ, raw = requests[k % len(requests)][(k // len(requests)) % 2]
            environ = dict(environ)
            environ["wsgi.input"] = io.BytesIO(raw)
            reply = app(environ, _start_response)
            for _chunk in reply:
                pass
            close = getattr(reply, "close", None)
            if close is not None:
                close()
        return (time.thread_time() - start) / count


def _start_response(status: str, headers: list, exc_info: object = None) -> None:
    if not status.startswith("200"):
        raise RuntimeError(f"the app answered {status}")


def ours(tmp: str, sessions: int) -> Subject:
    """Ours on its own SQLite file (bench/turns.py's app, tenant and intake agent), a
    token of its tenant and ``sessions`` sessions."""
    os.environ.update(bench_http.NO_TRANSCRIPT_CAP)
    from api.services import tokens

    made = load_bench("turns").Ours(f"sqlite:///{tmp}/ours.db")
    with made.app.app_context():
        plain, _ = tokens.create_token(made.tenant_id, "api")
        session_ids = [made.session_id] + [made._new_session() for _ in range(sessions - 1)]  # noqa: SLF001
    auth = {"Authorization": f"Bearer {plain}"}
    path = f"/api/v1/agents/{made.agent_id}/completions"
    requests = [
        [
            environ_for(path, {"session_id": session_id, "stream": False, **body}, auth)
            for body in ({"question": "sign me up"}, {"inputs": bench_http.ANSWERS})
        ]
        for session_id in session_ids
    ]
    return Subject("ours", made.app, requests)


def floor(tmp: str, sessions: int, canvas: bool) -> Subject:
    """The floor app (``canvas``: floor+canvas) on its own SQLite file, ``sessions`` rows made."""
    import floor_app

    from agent.canvas import Canvas

    name = "floor+canvas" if canvas else "floor"
    url = f"sqlite:///{tmp}/{name}.db"
    snapshot = Canvas(bench_http.intake_dsl())
    snapshot.reset()
    floor_app.Store(url).seed(str(snapshot), sessions)
    requests = [
        [
            environ_for("/turn", {"session_id": f"s{i}", "stream": False, **body}, {})
            for body in ({"question": "sign me up"}, {"inputs": bench_http.ANSWERS})
        ]
        for i in range(sessions)
    ]
    return Subject(name, floor_app.make_app(url, canvas), requests)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--block", type=int, default=400, help="requests a subject plays in a row (even)")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1000, help="requests each subject plays first, untimed")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--floor-canvas", action="store_true", help="also the floor running the canvas")
    args = parser.parse_args()
    if args.rounds < 1 or args.block < 2 or args.sessions < 1:
        parser.error("--rounds and --sessions must be at least 1, --block at least 2")
    tmp = tempfile.mkdtemp(prefix="agentcanvas-bench-wsgi-")
    subjects: list[Subject] = []
    try:
        subjects.append(ours(tmp, args.sessions))
        subjects.append(floor(tmp, args.sessions, False))
        if args.floor_canvas:
            subjects.append(floor(tmp, args.sessions, True))
        for subject in subjects:
            subject.play(args.warmup)
        rng = random.Random(args.seed)
        times: dict[str, list[float]] = {s.name: [] for s in subjects}
        for _ in range(args.rounds):
            for subject in rng.sample(subjects, len(subjects)):
                times[subject.name].append(subject.play(args.block))
    finally:
        if subjects:
            from api import stop_background

            stop_background(subjects[0].app)  # its parse threads poll the database dropped next
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"\nthe apps called in process, by blocks of {args.block} requests over {args.sessions} sessions, "
        f"{args.rounds} rounds: CPU us per request, median [min–max]; ratio to the floor in the same round"
    )
    for name, values in times.items():
        ratios = [v / f for v, f in zip(values, times["floor"], strict=True)]
        print(
            f"  {name:<13}{bench_http.spread([v * 1e6 for v in values], '{:.1f}'):>24}"
            f"   /floor {bench_http.spread(ratios, '{:.3f}')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
