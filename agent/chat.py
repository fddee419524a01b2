"""``agentcanvas run FILE.json``: chat with a canvas in the terminal, no server.

Answers stream as they arrive; a form is asked field by field, each answer checked
against its field's type before the run resumes (a ``file`` field asks for paths; the
files are kept for this invocation only). With ``--state FILE`` the snapshot
is kept in that file and each invocation is one turn: the first call loads the DSL,
later calls continue from the file (a pending form is asked first).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable
from typing import TextIO

from agent.canvas import Canvas
from agent.errors import CanvasError, InputError
from agent.files import InMemoryFiles
from agent.forms import convert, is_optional
from agent.memory import InMemoryStore

Ask = Callable[[str], "str | None"]


def _ask_from(stream: TextIO, out: TextIO) -> Ask:
    def ask(prompt: str) -> str | None:
        out.write(prompt)
        out.flush()
        line = stream.readline()
        if not line:
            return None
        return line.rstrip("\n")

    return ask


def ask_form(form: dict, ask: Ask, out: TextIO, files: InMemoryFiles | None = None) -> dict | None:
    """Ask each field; re-ask until the answer fits its type. ``None`` on end of input.

    A ``file`` field asks for paths (several separated by spaces; quote a path with
    spaces); each file is read and checked here, and kept in ``files``.
    """
    answers = {}
    for key, field in form.items():
        label = field.get("name") or key
        ftype = field.get("type", "line")
        hint = ftype
        if ftype == "options":
            hint = " / ".join(map(str, field.get("options") or []))
        elif ftype == "file":
            hint = "path to a file; several separated by spaces"
        optional = is_optional(field)
        while True:
            raw = ask(f"  {label} [{hint}{', optional' if optional else ''}]: ")
            if raw is None:
                return None
            if raw == "" and optional:
                break
            if raw == "":
                out.write("    a value is required\n")
                continue
            try:
                answers[key] = read_files(raw, files) if ftype == "file" else convert(field, raw)
                break
            except ValueError as e:
                out.write(f"    {e}\n")
    return answers


def read_files(raw: str, files: InMemoryFiles | None) -> list[dict]:
    """The files at the paths in ``raw``, kept in ``files``; raises ``ValueError`` saying
    which path cannot be used and why."""
    if files is None:
        raise ValueError("this chat cannot take files")
    try:
        paths = shlex.split(raw)
    except ValueError as e:
        raise ValueError(f"cannot read the paths: {e}") from None
    out = []
    for path in paths:
        path = os.path.expanduser(path)
        try:
            with open(path, "rb") as fh:
                data = fh.read(files.max_file_bytes + 1)
        except OSError as e:
            raise ValueError(f"cannot read {path!r}: {e.strerror or e}") from None
        out.append(files.add(os.path.basename(path), data))
    return out


def run_turn(canvas: Canvas, query: str, inputs: dict | None, out: TextIO) -> dict | None:
    """Run one turn, streaming text to ``out``; returns the form if the run paused."""
    streamed = False
    for event in canvas.run(query=query, inputs=inputs, invoke_from="cli"):
        kind, data = event["event"], event["data"]
        if kind == "message":
            out.write(data["content"])
            out.flush()
            streamed = True
        elif kind == "user_inputs":
            if streamed:
                out.write("\n")
            if data.get("tips"):
                out.write(f"{data['tips']}\n")
            return data["inputs"]
        elif kind == "workflow_finished":
            if streamed:
                out.write("\n")
            if data["status"] != "succeeded":
                out.write(f"[{data['status']}] {data.get('error', '')}\n")
    return None


def _load(path: str, state: str | None) -> Canvas:
    # Keyed memory (a node's memory_key) lives in this process only: the terminal chat
    # has no database, so a returning user is remembered within one run.
    services = {"memory_store": InMemoryStore(), "files": InMemoryFiles()}
    if state and os.path.exists(state) and os.path.getsize(state) > 0:
        with open(state, encoding="utf-8") as fh:
            return Canvas(fh.read(), services=services)
    with open(path, encoding="utf-8") as fh:
        return Canvas(fh.read(), services=services)


def _save(canvas: Canvas, state: str | None) -> None:
    if state:
        tmp = f"{state}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(str(canvas))
        os.replace(tmp, state)


def main(argv: list[str] | None = None, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentcanvas run", description=__doc__.splitlines()[0])
    parser.add_argument("file", help="a DSL JSON file (a RAGFlow export or a bare DSL)")
    parser.add_argument("--state", help="keep the snapshot in this file; each invocation is one turn")
    parser.add_argument("--query", help="the message for this turn (else read from standard input)")
    args = parser.parse_args(argv)
    stdin = stdin or sys.stdin
    out = stdout or sys.stdout
    ask = _ask_from(stdin, out)
    try:
        canvas = _load(args.file, args.state)
    except (OSError, CanvasError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    fresh = int(canvas.globals.get("sys.conversation_turns") or 0) == 0 and canvas.pending_form() is None
    prologue = canvas.components["begin"].prologue()
    if fresh and prologue:
        out.write(f"{prologue}\n")

    while True:
        pending = canvas.pending_form()
        if pending is not None:
            answers = ask_form(pending.pause_form(), ask, out, canvas.services["files"])
            if answers is None:
                break
            try:
                run_turn(canvas, "", answers, out)
            except InputError as e:
                for field, message in e.errors.items():
                    out.write(f"    {field}: {message}\n")
        else:
            query = args.query if args.query is not None else ask("> ")
            if query is None or query.strip() in ("/exit", "/quit"):
                break
            run_turn(canvas, query, None, out)
        if args.state:
            break
    _save(canvas, args.state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
