"""A WSGI app that answers with the pid of the worker and the thread that served it,
served by ``api.cli.run_gunicorn`` as ``agentcanvas serve`` is, for tests of how
connections spread over the workers and requests over their threads.

    python -m tests.pid_server PORT WORKERS THREADS

``GET /`` answers ``pid <n> thread <native thread id>`` after ``PID_SERVER_HOLD`` seconds (default 0), kept alive.
"""

from __future__ import annotations

import os
import sys
import threading
import time


def make_app():  # noqa: ANN201 - a WSGI callable
    hold = float(os.environ.get("PID_SERVER_HOLD", "0"))

    def app(_environ, start_response):  # noqa: ANN001, ANN202 - the WSGI signature
        if hold:
            time.sleep(hold)
        body = f"pid {os.getpid()} thread {threading.get_native_id()}".encode()
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def main() -> None:
    from api.cli import run_gunicorn

    port, workers, threads = (int(a) for a in sys.argv[1:4])
    run_gunicorn(make_app, "127.0.0.1", port, workers, threads)


if __name__ == "__main__":
    main()
