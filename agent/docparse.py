"""The one document parser: a file's bytes and name in, its text out.

Used by files in conversations (uploads, ``file`` form fields, LLM inputs) and by
knowledge bases (document parsing). Every binary format goes through a well-kept
library: pypdf for PDF (the text layer only, no OCR), python-docx for DOCX,
BeautifulSoup (the standard library's ``html.parser`` underneath) for HTML.

The API is three functions and two errors::

    from agent import docparse

    kind = docparse.document_type("report.pdf")      # "pdf"; UnsupportedFileType otherwise
    doc = docparse.parse(data, "report.pdf")         # ParsedDocument; ParseError otherwise
    doc.text                                         # the whole text
    doc.sections                                     # (Section(text, page=1), ...)
    docparse.image_type("photo.PNG")                 # "png"; None for a non-image

A file's type is decided by its extension; the MIME type is only a fallback for a
name without a known extension (browsers and clients disagree on MIME types far
more than on extensions).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import dataclass

from agent.errors import CanvasError

# Extension → canonical document type.
_DOCUMENT_EXTENSIONS = {
    "txt": "txt",
    "text": "txt",
    "log": "txt",
    "md": "md",
    "markdown": "md",
    "htm": "html",
    "html": "html",
    "pdf": "pdf",
    "docx": "docx",
    "csv": "csv",
    "json": "json",
}
_DOCUMENT_MIME_TYPES = {
    "text/plain": "txt",
    "text/markdown": "md",
    "text/x-markdown": "md",
    "text/html": "html",
    "application/xhtml+xml": "html",
    "application/pdf": "pdf",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "text/csv": "csv",
    "application/json": "json",
}
_IMAGE_EXTENSIONS = {"png": "png", "jpg": "jpeg", "jpeg": "jpeg", "gif": "gif", "webp": "webp"}
_IMAGE_MIME_TYPES = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}

#: The document types :func:`parse` reads, as named in error messages.
SUPPORTED_DOCUMENT_TYPES = ("txt", "md", "html", "pdf", "docx", "csv", "json")
#: The image types (not parsed; given to vision models as they are).
SUPPORTED_IMAGE_TYPES = ("png", "jpeg", "gif", "webp")

#: Every file name extension accepted (documents and images), for upload pickers.
SUPPORTED_EXTENSIONS = tuple(_DOCUMENT_EXTENSIONS) + tuple(_IMAGE_EXTENSIONS)

#: The MIME type to serve each canonical type with.
MIME_TYPES = {
    "txt": "text/plain",
    "md": "text/markdown",
    "html": "text/html",
    "pdf": "application/pdf",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "csv": "text/csv",
    "json": "application/json",
    "png": "image/png",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
}


class ParseError(CanvasError):
    """A file could not be turned into text; the message says why in words."""


class UnsupportedFileType(ParseError):
    """The file's type is not one the parser reads; the message names those it reads."""


@dataclass(frozen=True)
class Section:
    """One part of a document: a PDF page, or the text under a heading.

    Attributes:
        text: the part's text.
        page: the 1-based page number (PDF only).
        title: the heading the text sits under (Markdown, HTML, DOCX), if any.
    """

    text: str
    page: int | None = None
    title: str | None = None


@dataclass(frozen=True)
class ParsedDocument:
    """A parsed document.

    Attributes:
        text: the whole text, sections joined by blank lines.
        sections: the document's parts in order (one section for formats without parts).
        file_type: the canonical type, one of ``SUPPORTED_DOCUMENT_TYPES``.
    """

    text: str
    sections: tuple[Section, ...]
    file_type: str


def _extension(filename: str) -> str:
    return os.path.splitext(filename or "")[1].lower().lstrip(".")


def _base_mime(mime_type: str | None) -> str:
    return (mime_type or "").split(";", 1)[0].strip().lower()


def image_type(filename: str, mime_type: str | None = None) -> str | None:
    """The image type (``png``, ``jpeg``, ``gif``, ``webp``) of a file, or None."""
    ext = _extension(filename)
    if ext in _IMAGE_EXTENSIONS:
        return _IMAGE_EXTENSIONS[ext]
    if ext in _DOCUMENT_EXTENSIONS:
        return None
    return _IMAGE_MIME_TYPES.get(_base_mime(mime_type))


