"""A real HTTP endpoint on 127.0.0.1 that answers one byte at a time, for deadline tests.

    with DripServer(interval=0.5) as drip:
        ... call drip.url ...
        drip.wait_closed()      # the caller hung up (the server noticed)

Each connection gets its request read, then the answer ``HTTP/1.1 200 OK`` and a long
header, one byte every ``interval`` seconds (a whole answer would take minutes): a
client whose timeout restarts with every byte never times out. ``connections``
counts the connections accepted and ``closed`` the ones whose caller went away.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

ANSWER = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"." * 400 + b"\r\nContent-Length: 2\r\n\r\nok"


class DripServer:
    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.connections = 0
        self.closed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/drip"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(4096)
                    if not data:
                        break
                    request += data
                for i in range(len(ANSWER)):
                    if self._stop.wait(self.interval):
                        return
                    conn.sendall(ANSWER[i : i + 1])
            except OSError:
                with self._lock:
                    self.closed += 1

    def wait_connections(self, count: int = 1, seconds: float = 30) -> None:
        _until(lambda: self.connections >= count, seconds, "a connection")

    def wait_closed(self, count: int = 1, seconds: float = 30) -> None:
        """Wait until ``count`` callers hung up (noticed at the next byte sent)."""
        _until(lambda: self.closed >= count, seconds, "the caller to hang up")

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def __enter__(self) -> DripServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _until(condition: Any, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.02)
