"""Operating the server: Prometheus metrics, JSON logs without tokens, OpenTelemetry traces.

**Metrics** (:func:`metrics`, served at ``/metrics``) are ``prometheus_client``
objects made on first use. Under gunicorn every worker is a process of its own, so
``agentcanvas serve`` points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh folder before the
workers start (:func:`prepare_multiprocess`); each worker then writes its counts
there and ``/metrics``, whichever worker answers, adds them all up. Without that
variable (tests, ``--dev``) the counts are this process's. ``prometheus_client`` must
not be imported before the variable is set, hence the lazy import.

**Logs** (:func:`configure_logging`): one JSON object per line with ``time``,
``level``, ``logger``, ``message``, and ``task_id`` / ``session_id`` while a turn runs
(:func:`log_context`), plus ``trace_id`` when tracing. Every line, gunicorn's
included, passes :func:`scrub`, which masks API and embed tokens and bearer
credentials, so no token reaches a log.

**Traces**: ``AGENTCANVAS_TRACES_EXPORTER`` (``console`` or ``otlp``; or the standard
``OTEL_TRACES_EXPORTER``) installs an SDK tracer provider (:func:`configure_tracing`);
each turn is then a ``turn`` span holding a span per node and per LLM call (see
:mod:`agent.telemetry`). Unset, tracing costs nothing.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import trace

from agent import telemetry as agent_telemetry

log = logging.getLogger("agentcanvas.turns")
_metrics: Metrics | None = None
_metrics_lock = threading.Lock()
# This process's id, for prometheus_client's multiprocess values (see _values_by_process).
_pid = os.getpid()


def _process_id() -> int:
    return _pid


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)
_values_installed = False


def _values_by_process() -> None:
    """Under gunicorn (``PROMETHEUS_MULTIPROC_DIR`` set), metric values that learn this
    process's id from :func:`_process_id`, kept up to date across a fork, instead of
    asking the kernel: prometheus_client's multiprocess value calls ``os.getpid()`` on
    every change to notice a fork, a system call (0.4 us here) four times a turn. Its
    own ``MultiProcessValue(process_identifier)``, made once, before the first metric."""
    global _values_installed
    from prometheus_client import values

    if not _values_installed and getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue(_process_id)
    _values_installed = True


class Metrics:
    """The server's metrics (names start with ``agentcanvas_``)."""

    def __init__(self) -> None:
        _values_by_process()
        from prometheus_client import Counter, Gauge, Histogram

        self.turns = _Labelled(
            Counter(
                "agentcanvas_turns_total",
                "Turns by how they ended: succeeded, paused, failed, cancelled, not_saved",
                ["outcome"],
            )
        )
        self.turn_seconds = _Labelled(
            Histogram(
                "agentcanvas_turn_seconds",
                "Turn duration from the claim to the end of the commit, by outcome",
                ["outcome"],
                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            )
        )
        self.busy = Counter("agentcanvas_busy_total", "Requests answered 409: the session is busy")
        self.leases = Gauge(
            "agentcanvas_leases_held", "Session leases held by running turns", multiprocess_mode="livesum"
        )
        self.parse_tasks = _Labelled(
            Counter(
                "agentcanvas_parse_tasks_total",
                "Document parse tasks by how they ended: done, failed",
                ["outcome"],
            )
        )
        self.llm_tokens = _Labelled(
            Counter("agentcanvas_llm_tokens_total", "LLM tokens used: prompt, completion", ["kind"])
        )
        self.llm_calls = _Labelled(
            Counter("agentcanvas_llm_calls_total", "LLM calls by provider", ["provider"])
        )
        self.llm_errors = _Labelled(
            Counter(
                "agentcanvas_llm_errors_total",
                "LLM calls that failed, by error type",
                ["provider", "error_type"],
            )
        )
        self.db_errors = _Labelled(
            Counter("agentcanvas_db_errors_total", "Database errors, by where they were met", ["where"])
        )
        self.rate_limited = _Labelled(
            Counter(
                "agentcanvas_rate_limited_total", "Requests answered 429 by a rate limit, by scope", ["scope"]
            )
        )
        self.canvas_cache = _Labelled(
            Counter(
                "agentcanvas_canvas_cache_total",
                "Turns on an existing session by whether this worker had kept its canvas: hit, miss;"
                " stale: a blocking turn ran on the row this worker kept, found the session written"
                " elsewhere since, and ran again from a read (counted a miss too)",
                ["outcome"],
            )
        )
        # outcome -> its record(seconds) of ``turns`` and ``turn_seconds``
        self._turn_records: dict[str, Callable[[float], None]] = {}
        agent_telemetry.observe_llm_calls(self._llm_call)

    def record_turn(self, outcome: str) -> Callable[[float], None]:
        """``record(seconds)``: count a turn that ended ``outcome`` (``turns``) and observe how
        long it took (``turn_seconds``)."""
        found = self._turn_records.get(outcome)
        if found is None:
            found = self._turn_records[outcome] = _turn_recorder(
                self.turns.labels(outcome), self.turn_seconds.labels(outcome)
            )
        return found

    def _llm_call(self, provider: str, model: str, usage: dict | None, error: BaseException | None) -> None:
        provider = provider or "default"
        self.llm_calls.labels(provider).inc()
        if usage:
            self.llm_tokens.labels("prompt").inc(int(usage.get("prompt_tokens") or 0))
            self.llm_tokens.labels("completion").inc(int(usage.get("completion_tokens") or 0))
        if error is not None:
            self.llm_errors.labels(provider, type(error).__name__).inc()