def document_type(filename: str, mime_type: str | None = None) -> str:
    """The canonical document type of a file, by extension, else by MIME type.

    Raises:
        UnsupportedFileType: neither names a supported document type.
    """
    ext = _extension(filename)
    if ext in _DOCUMENT_EXTENSIONS:
        return _DOCUMENT_EXTENSIONS[ext]
    if ext not in _IMAGE_EXTENSIONS:
        found = _DOCUMENT_MIME_TYPES.get(_base_mime(mime_type))
        if found:
            return found
    what = f"'.{ext}'" if ext else "a name without an extension"
    raise UnsupportedFileType(
        f"{filename!r}: unsupported file type ({what}); "
        f"supported documents: {', '.join(SUPPORTED_DOCUMENT_TYPES)}"
    )


def parse(data: bytes, filename: str, mime_type: str | None = None) -> ParsedDocument:
    """Parse a document's bytes into text.

    Args:
        data: the file's content.
        filename: its name; the extension decides the format.
        mime_type: used only when the name has no known extension.

    Raises:
        UnsupportedFileType: the type is not a supported document type (images included).
        ParseError: the file is of a supported type but cannot be read: an encrypted
            or corrupt PDF, a PDF without a text layer, a broken DOCX, invalid JSON,
            binary data in a text file. The message says which.
    """
    kind = document_type(filename, mime_type)
    sections = _PARSERS[kind](bytes(data), filename)
    sections = tuple(s for s in sections if s.text.strip())
    text = "\n\n".join(s.text for s in sections)
    return ParsedDocument(text=text, sections=sections, file_type=kind)


# --- text decoding -------------------------------------------------------------

_BOMS = (
    (b"\xef\xbb\xbf", "utf-8-sig"),
    (b"\xff\xfe", "utf-16"),
    (b"\xfe\xff", "utf-16"),
)


def _decode(data: bytes, filename: str) -> str:
    """Text from bytes: a BOM's encoding, else UTF-8, else Windows-1252."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError:
                break
    if b"\x00" in data[:8192]:
        raise ParseError(f"{filename!r} is not a text file (it holds binary data)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        # Legacy Windows text; every byte but five maps, those become U+FFFD.
        text = data.decode("cp1252", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _parse_text(data: bytes, filename: str) -> list[Section]:
    return [Section(_decode(data, filename).strip())]


_MD_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _parse_markdown(data: bytes, filename: str) -> list[Section]:
    """Markdown stays as written (models read it well); sections split at ATX headings."""
    sections: list[Section] = []
    title: str | None = None
    lines: list[str] = []
    fence = False
    for line in _decode(data, filename).split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        heading = None if fence else _MD_HEADING.match(line)
        if heading:
            sections.append(Section("\n".join(lines).strip(), title=title))
            title, lines = heading.group(2), []
        lines.append(line)
    sections.append(Section("\n".join(lines).strip(), title=title))
    return sections


# --- HTML ----------------------------------------------------------------------

_HTML_DROP = ("script", "style", "noscript", "template", "head", "svg")
_HTML_HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
_HTML_BLOCKS = (
    "p", "div", "section", "article", "main", "header", "footer", "aside", "nav", "li",
    "tr", "br", "pre", "blockquote", "table", "ul", "ol", "dl", "dt", "dd", "figcaption",
    "hr", "form", "address",
) + _HTML_HEADINGS  # fmt: skip


def _clean_lines(text: str) -> str:
    lines = [" ".join(line.split()) for line in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _parse_html(data: bytes, filename: str) -> list[Section]:
    """Visible text of an HTML page, split at headings; the <title> heads the first part."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(data, "html.parser")
    page_title = soup.title.get_text(" ", strip=True) if soup.title else None
    for tag in soup.find_all(_HTML_DROP):
        tag.decompose()
    for tag in soup.find_all(_HTML_BLOCKS):
        tag.insert_before("\n")
        tag.insert_after("\n")
    for cell in soup.find_all(("td", "th")):
        cell.insert_after(" | ")
    for heading in soup.find_all(_HTML_HEADINGS):
        heading.insert_before("\x00")  # a marker no HTML text holds (the parser drops NULs)
    sections: list[Section] = []
    for n, part in enumerate(soup.get_text().split("\x00")):
        text = _clean_lines(part)
        title = text.split("\n", 1)[0] if n else page_title
        sections.append(Section(text, title=title))
    return sections


