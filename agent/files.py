"""Files in conversations, as the runtime sees them (docs/design.md §13).

A file is named by its **descriptor**, RAGFlow's upload answer::

    {"id", "name", "size", "extension", "mime_type", "created_by", "created_at"}

Descriptors are what ``sys.files`` and the output of a ``file`` form field hold, so a
snapshot never carries a file's bytes. The bytes and the parsed text come from the
host's file service, ``canvas.services["files"]`` (a :class:`FileService`): the API
gives one bound to the turn's tenant and visitor, the terminal chat an
:class:`InMemoryFiles`. Without a file service (the runtime used as a bare library)
files are kept as given and nothing reads them.

What the rest of the runtime uses from here:

* :func:`file_refs` — a form answer or ``files`` value as a list of ids/descriptors.
* :func:`is_file_list` — whether a value is a list of descriptors (so that a
  reference to it in a prompt renders the files' text: :func:`render_files`).
* :func:`document_blocks` / :func:`image_parts` — what an LLM node sends.
"""

from __future__ import annotations

import base64
import re
import threading
import time
import uuid
from typing import Any, Protocol

from agent import docparse
from agent.errors import ComponentError

# The first bytes of each image type: a file named .png must be a PNG for a model to read it.
_IMAGE_MAGIC = {
    "png": (b"\x89PNG\r\n\x1a\n",),
    "jpeg": (b"\xff\xd8\xff",),
    "gif": (b"GIF87a", b"GIF89a"),
    "webp": (b"RIFF",),
}
DESCRIPTOR_KEYS = ("id", "name", "size", "extension", "mime_type", "created_by", "created_at")


class FileService(Protocol):
    """What the runtime needs from the host to use uploaded files."""

    def resolve(self, refs: list) -> list[dict]:
        """The descriptors of ``refs`` (ids or descriptors), checked for this caller.

        Raises:
            ValueError: a ref is malformed, unknown, another tenant's or visitor's,
                over the size limit or of an unsupported type; the message says which.
        """

    def read(self, descriptor: dict) -> bytes:
        """The file's bytes."""

    def text(self, descriptor: dict) -> str:
        """A document's parsed text (``""`` for an image)."""


def file_refs(value: Any) -> list:
    """A ``file`` answer as a list of refs: one id or descriptor, or a list of them.

    Raises:
        ValueError: something that cannot name a file.
    """
    if value is None or value == "":
        return []
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, str) and item.strip():
            continue
        if isinstance(item, dict) and isinstance(item.get("id"), str) and item["id"].strip():
            continue
        raise ValueError(
            f"expected an uploaded file's id or descriptor (from POST /agents/<id>/upload), got {item!r}"
        )
    return items


def ref_id(ref: str | dict) -> str:
    return (ref["id"] if isinstance(ref, dict) else ref).strip()


def is_descriptor(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("id"), str)
        and "mime_type" in value
        and "name" in value
    )


def is_file_list(value: Any) -> bool:
    """A non-empty list of descriptors (``sys.files``, a ``file`` field's output)."""
    return isinstance(value, list) and bool(value) and all(is_descriptor(v) for v in value)


def is_image(descriptor: dict) -> bool:
    return docparse.image_type(str(descriptor.get("name") or ""), descriptor.get("mime_type")) is not None


def render_files(files: list[dict], service: FileService | None) -> str:
    """How a reference to files reads inside a prompt: each document's parsed text
    under its name; an image as ``[image: name]`` (the image itself goes to the model
    as an image part, see :func:`image_parts`)."""
    if service is None:
        return ", ".join(str(f.get("name")) for f in files)
    parts = []
    for f in files:
        if is_image(f):
            parts.append(f"[image: {f.get('name')}]")
        else:
            parts.append(f"[file: {f.get('name')}]\n{service.text(f)}")
    return "\n\n".join(parts)


#: Where a document stands in a prompt rendered by :meth:`agent.canvas.Canvas.files_as_markers`.
MARKER_RE = re.compile("\x00file:([^\x00]*)\x00")


def marker(descriptor: dict) -> str:
    return f"\x00file:{descriptor.get('id')}\x00"