class _Labelled:
    """A labelled metric whose children are looked up once per label values:
    prometheus_client's ``labels()`` checks the values and takes a lock on every call,
    and the turn path calls it three times a turn."""

    def __init__(self, metric: Any):
        self.metric = metric
        self._children: dict[tuple, Any] = {}
        self._adders: dict[str, Callable[[float], None]] = {}

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child

    def adder(self, value: str) -> Callable[[float], None]:
        """``add(amount)`` of the counter's child labelled ``value`` (one label), as its
        ``inc(amount)`` (:func:`_counter_adder`); the child is made on first use, as by ``labels``."""
        found = self._adders.get(value)
        if found is None:
            found = self._adders[value] = _counter_adder(self.labels(value))
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.metric, name)


def _counter_adder(child: Any) -> Callable[[float], None]:
    """``add(amount)``, what a counter child's ``inc(amount)`` does for a non-negative amount:
    its value's ``inc``, without the public method's checks (is it a child? is the amount
    negative? an exemplar?), a third of the work. Another ``prometheus_client`` without
    that value: ``inc`` itself (tests/api/test_telemetry.py compares the two)."""
    value = getattr(child, "_value", None)
    return value.inc if callable(getattr(value, "inc", None)) else child.inc


def _turn_recorder(count: Any, histogram: Any) -> Callable[[float], None]:
    """``record(seconds)``: ``count.inc()`` and ``histogram.observe(seconds)`` (children of
    ``turns`` and ``turn_seconds``), adding to their values directly: ``observe`` checks
    the child and walks the buckets up to the one that takes the value (the first bound
    at or above it: :func:`bisect.bisect_left`). Where the histogram's values are not
    at hand (another ``prometheus_client``), its public methods."""
    add_count = _counter_adder(count)
    try:
        add_sum = histogram._sum.inc
        bounds = list(histogram._upper_bounds)
        add_bucket = [bucket.inc for bucket in histogram._buckets]
        if len(add_bucket) != len(bounds):
            raise TypeError("buckets and bounds differ")
    except (AttributeError, TypeError):

        def record(seconds: float) -> None:
            add_count(1)
            histogram.observe(seconds)

        return record

    def record(seconds: float) -> None:
        add_count(1)
        add_sum(seconds)
        add_bucket[bisect.bisect_left(bounds, seconds)](1)

    return record


def metrics() -> Metrics:
    """This process's metrics (made on first use)."""
    global _metrics
    if _metrics is None:
        with _metrics_lock:
            if _metrics is None:
                _metrics = Metrics()
    return _metrics


