"""Errors raised by the runtime.

One root, ``CanvasError``, with one-line subclasses. The pause for a form is a
control-flow signal (``FormPause``) and deliberately lives outside this tree: it is
not a failure.
"""

from __future__ import annotations


class CanvasError(Exception):
    """Root of every error the runtime raises on purpose."""


class DSLError(CanvasError):
    """The DSL (or a snapshot) is malformed; the message names the component and the fix."""


class InputError(CanvasError):
    """Form answers that do not fit the pending form; nothing was changed.

    Attributes:
        errors: ``{field: message}`` for every rejected field.
    """

    def __init__(self, message: str, errors: dict[str, str] | None = None):
        super().__init__(message)
        self.errors = dict(errors or {})


class UsageError(CanvasError):
    """The caller used the API wrongly (e.g. ``inputs`` when no form is pending)."""


class ComponentError(CanvasError):
    """A component failed while running; ends the run with ``workflow_finished`` failed.

    Attributes:
        retryable: whether trying again could help; ``max_retries`` skips a failure
            that cannot (a refused address, a bad operation).
    """

    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


class LimitError(CanvasError):
    """A configured limit (steps, wall time, snapshot size, value size) was exceeded."""


class DeadlineExceeded(LimitError):
    """The turn's wall-clock budget (``max_seconds``) is spent (see :mod:`agent.deadline`)."""


class SnapshotTooLarge(LimitError):
    """The serialized snapshot is over the configured cap."""


class ComponentTimeout(ComponentError):
    """A component's own time budget (its ``timeout``) is spent (see :mod:`agent.deadline`).

    Attributes:
        seconds: the budget that was spent.
    """

    def __init__(self, message: str, seconds: float | None = None):
        super().__init__(message)
        self.seconds = seconds


class TemplateLimitError(ComponentError):
    """A template would go over a size, iteration or width limit (see :mod:`agent.templates`)."""

    def __init__(self, message: str):
        super().__init__(message, retryable=False)


class LLMError(ComponentError):
    """An LLM provider failed (HTTP error, bad answer)."""


class LLMTimeout(LLMError):
    """An LLM provider did not answer in time."""


class LLMConfigError(ComponentError):
    """No LLM provider is configured for a node; the message names the setting to add."""


class MemoryStoreError(ComponentError):
    """Conversation memory could not be read or written."""


class FormPause(Exception):  # noqa: N818 - a signal, not an error
    """Raised by a form component to pause the run; caught by the canvas."""

    def __init__(self, component_id: str):
        super().__init__(component_id)
        self.component_id = component_id


class Cancelled(Exception):  # noqa: N818 - a signal, not an error
    """Raised inside the run loop when the caller's cancellation hook says stop."""