def document_blocks(
    files: list[dict], service: FileService, budget_tokens: int
) -> tuple[dict[str, str], list[str], int]:
    """The documents among ``files`` as text for a prompt, within ``budget_tokens`` in all.

    Tokens are cl100k_base's, counted without the per-text cache (a document's text
    is large and seen once).

    Returns:
        ``(blocks, notes, tokens)``: each document's text under ``[file: name]`` by id;
        a note for each document that was cut or left out (also written into its
        block, so the model knows it did not see everything); the tokens used.
    """
    from agent.llm.tokens import encoding  # the LLM package only when a prompt is built

    enc = encoding()
    blocks: dict[str, str] = {}
    notes: list[str] = []
    left = max(0, budget_tokens)
    for f in files:
        if is_image(f) or str(f.get("id")) in blocks:
            continue
        name = str(f.get("name"))
        text = service.text(f)
        tokens = enc.encode(text, disallowed_special=())
        head = f"[file: {name}]"
        if len(tokens) <= left:
            block = f"{head}\n{text}"
            left -= len(tokens)
        elif left <= 50:
            note = f"{name!r} was left out: no room in the model's context (about {len(tokens)} tokens)"
            notes.append(note)
            block = f"{head}\n[{note}]"
        else:
            kept = enc.decode(tokens[:left])
            space = kept.rfind(" ")
            kept = kept[:space] if space > len(kept) // 2 else kept  # not inside a word
            note = f"{name!r} was cut to its first {left} of about {len(tokens)} tokens to fit the model's context"
            notes.append(note)
            block = f"{head}\n{kept}\n[{note}]"
            left = 0
        blocks[str(f.get("id"))] = block
    return blocks, notes, max(0, budget_tokens) - left


def image_parts(files: list[dict], service: FileService, vision: bool, who: str) -> list[dict]:
    """The images among ``files`` as OpenAI ``image_url`` parts (data URLs).

    Raises:
        ComponentError: there are images and the model does not take them.
    """
    images = [f for f in files if is_image(f)]
    if not images:
        return []
    if not vision:
        names = ", ".join(repr(f.get("name")) for f in images)
        raise ComponentError(
            f"{who}: the turn has images ({names}) but this model does not take images; use a model "
            f"whose provider sets 'vision: true' (AGENTCANVAS_LLM_VISION=1 for the default provider), "
            f"or send documents only",
            retryable=False,
        )
    parts = []
    for f in images:
        mime = docparse.MIME_TYPES[docparse.image_type(str(f.get("name")), f.get("mime_type")) or "png"]
        data = base64.b64encode(service.read(f)).decode("ascii")
        parts.append({"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}})
    return parts


class InMemoryFiles:
    """A :class:`FileService` that keeps files in this process (the terminal chat, tests).

    Args:
        max_file_bytes: files over this size are refused by :meth:`add`.
    """

    def __init__(self, max_file_bytes: int = 32 * 1024 * 1024):
        self.max_file_bytes = max_file_bytes
        self._files: dict[str, tuple[dict, bytes, str]] = {}
        self._lock = threading.Lock()

    def add(self, name: str, data: bytes, created_by: str = "") -> dict:
        """Keep a file; returns its descriptor.

        Raises:
            ValueError: too large, of an unsupported type, or a document that cannot be parsed.
        """
        if len(data) > self.max_file_bytes:
            raise ValueError(f"{name!r} is {len(data)} bytes; the limit is {self.max_file_bytes}")
        kind, mime, text = check_file(name, None, data)
        descriptor = {
            "id": uuid.uuid4().hex,
            "name": name,
            "size": len(data),
            "extension": kind,
            "mime_type": mime,
            "created_by": created_by,
            "created_at": time.time(),
        }
        with self._lock:
            self._files[descriptor["id"]] = (descriptor, data, text)
        return dict(descriptor)

    def resolve(self, refs: list) -> list[dict]:
        out = []
        for ref in refs:
            with self._lock:
                found = self._files.get(ref_id(ref))
            if found is None:
                raise ValueError(f"file {ref_id(ref)!r} not found")
            out.append(dict(found[0]))
        return out

    def read(self, descriptor: dict) -> bytes:
        return self._get(descriptor)[1]

    def text(self, descriptor: dict) -> str:
        return self._get(descriptor)[2]

    def _get(self, descriptor: dict) -> tuple[dict, bytes, str]:
        with self._lock:
            found = self._files.get(str(descriptor.get("id")))
        if found is None:
            raise ComponentError(f"file {descriptor.get('name')!r} is no longer available; attach it again")
        return found


def check_file(name: str, mime_type: str | None, data: bytes) -> tuple[str, str, str]:
    """Check an uploaded file: ``(type, MIME type, parsed text)``; images have no text.

    Raises:
        ValueError: an empty file, an unsupported type (naming the supported ones), or a
            document that cannot be parsed (saying why).
    """
    if not data:
        raise ValueError(f"{name!r} is empty")
    image = docparse.image_type(name, mime_type)
    if image is not None:
        if not any(data.startswith(magic) for magic in _IMAGE_MAGIC[image]) or (
            image == "webp" and data[8:12] != b"WEBP"
        ):
            raise ValueError(f"{name!r} is not a {image.upper()} image (its content says otherwise)")
        return image, docparse.MIME_TYPES[image], ""
    try:
        kind = docparse.document_type(name, mime_type)
    except docparse.UnsupportedFileType as exc:
        raise ValueError(f"{exc}; images: {', '.join(docparse.SUPPORTED_IMAGE_TYPES)}") from None
    try:
        text = docparse.parse(data, name, mime_type).text
    except docparse.ParseError as exc:
        raise ValueError(str(exc)) from None
    return kind, docparse.MIME_TYPES[kind], text