def render_metrics() -> tuple[bytes, str]:
    """``(body, content type)`` of ``/metrics``: every worker's counts when under gunicorn."""
    metrics()
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def prepare_multiprocess() -> str:
    """Before gunicorn forks: a fresh folder for the workers' metric files; its path.

    An operator's ``PROMETHEUS_MULTIPROC_DIR`` is used as given (it should be emptied
    between runs, as prometheus_client says); otherwise a temporary folder is made and
    removed when the server exits.
    """
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        os.makedirs(given, exist_ok=True)
        return given
    folder = tempfile.mkdtemp(prefix="agentcanvas-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    import atexit

    atexit.register(shutil.rmtree, folder, True)
    return folder


def worker_exited(pid: int) -> None:
    """gunicorn's ``child_exit``: a dead worker's live gauges stop counting."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


# ---------------------------------------------------------------------- turns
class _ActiveTurn:
    """A turn's span current and its ids on every log line while entered
    (:meth:`TurnObserver.active`; a class: entered for every turn, so kept cheap)."""

    __slots__ = ("_span_use", "_token", "_turn")

    def __init__(self, turn: TurnObserver):
        self._turn = turn
        self._span_use: Any = None
        self._token: Any = None

    def __enter__(self) -> None:
        turn = self._turn if self._turn is not None else self  # type: ignore[assignment] - a TurnObserver
        if turn.span is not None:
            self._span_use = trace.use_span(turn.span)
            self._span_use.__enter__()
        outer = _context.get()
        fields = turn.log_fields
        self._token = _context.set({**outer, **fields} if outer else fields)

    def __exit__(self, *exc: Any) -> bool | None:
        _context.reset(self._token)
        return self._span_use.__exit__(*exc) if self._span_use is not None else None


class TurnObserver(_ActiveTurn):
    """One turn's span, log context and metrics, from its start to its commit.

    A turn may run in two threads (the request's until it takes its lease, then a
    worker's): the thread that made the observer enters it (``with observer:``), any
    other enters :meth:`active`; :meth:`finish` ends the turn once.
    """

    __slots__ = ("leased", "log_fields", "session_id", "span", "started", "task_id")

    def __init__(self, session_id: str, task_id: str, agent_id: str):
        # Entered itself, in the thread that made it: ``_turn`` is None, not the observer,
        # which would make every turn's observer a reference cycle, left (with its log
        # fields and context token) for the cyclic collector to find.
        self._turn = self._span_use = self._token = None
        self.started = time.monotonic()
        self.session_id = session_id
        self.task_id = task_id
        self.leased = False
        # What the turn adds to the log context (:func:`log_context`), made once.
        self.log_fields = (
            {"task_id": task_id, "session_id": session_id}
            if task_id and session_id
            else {k: v for k, v in (("task_id", task_id), ("session_id", session_id)) if v}
        )
        self.span = (
            agent_telemetry.tracer.start_span(
                "turn",
                attributes={
                    "agentcanvas.session_id": session_id,
                    "agentcanvas.task_id": task_id,
                    "agentcanvas.agent_id": agent_id,
                },
            )
            if agent_telemetry.tracing_enabled()
            else None
        )

    def active(self) -> contextlib.AbstractContextManager:
        """The turn's span is current and its ids are on every log line meanwhile (for a
        thread other than the one that made the observer, which enters it directly)."""
        return _ActiveTurn(self)

    def lease_taken(self) -> None:
        """The turn holds its session's lease now (``agentcanvas_leases_held``)."""
        if not self.leased:
            self.leased = True
            metrics().leases.inc()

    def finish(self, outcome: str | None) -> None:
        """The turn ended ``outcome`` (``succeeded``, ``paused``, ``failed``, ``cancelled``,
        ``not_saved``); ``None``: it was refused (409) and is not counted as a turn."""
        m = metrics()
        if self.leased:
            self.leased = False
            m.leases.dec()
        seconds = time.monotonic() - self.started
        if outcome is not None:
            if self.span is not None:
                self.span.set_attribute("agentcanvas.outcome", outcome)
            if log.isEnabledFor(logging.INFO):
                self._log_end(outcome, seconds)
            m.record_turn(outcome)(seconds)
        if self.span is not None:
            self.span.end()

    def _log_end(self, outcome: str, seconds: float) -> None:
        """The turn's info line, ``turn <outcome> in <seconds> s``, with its ids.

        When the line goes only to the handler :func:`configure_logging` installed
        (JSON, no filters), it is written here as :class:`JsonFormatter` writes it: in
        a server the logging module's generic path (a record of a dozen fields, the
        caller's frame, the handler chain) took 40-100 us a turn with the caches cold
        from the turn, against 20-40 us written here. Without tracing there is no span
        to make current for it, so the turn's ids are added to the line as it is made.
        """
        handler = _sole_json_handler(log)
        if handler is not None:
            pid = os.getpid() if logging.logProcesses else None
            # The text log.info below makes of it (no token can be in it: no scrub).
            message = f"turn {outcome} in {seconds:.3f} s"
            if agent_telemetry.tracing_enabled():
                with self.active():  # the turn's span current: its ids go on the line
                    line = _json_line(time.time(), None, "info", log.name, pid, message)
                text = JsonFormatter.encode(line) + handler.terminator
            else:
                text = _json_line_text(time.time(), "info", log.name, pid, message, self.log_fields)
                text += handler.terminator
            handler.acquire()
            try:
                handler.stream.write(text)
                handler.flush()
                return
            except Exception:  # noqa: BLE001, S110 - logged the standard way below, which reports it
                pass
            finally:
                handler.release()
        with self.active():
            log.info("turn %s in %.3f s", outcome, seconds)


def _sole_json_handler(logger: logging.Logger) -> logging.StreamHandler | None:
    """The handler an INFO record of ``logger`` would reach, if that is the only one and it
    is the :class:`_ServerHandler` of :func:`configure_logging`, with no filter on the way."""
    if logger.disabled:
        return None
    found = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if (
                found is not None
                or type(handler) is not _ServerHandler
                or handler.filters
                or type(handler.formatter) is not JsonFormatter
                or handler.level > logging.INFO
            ):
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent  # type: ignore[assignment]
    return found


# ---------------------------------------------------------------------- logs
_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "agentcanvas_log_context", default=None
)

