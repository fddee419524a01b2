"""The document parser on real files of every supported type, and its refusals."""

from __future__ import annotations

import io
import zipfile

import pytest

from agent import docparse
from agent.docparse import ParseError, UnsupportedFileType
from tests.files import make_docx, make_pdf, make_png


def test_plain_text_utf8_bom_and_legacy_encoding():
    assert docparse.parse("héllo\r\nworld\n".encode(), "a.txt").text == "héllo\nworld"
    assert docparse.parse("\ufeffbom".encode("utf-8"), "a.txt").text == "bom"
    assert docparse.parse("utf16 ü".encode("utf-16"), "a.txt").text == "utf16 ü"
    assert docparse.parse("caf\xe9".encode("cp1252"), "notes.log").text == "café"


def test_binary_data_in_a_text_file_is_a_parse_error():
    with pytest.raises(ParseError, match="binary"):
        docparse.parse(b"\x00\x01\x02garbage", "a.txt")


def test_markdown_kept_as_written_with_sections_per_heading():
    md = b"intro\n\n# One\nfirst\n```\n# not a heading\n```\n## Two\nsecond\n"
    doc = docparse.parse(md, "README.md")
    assert doc.file_type == "md"
    assert "# not a heading" in doc.text and doc.text.startswith("intro")
    assert [s.title for s in doc.sections] == [None, "One", "Two"]
    assert "first" in doc.sections[1].text


def test_html_visible_text_only_split_at_headings():
    html = b"""<html><head><title>Page</title><style>p{color:red}</style>
    <script>var secret = 1;</script></head><body>
    <p>Hello <b>bold</b> world</p><h2>Prices</h2>
    <table><tr><th>item</th><th>cost</th></tr><tr><td>tea</td><td>3</td></tr></table>
    <noscript>enable js</noscript></body></html>"""
    doc = docparse.parse(html, "page.html")
    assert "Hello bold world" in doc.text
    assert "secret" not in doc.text and "color" not in doc.text and "enable js" not in doc.text
    assert "tea | 3" in doc.text
    assert [s.title for s in doc.sections] == ["Page", "Prices"]


def test_pdf_text_layer_per_page():
    data = make_pdf(["Invoice 42\ntotal (EUR) 17.50", "", "Page three text"])
    doc = docparse.parse(data, "invoice.PDF")
    assert doc.file_type == "pdf"
    assert [(s.page, s.text) for s in doc.sections] == [
        (1, "Invoice 42\ntotal (EUR) 17.50"),
        (3, "Page three text"),
    ]
    assert doc.text == "Invoice 42\ntotal (EUR) 17.50\n\nPage three text"


def test_pdf_refusals_say_why():
    with pytest.raises(ParseError, match="needs a password"):
        docparse.parse(make_pdf(["secret"], password="pw"), "locked.pdf")
    with pytest.raises(ParseError, match="no text layer"):
        docparse.parse(make_pdf(["", ""]), "scan.pdf")
    with pytest.raises(ParseError, match="not a readable PDF"):
        docparse.parse(b"%PDF-1.7\nthis is not really a pdf", "broken.pdf")
    with pytest.raises(ParseError, match="not a readable PDF"):
        docparse.parse(make_pdf(["x"])[:200], "truncated.pdf")


def test_pdf_with_empty_user_password_is_read():
    assert docparse.parse(make_pdf(["open to all"], password=""), "a.pdf").text == "open to all"


def test_docx_paragraphs_tables_and_headings_in_order():
    data = make_docx([("p", "Preface"), ("h1", "Terms"), ("p", "Pay in 30 days."),
                      ("table", "item|cost\ntea|3"), ("h2", "Notes"), ("p", "None.")])  # fmt: skip
    doc = docparse.parse(data, "contract.docx")
    assert doc.text.split("\n\n") == [
        "Preface",
        "Terms\nPay in 30 days.\nitem | cost\ntea | 3",
        "Notes\nNone.",
    ]
    assert [s.title for s in doc.sections] == [None, "Terms", "Notes"]


def test_broken_docx_is_a_parse_error():
    with pytest.raises(ParseError, match="not a readable DOCX"):
        docparse.parse(b"PK\x03\x04 not a zip", "a.docx")
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("hello.txt", "no word document here")
    with pytest.raises(ParseError, match="not a readable DOCX"):
        docparse.parse(zipped.getvalue(), "a.docx")


def test_csv_rows_under_their_header():
    doc = docparse.parse(b"name;city\nAda;London\nLin;Taipei\n", "people.csv")
    assert doc.text == "name: Ada; city: London\nname: Lin; city: Taipei"


def test_json_pretty_printed_and_invalid_json_located():
    assert docparse.parse('{"a":[1,"ü"]}'.encode(), "d.json").text == '{\n  "a": [\n    1,\n    "ü"\n  ]\n}'
    with pytest.raises(ParseError, match="line 2, column"):
        docparse.parse(b'{"a":\n ]', "d.json")


def test_types_by_extension_then_mime():
    assert docparse.document_type("X.Markdown") == "md"
    assert docparse.document_type("upload", "application/pdf; charset=binary") == "pdf"
    assert docparse.document_type("notes.txt", "application/pdf") == "txt"  # the name wins
    assert docparse.image_type("photo.JPG") == "jpeg"
    assert docparse.image_type("blob", "image/webp") == "webp"
    assert docparse.image_type("a.pdf", "image/png") is None


def test_unsupported_types_name_the_supported_ones():
    with pytest.raises(UnsupportedFileType, match=r"'\.exe'.*txt, md, html, pdf, docx, csv, json"):
        docparse.document_type("setup.exe")
    with pytest.raises(UnsupportedFileType, match="without an extension"):
        docparse.parse(b"x", "README", "application/octet-stream")
    # An image is a file type, not a document: parse() refuses it the same way.
    with pytest.raises(UnsupportedFileType, match="'.png'"):
        docparse.parse(make_png(), "photo.png")
    assert issubclass(UnsupportedFileType, ParseError)