# --- PDF -----------------------------------------------------------------------


def _parse_pdf(data: bytes, filename: str) -> list[Section]:
    """The text layer of each page. Scanned pages (images only) have none: no OCR here."""
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, FileNotDecryptedError, PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")  # many PDFs are "encrypted" with an empty password
            except (DependencyError, NotImplementedError) as exc:
                raise ParseError(
                    f"{filename!r} is an encrypted PDF this server cannot decrypt ({exc})"
                ) from None
            if not opened:
                raise ParseError(
                    f"{filename!r} is an encrypted PDF that needs a password; upload a copy without one"
                )
        sections = [
            Section(_clean_lines(page.extract_text() or ""), page=n)
            for n, page in enumerate(reader.pages, start=1)
        ]
    except ParseError:
        raise
    except FileNotDecryptedError:
        raise ParseError(f"{filename!r} is an encrypted PDF that needs a password") from None
    except (PyPdfError, ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        # pypdf reports damaged files with its own errors and, deep inside, with
        # plain ones; all of them mean "not a readable PDF".
        raise ParseError(f"{filename!r} is not a readable PDF (damaged or not a PDF: {exc})") from None
    except RecursionError:
        raise ParseError(f"{filename!r} is not a readable PDF (its structure nests too deep)") from None
    if not any(s.text for s in sections):
        raise ParseError(
            f"{filename!r} has no text layer (a scanned or image-only PDF?); "
            "text recognition (OCR) is not supported"
        )
    return sections


# --- DOCX ----------------------------------------------------------------------


def _parse_docx(data: bytes, filename: str) -> list[Section]:
    """Paragraphs and tables in document order, split at Heading/Title paragraphs."""
    import zipfile

    import docx
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table

    try:
        document = docx.Document(io.BytesIO(data))
        sections: list[Section] = []
        title: str | None = None
        lines: list[str] = []
        for block in document.iter_inner_content():
            if isinstance(block, Table):
                for row in block.rows:
                    cells = [" ".join(cell.text.split()) for cell in row.cells]
                    lines.append(" | ".join(cells))
                continue
            text = block.text.strip()
            style = (block.style.name if block.style is not None else "") or ""
            if text and (style.startswith("Heading") or style == "Title"):
                sections.append(Section("\n".join(lines).strip(), title=title))
                title, lines = text, []
            lines.append(text)
        sections.append(Section("\n".join(lines).strip(), title=title))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise ParseError(f"{filename!r} is not a readable DOCX (damaged or not a DOCX: {exc})") from None
    except Exception as exc:  # lxml's XMLSyntaxError and friends from a damaged part
        if type(exc).__module__.startswith(("lxml", "docx")):
            raise ParseError(f"{filename!r} is not a readable DOCX ({exc})") from None
        raise
    return sections


# --- CSV and JSON ----------------------------------------------------------------


def _parse_csv(data: bytes, filename: str) -> list[Section]:
    """Each row as ``column: value; ...`` under the header row, which reads well to a model."""
    text = _decode(data, filename)
    try:
        dialect = csv.Sniffer().sniff(text[:8192], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    try:
        rows = [row for row in csv.reader(io.StringIO(text), dialect) if any(c.strip() for c in row)]
    except csv.Error as exc:
        raise ParseError(f"{filename!r} is not a readable CSV file ({exc})") from None
    if not rows:
        return []
    header, *body = rows
    if not body:
        return [Section(", ".join(header))]
    lines = []
    for row in body:
        pairs = [
            f"{header[i] if i < len(header) else f'column {i + 1}'}: {value}" for i, value in enumerate(row)
        ]
        lines.append("; ".join(pairs))
    return [Section("\n".join(lines))]


def _parse_json(data: bytes, filename: str) -> list[Section]:
    """JSON pretty-printed (indented, non-ASCII kept), so a model sees its structure."""
    text = _decode(data, filename)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(
            f"{filename!r} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise ParseError(f"{filename!r}: the JSON nests too deep") from None
    return [Section(json.dumps(value, indent=2, ensure_ascii=False))]


_PARSERS = {
    "txt": _parse_text,
    "md": _parse_markdown,
    "html": _parse_html,
    "pdf": _parse_pdf,
    "docx": _parse_docx,
    "csv": _parse_csv,
    "json": _parse_json,
}
