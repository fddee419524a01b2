"""Lazily produced text: how a streamed LLM answer travels to the Message that shows it.

A component (an LLM node, say) may set an output to a :class:`LazyText`. The Message
component that references it iterates the chunks as they arrive and the canvas emits
each as a ``message`` event; anything else that reads the output gets the whole text
(consuming the stream first). After the stream ends the value is an ordinary string.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator


class LazyText:
    """Text that arrives in chunks, readable once as a stream or whole at any time.

    Args:
        chunks: the iterable of text chunks (e.g. an LLM stream).
        on_done: called with the full text once the stream is exhausted; a component
            uses it to store usage, memory and its final output.
    """

    def __init__(self, chunks: Iterable[str], on_done: Callable[[str], None] | None = None):
        self._chunks = iter(chunks)
        self._parts: list[str] = []
        self._done = False
        self._on_done = on_done

    @property
    def done(self) -> bool:
        return self._done

    def __iter__(self) -> Iterator[str]:
        """Yield the chunks not yet read (all of them the first time)."""
        if self._done:
            if self._parts:
                yield "".join(self._parts)
            return
        for chunk in self._chunks:
            if chunk:
                self._parts.append(chunk)
                yield chunk
        self._finish()

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            if self._on_done is not None:
                self._on_done("".join(self._parts))

    @property
    def text(self) -> str:
        """The whole text, reading the rest of the stream if needed."""
        if not self._done:
            for _ in self:
                pass
        return "".join(self._parts)

    def __str__(self) -> str:
        return self.text
