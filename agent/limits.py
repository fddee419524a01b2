"""A canvas's limits, in a module of their own: the API's configuration reads them
(:func:`api.config.canvas_limits`) without importing the runtime."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class Limits:
    """Per-canvas limits (docs/design.md §11); the API fills them from its configuration."""

    max_steps: int = 1000
    max_seconds: float = 600.0
    max_snapshot_bytes: int = 16 * 1024 * 1024
    max_dsl_bytes: int = 4 * 1024 * 1024
    max_components: int = 500
    max_value_bytes: int = 64 * 1024
    history_size: int = 100
    retrieval_size: int = 20
    # Files in conversations (docs/design.md §13): one file, the files one turn may carry
    # (attached and answered in forms), and all the files a session may take in.
    max_file_bytes: int = 32 * 1024 * 1024
    max_files_per_turn: int = 10
    max_session_file_bytes: int = 256 * 1024 * 1024

    @classmethod
    def from_mapping(cls, values: dict | None) -> Limits:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (values or {}).items() if k in names})