# API and embed tokens (api.services.tokens), and whatever follows "Bearer".
_SECRETS = re.compile(r"\b(?:acembed|ac)-[A-Za-z0-9_\-]{16,}|(?i:bearer)\s+[^\s\"',;]+")


def scrub(text: str) -> str:
    """``text`` with every token and bearer credential replaced by ``***``."""
    return _SECRETS.sub(lambda m: "Bearer ***" if m.group(0)[:6].lower() == "bearer" else "***", text)


@contextlib.contextmanager
def log_context(**fields: str) -> Iterator[None]:
    """Add ``fields`` (``task_id``, ``session_id``) to every log line of this thread meanwhile."""
    token = _context.set({**(_context.get() or {}), **{k: v for k, v in fields.items() if v}})
    try:
        yield
    finally:
        _context.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, tokens scrubbed."""

    @staticmethod
    def encode(line: dict[str, Any]) -> str:
        """``line`` as the ``json`` module writes it (``", "`` and ``": "`` between items,
        non-ASCII kept, anything else as ``str()``)."""
        return _flat_json(line) or _encode_json(line)

    def format(self, record: logging.LogRecord) -> str:
        line = _json_line(
            record.created,
            record.msecs,
            record.levelname.lower(),
            record.name,
            record.process,
            scrub(record.getMessage()),
        )
        if record.exc_info:
            line["exception"] = scrub(self.formatException(record.exc_info))
        return self.encode(line)


# The last second a JSON line was written in: (whole seconds, its text in UTC).
_second: tuple[int, str] = (-1, "")


_encode_json = json.JSONEncoder(ensure_ascii=False, default=str).encode
_json_text = json.encoder.encode_basestring  # a JSON string, non-ASCII kept, as _encode_json writes it


def _flat_json(line: dict[str, Any]) -> str | None:
    """``_encode_json(line)`` for an object of text keys and text, whole-number or null
    values (what a log line usually is), else ``None``.

    The ``json`` module builds its C encoder anew for every call, which cost more than
    writing the few items of a line itself.
    """
    items = []
    for key, value in line.items():
        kind = type(value)
        if kind is str:
            text = _json_text(value)
        elif kind is int:
            text = int.__repr__(value)
        elif value is None:
            text = "null"
        else:
            return None
        if type(key) is not str:
            return None
        items.append(f"{_json_text(key)}: {text}")
    return "{" + ", ".join(items) + "}"


def _json_line(
    created: float,
    msecs: float | None,
    level: str,
    logger: str,
    pid: int | None,
    message: str,
    own: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A JSON log line's fields: these, then the log context of this thread
    (:func:`log_context`) and ``own`` (as if added by it), and the current span's ids
    when tracing."""
    line: dict[str, Any] = {
        "time": _json_time(created, msecs),
        "level": level,
        "logger": logger,
        "pid": pid,
        "message": message,
    }
    context = _context.get()
    if context:
        line.update(context)
    if own:
        line.update(own)
    if agent_telemetry.tracing_enabled():  # else no span records, and there are no ids
        line.update(agent_telemetry.current_trace_ids())
    return line


#: The fields every JSON log line starts with.
_LINE_KEYS = frozenset({"time", "level", "logger", "pid", "message"})


def _json_line_text(
    created: float, level: str, logger: str, pid: int | None, message: str, own: dict[str, str]
) -> str:
    """``JsonFormatter.encode(_json_line(created, None, level, logger, pid, message, own))``
    while not tracing, written straight: the fixed fields need no encoder, and the log
    context of text values is written by :func:`_flat_json` (anything else, or a context
    key that replaces a fixed field, takes the generic way)."""
    context = _context.get()
    fields = {**context, **own} if context else own
    extra = _flat_json(fields) if _LINE_KEYS.isdisjoint(fields) else None
    if extra is None:
        return JsonFormatter.encode(_json_line(created, None, level, logger, pid, message, own))
    head = (
        f'{{"time": "{_json_time(created)}", "level": {_json_text(level)}, "logger": {_json_text(logger)}, '
        f'"pid": {"null" if pid is None else int.__repr__(pid)}, "message": {_json_text(message)}'
    )
    return f"{head}, {extra[1:]}" if fields else head + "}"


def _json_time(created: float, msecs: float | None = None) -> str:
    """``2026-11-30T20:15:00.123Z``: a record's ``created`` time (and ``msecs``, as
    logging computes it) in UTC; the date and time formatted once per second."""
    global _second
    second = int(created)
    cached = _second
    if cached[0] != second:
        cached = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        _second = cached
    if msecs is None:
        msecs = int((created - second) * 1000)
    return f"{cached[1]}.{int(msecs):03d}Z"


class _ServerHandler(logging.StreamHandler):
    """The handler :func:`configure_logging` installs (a StreamHandler to standard error)."""


class ScrubbingFormatter(logging.Formatter):
    """The plain text format, tokens scrubbed."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


def formatter(kind: str) -> logging.Formatter:
    if kind == "text":
        return ScrubbingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    return JsonFormatter()


#: ``log.level`` values. ``warning`` leaves out the line each turn writes at ``info``
#: (about as much work as routing the request), keeping warnings and errors.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def configure_logging(kind: str = "json", level: str = "INFO") -> None:
    """Send the ``agentcanvas`` loggers to standard error, one line per record (``json``
    or ``text``) at ``level`` and above, tokens scrubbed. For server processes; a
    library user keeps theirs."""
    if kind not in ("json", "text"):
        raise ValueError(f"log format {kind!r} is not json or text (setting log.format)")
    if str(level).upper() not in LOG_LEVELS:
        raise ValueError(
            f"log level {level!r} is not one of {', '.join(LOG_LEVELS).lower()} "
            f"(setting log.level, AGENTCANVAS_LOG_LEVEL)"
        )
    handler = _ServerHandler()
    handler.setFormatter(formatter(kind))
    logger = logging.getLogger("agentcanvas")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(str(level).upper())
    logger.propagate = False


def gunicorn_logger_class(kind: str) -> type:
    """A gunicorn logger whose error and access lines use our format (and are scrubbed)."""
    from gunicorn.glogging import Logger

    class AgentcanvasGunicornLogger(Logger):
        def setup(self, cfg: Any) -> None:
            super().setup(cfg)
            for log in (self.error_log, self.access_log):
                for handler in log.handlers:
                    handler.setFormatter(formatter(kind))

    return AgentcanvasGunicornLogger


# ---------------------------------------------------------------------- traces
_tracing_configured = False


def configure_tracing_once() -> None:
    """:func:`configure_tracing` from the environment, the first time a process asks
    (``create_app``: in each gunicorn worker, after the fork)."""
    global _tracing_configured
    if not _tracing_configured:
        _tracing_configured = True
        configure_tracing()


def configure_tracing(exporter: str | None = None) -> bool:
    """Install an SDK tracer provider exporting to ``exporter`` (``console`` or ``otlp``;
    default from ``AGENTCANVAS_TRACES_EXPORTER`` / ``OTEL_TRACES_EXPORTER``). Returns
    whether tracing is on. Once per process; ``none`` or empty leaves it off."""
    name = (
        exporter
        or os.environ.get("AGENTCANVAS_TRACES_EXPORTER")
        or os.environ.get("OTEL_TRACES_EXPORTER")
        or ""
    ).lower()
    if name in ("", "none"):
        return False
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if name == "console":
        span_exporter = ConsoleSpanExporter()
    elif name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ValueError(
                "traces exporter 'otlp' needs opentelemetry-exporter-otlp-proto-http: "
                "pip install 'agentcanvas[otlp]'"
            ) from None
        span_exporter = OTLPSpanExporter()  # endpoint from OTEL_EXPORTER_OTLP_* variables
    else:
        raise ValueError(
            f"traces exporter {name!r} is not console, otlp or none (AGENTCANVAS_TRACES_EXPORTER)"
        )
    provider = TracerProvider(resource=Resource.create({"service.name": "agentcanvas"}))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    trace.set_tracer_provider(provider)
    return True
