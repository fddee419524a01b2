"""Real files for tests, made on the spot: PDFs with pypdf's writer, DOCX with
python-docx, PNGs with zlib. Shared by the parser, upload and knowledge-base tests."""

from __future__ import annotations

import io
import struct
import zlib


def make_pdf(pages: list[str], *, password: str | None = None) -> bytes:
    """A PDF whose pages carry ``pages`` as a text layer (Helvetica, one line per ``\\n``).

    An empty string makes a page without text (like a scanned page); ``password``
    encrypts the file (RC4, which pypdf does without extra packages).
    """
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    for text in pages:
        page = writer.add_blank_page(612, 792)
        font = DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
            }
        )
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
        if text:
            shown = b" T* ".join(
                b"("
                + line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")
                + b") Tj"
                for line in text.split("\n")
            )
            content = DecodedStreamObject()
            content.set_data(b"BT /F1 12 Tf 14 TL 72 720 Td " + shown + b" ET")
            page.replace_contents(content)
    if password is not None:
        writer.encrypt(user_password=password, algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def make_docx(blocks: list[tuple[str, str]]) -> bytes:
    """A DOCX from ``[(kind, text)]``: kind ``h1``/``h2`` (headings), ``p`` (paragraph),
    or ``table`` (text rows split by ``\\n``, cells by ``|``)."""
    import docx

    document = docx.Document()
    for kind, text in blocks:
        if kind.startswith("h"):
            document.add_heading(text, level=int(kind[1:]))
        elif kind == "table":
            rows = [row.split("|") for row in text.split("\n")]
            table = document.add_table(rows=len(rows), cols=len(rows[0]))
            for r, row in enumerate(rows):
                for c, cell in enumerate(row):
                    table.cell(r, c).text = cell
        else:
            document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def make_png(width: int = 2, height: int = 2, rgb: tuple[int, int, int] = (255, 0, 0)) -> bytes:
    """A small solid-colour PNG."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    row = b"\x00" + bytes(rgb) * width
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )
