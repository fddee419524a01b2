"""A small per-process memo: what was worked out once for a key, kept for the next time.

Used where every turn would otherwise redo the same work for the same DSL text
(load-time checks, component params and their references). Bounded: past
``size`` entries the oldest goes first.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any


class BoundedMemo:
    """A thread-safe mapping of at most ``size`` entries; the oldest is dropped first."""

    def __init__(self, size: int):
        self.size = size
        self._entries: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        """The value remembered for ``key``, or ``None``."""
        return self._entries.get(key)

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            if key not in self._entries and len(self._entries) >= self.size:
                self._entries.pop(next(iter(self._entries)))
            self._entries[key] = value
