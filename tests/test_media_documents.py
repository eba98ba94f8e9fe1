"""core.media.documents: text from PDFs, Word files and text files, in pages, within caps; every bad file refused in
one line. Every file is made here (a PDF written by hand or with pypdf, a DOCX with python-docx, zips with zipfile)."""

from __future__ import annotations

import asyncio
import io
import random
import tarfile
import threading
import wave
import zipfile
from typing import Any

import docx
import pypdf
import pytest
from PIL import Image

from core.constants import MEDIA_DOC_MAX_BYTES, MEDIA_DOC_PAGE_CHARS, MEDIA_ZIP_MAX_ENTRIES, MEDIA_ZIP_MAX_RATIO
from core.media import documents
from core.media.documents import (
    DOCX_DAMAGED,
    EMPTY,
    ENCRYPTED,
    NO_TEXT,
    PDF_DAMAGED,
    SCANNED,
    UNSUPPORTED,
    ZIP_BOMB,
    Document,
    DocumentRefused,
    extract,
    split_pages,
)

THREE = ["Page one text", "Page two text", "Page three text"]
FRENCH = (
    "Le café était fermé. Nous avons mangé une crème brûlée à côté du théâtre; "
    "l'été dernier, à Noël, le garçon naïf demandait où était la forêt.\n"
) * 3


def pdf(texts: list[str]) -> bytes:
    """A valid PDF written by hand: one page per text, each a Helvetica text run."""
    n = len(texts)
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for i, text in enumerate(texts):
        box = "/MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >>"
        page = f"<< /Type /Page /Parent 2 0 R {box} /Contents {5 + 2 * i} 0 R >>"
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objects += [page.encode(), b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream)]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.writelines(b"%010d 00000 n \n" % o for o in offsets)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def rewritten(data: bytes, *, password: str | None = None, owner: str | None = None) -> bytes:
    """The PDF in `data` written again by pypdf, encrypted (RC4) if a password is given."""
    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(data)))
    if password is not None:
        writer.encrypt(password, owner)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def blank_pdf(pages: int) -> bytes:
    """A PDF of blank pages: what a scan without a text layer looks like to a text extractor."""
    writer = pypdf.PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(612, 792)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def word(paragraphs: list[str], table: list[list[str]] | None = None, after: str | None = None) -> bytes:
    """A DOCX made with python-docx: paragraphs, then a table (cells "<" merge with the one to their left), then one."""
    d = docx.Document()
    for p in paragraphs:
        d.add_paragraph(p)
    if table:
        t = d.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, text in enumerate(row):
                if text == "<":
                    t.cell(r, c - 1).merge(t.cell(r, c))
                else:
                    t.cell(r, c).text = text
    if after:
        d.add_paragraph(after)
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def zipped(entries: dict[str, bytes], *, big: tuple[str, bytes, int] | None = None, level: int = 6) -> bytes:
    """A deflated zip of `entries`, plus `big`: (name, chunk, times) streamed in without holding it whole."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=level) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        if big:
            name, chunk, times = big
            with zf.open(name, "w", force_zip64=True) as f:
                for _ in range(times):
                    f.write(chunk)
    return out.getvalue()


async def refused(data: bytes, filename: str, mime: str | None = None, **caps: Any) -> str:
    """The one line a file is refused with."""
    with pytest.raises(DocumentRefused) as e:
        await extract(data, filename, mime, **caps)
    line = str(e.value)
    assert line and "\n" not in line and "/" not in line.replace("(a scan?)", "")
    return line


def forbid_unpacking(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, fail if a zip entry is decompressed or python-docx parses anything: a refusal must come from the
    zip's directory alone."""

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the zip was unpacked")

    monkeypatch.setattr(docx, "Document", boom)
    monkeypatch.setattr(zipfile.ZipFile, "open", boom)


# PDF


async def test_a_multi_page_pdf_comes_back_page_by_page() -> None:
    """Each page's text is its own page; nothing is cut."""
    doc = await extract(pdf(THREE), "report.pdf", "application/pdf")
    assert doc == Document("pdf", tuple(THREE), 3, False, None)


async def test_a_pdf_is_known_by_its_content_whatever_its_name() -> None:
    """A PDF sent as "notes.txt" is still read as a PDF."""
    doc = await extract(pdf(THREE), "notes.txt", "text/plain")
    assert doc.kind == "pdf" and doc.pages == tuple(THREE)


async def test_pdf_pages_past_the_cap_are_counted_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """max_pages=2 of 3: two pages read (extract_text called twice), the total still 3, marked cut."""
    calls = 0
    original = pypdf.PageObject.extract_text

    def counting(self: pypdf.PageObject, *args: Any, **kwargs: Any) -> str:
        nonlocal calls
        calls += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pypdf.PageObject, "extract_text", counting)
    doc = await extract(pdf(THREE), "report.pdf", None, max_pages=2)
    assert (doc.pages, doc.total_pages, doc.cut, calls) == (tuple(THREE[:2]), 3, True, 2)


async def test_pdf_reading_stops_at_the_character_cap() -> None:
    """max_chars=20: the first page whole, the second cut to the 7 characters left, the third not read."""
    doc = await extract(pdf(THREE), "report.pdf", None, max_chars=20)
    assert (doc.pages, doc.total_pages, doc.cut) == (("Page one text", "Page tw"), 3, True)


async def test_a_pdf_without_text_is_refused_as_a_scan() -> None:
    """Blank pages (a scan has no text layer): the line says send photos instead."""
    line = await refused(blank_pdf(2), "scan.pdf")
    assert line == SCANNED == "That PDF has no text I can read (a scan?) — send the pages as photos instead."


async def test_an_encrypted_pdf_is_refused() -> None:
    """A user password: refused with the password line."""
    assert await refused(rewritten(pdf(THREE), password="secret"), "locked.pdf") == ENCRYPTED


async def test_a_pdf_with_only_an_owner_password_is_read() -> None:
    """An empty user password (only printing/copying restricted) opens without asking anything."""
    doc = await extract(rewritten(pdf(THREE), password="", owner="owner"), "restricted.pdf", None)
    assert doc.pages == tuple(THREE)


async def test_a_pdf_whose_pages_all_fail_is_damaged_and_one_failing_page_is_left_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pypdf raising on every page: damaged (not "a scan"); raising on page two only: the others still read."""
    original = pypdf.PageObject.extract_text
    failing: set[int] = {0, 1, 2}

    def flaky(self: pypdf.PageObject, *args: Any, **kwargs: Any) -> str:
        if self.page_number in failing:
            raise pypdf.errors.PdfReadError("broken content stream")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pypdf.PageObject, "extract_text", flaky)
    assert await refused(pdf(THREE), "broken.pdf") == PDF_DAMAGED
    failing = {1}
    assert (await extract(pdf(THREE), "broken.pdf", None)).pages == (THREE[0], "", THREE[2])


async def test_an_aes_encrypted_pdf_without_the_cryptography_package_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pypdf needs `cryptography` for AES (not installed): the password line, not a crash."""

    def needs_aes(self: pypdf.PdfReader, password: str) -> Any:
        raise pypdf.errors.DependencyError("cryptography>=3.1 is required for AES algorithm")

    monkeypatch.setattr(pypdf.PdfReader, "decrypt", needs_aes)
    assert await refused(rewritten(pdf(THREE), password="", owner="owner"), "aes.pdf") == ENCRYPTED


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
async def test_a_truncated_pdf_is_refused_as_damaged(keep: float) -> None:
    """A PDF cut short (a broken download) is refused in one line, not a traceback."""
    data = pdf(THREE)
    assert await refused(data[: int(len(data) * keep)], "cut.pdf") == PDF_DAMAGED


async def test_a_file_named_pdf_that_is_not_one_is_damaged() -> None:
    """The name promises a PDF, the content isn't one: damaged, not "can't read that kind"."""
    assert await refused(b"just some words", "report.pdf") == PDF_DAMAGED
    assert await refused(b"just some words", "report", "application/pdf") == PDF_DAMAGED


async def test_pdf_pages_are_read_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """extract_text runs in a worker thread, never the loop's."""
    threads: set[int] = set()
    original = pypdf.PageObject.extract_text

    def where(self: pypdf.PageObject, *args: Any, **kwargs: Any) -> str:
        threads.add(threading.get_ident())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pypdf.PageObject, "extract_text", where)
    await extract(pdf(THREE), "report.pdf", None)
    assert threads and threading.get_ident() not in threads


async def test_a_hung_extraction_times_out_and_its_worker_stops_at_the_next_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first page blocks: refused after the (tiny) timeout; released, the worker reads no further page."""
    release = threading.Event()
    calls = 0

    def hang(self: pypdf.PageObject, *args: Any, **kwargs: Any) -> str:
        nonlocal calls
        calls += 1
        release.wait(10)
        return "text"

    monkeypatch.setattr(pypdf.PageObject, "extract_text", hang)
    line = await refused(pdf(THREE), "slow.pdf", timeout_s=0.05)
    assert line == "Reading that file took over 0.05 seconds, so I stopped: send a smaller one."
    release.set()
    await asyncio.get_running_loop().shutdown_default_executor()  # the worker has finished
    assert calls == 1


# Word


async def test_a_docx_gives_its_paragraphs_and_tables_in_order() -> None:
    """Paragraphs as lines, a table as `|`-separated rows between blank lines, a merged cell once."""
    data = word(
        ["Contract", "The parties agree:"],
        [["Item", "Price"], ["Chair", "40 €\nnet"], ["Total: 40 €", "<"]],
        "Signed in Zürich.",
    )
    doc = await extract(data, "contract.docx", None)
    text = "Contract\nThe parties agree:\n\nItem | Price\nChair | 40 € net\nTotal: 40 €\n\nSigned in Zürich."
    assert doc == Document("docx", (text,), 1, False, None)


async def test_a_long_docx_stops_at_the_character_cap_and_estimates_its_pages() -> None:
    """2,000 paragraphs of 100 characters, max_chars 5,000: at most 5,000 kept, ~67 pages counted, marked cut."""
    line = "x" * 99
    doc = await extract(word([line] * 2000), "long.docx", None, max_chars=5000)
    kept = "".join(doc.pages)
    assert doc.cut and 4900 <= len(kept) <= 5000
    assert doc.total_pages == -(-2000 * 99 // MEDIA_DOC_PAGE_CHARS)


async def test_a_zip_bomb_named_docx_is_refused_before_anything_is_unpacked(monkeypatch: pytest.MonkeyPatch) -> None:
    """64 MB of spaces packed into ~64 kB as word/document.xml: refused from the zip's directory alone."""
    data = zipped({"[Content_Types].xml": b"<Types/>"}, big=("word/document.xml", b" " * (1 << 20), 64))
    assert len(data) < 200_000
    forbid_unpacking(monkeypatch)
    assert await refused(data, "invoice.docx") == ZIP_BOMB


async def test_a_zip_packed_too_tightly_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """4 MB of spaces: under every size cap, but packed ~1000:1, over MEDIA_ZIP_MAX_RATIO."""
    data = zipped({}, big=("word/document.xml", b" " * (1 << 20), 4))
    info = zipfile.ZipFile(io.BytesIO(data)).getinfo("word/document.xml")
    assert info.file_size > MEDIA_ZIP_MAX_RATIO * info.compress_size
    forbid_unpacking(monkeypatch)
    assert await refused(data, "a.docx") == ZIP_BOMB


async def test_a_docx_whose_text_part_is_too_large_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """11 MB of loosely packed XML (ratio ~2): over MEDIA_DOCX_MAX_XML_BYTES, under the zip's other caps."""
    letters = bytes(b"<w:t>abcdefgh</>"[i % 16] for i in range(256))
    chunk = random.Random(1).randbytes(1 << 20).translate(letters)
    data = zipped({}, big=("word/document.xml", chunk, 11), level=1)
    forbid_unpacking(monkeypatch)
    assert await refused(data, "a.docx") == ZIP_BOMB


async def test_a_docx_unpacking_past_the_total_cap_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the total cap at 1 MB, a Word file whose parts unpack to ~2 MB (its picture) is refused."""
    data = word(["Hello"])
    monkeypatch.setattr(documents, "MEDIA_ZIP_MAX_BYTES", 1 << 20)
    picture = random.Random(2).randbytes(2 << 20)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        entries = {i.filename: zf.read(i) for i in zf.infolist()}
    data = zipped({**entries, "word/media/image1.png": picture})
    forbid_unpacking(monkeypatch)
    assert await refused(data, "a.docx") == ZIP_BOMB


async def test_a_zip_of_too_many_files_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """One file more than MEDIA_ZIP_MAX_ENTRIES, each tiny."""
    entries = {f"word/media/{i}.xml": b"<x/>" for i in range(MEDIA_ZIP_MAX_ENTRIES)}
    data = zipped({"word/document.xml": b"<w:document/>", **entries})
    forbid_unpacking(monkeypatch)
    assert await refused(data, "a.docx") == ZIP_BOMB


async def test_a_docx_with_broken_xml_is_damaged() -> None:
    """A real Word file whose body is not XML: damaged, in one line."""
    with zipfile.ZipFile(io.BytesIO(word(["Hello"]))) as zf:
        entries = {i.filename: zf.read(i) for i in zf.infolist()}
    data = zipped({**entries, "word/document.xml": b"<w:document><w:body><w:p>"})
    assert await refused(data, "letter.docx") == DOCX_DAMAGED


async def test_zips_that_are_not_word_files() -> None:
    """A zip without a Word body is not a kind read; named .docx it is damaged; a cut .docx is damaged."""
    other = zipped({"data.csv": b"a,b\n1,2\n"})
    assert await refused(other, "archive.zip") == UNSUPPORTED
    assert await refused(other, "letter.docx") == DOCX_DAMAGED
    assert await refused(word(["Hello"])[:500], "letter.docx") == DOCX_DAMAGED
    assert await refused(b"plain words", "letter.docx") == DOCX_DAMAGED


# Text


async def test_utf8_text_is_read() -> None:
    """UTF-8 with accents, CJK and a symbol."""
    text = "Grüße aus München — 日本語 ✓\nzweite Zeile"
    doc = await extract(text.encode(), "notes.md", "text/markdown")
    assert doc == Document("text", (text,), 1, False, "utf-8")


async def test_latin1_text_is_decoded_right() -> None:
    """A French text in Latin-1: every accent right (not cp1250's "crčme" or "ŕ")."""
    doc = await extract(FRENCH.encode("latin-1"), "lettre.txt", None)
    assert doc.pages == (FRENCH.strip(),)
    assert doc.encoding == "cp1252"


async def test_a_csv_with_a_byte_order_mark_and_windows_line_ends() -> None:
    """Excel's "CSV UTF-8": the mark dropped, CRLF read as line ends."""
    data = "\ufeffName,Größe\r\nÄpfel,3\r\n".encode()
    doc = await extract(data, "fruit.csv", "text/csv")
    assert doc.pages == ("Name,Größe\nÄpfel,3",)


async def test_json_and_source_files_are_text() -> None:
    """JSON and Python, by content, whatever the extension."""
    assert (await extract(b'{"a": [1, 2]}\n', "data.json", "application/json")).pages == ('{"a": [1, 2]}',)
    assert (await extract(b"def f():\n    return 1\n", "f.py", None)).pages == ("def f():\n    return 1",)


@pytest.mark.parametrize("fmt", ["random", "tar", "wav", "png"])
async def test_binary_files_are_refused_even_named_txt(fmt: str) -> None:
    """Random bytes, a tar archive (valid UTF-8: ASCII headers and NUL padding), a WAV and a PNG, each named .txt."""
    if fmt == "random":
        data = random.Random(3).randbytes(4096)
    elif fmt == "tar":
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            member = tarfile.TarInfo("notes.txt")
            member.size = 6
            tar.addfile(member, io.BytesIO(b"hello\n"))
        data = out.getvalue()
        data.decode()
    elif fmt == "wav":
        out = io.BytesIO()
        with wave.open(out, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(8000)
            w.writeframes(b"\0\0" * 8000)
        data = out.getvalue()
    else:
        out = io.BytesIO()
        Image.new("RGB", (64, 64), (200, 30, 30)).save(out, "PNG")
        data = out.getvalue()
    assert await refused(data, "notes.txt", "text/plain") == UNSUPPORTED


async def test_runs_of_blank_lines_become_one_and_the_ends_are_trimmed() -> None:
    """Word files and texts full of empty paragraphs: at most one blank line between paragraphs."""
    doc = await extract(b"\n\n  Title\n\n\n\n\nBody\r\n\r\n\r\nEnd  \n\n", "a.txt", None)
    assert doc.pages == ("Title\n\nBody\n\nEnd",)
    assert (await extract(word(["A", "", "", "", "B"]), "a.docx", None)).pages == ("A\n\nB",)


async def test_empty_and_blank_files() -> None:
    """No bytes: empty; only whitespace: no text."""
    assert await refused(b"", "a.txt") == EMPTY
    assert await refused(b"  \n\n\t ", "a.txt") == NO_TEXT


async def test_an_oversized_file_is_refused_before_it_is_read() -> None:
    """One byte over MEDIA_DOC_MAX_BYTES of plain text (readable otherwise)."""
    line = await refused(b"a" * (MEDIA_DOC_MAX_BYTES + 1), "big.txt")
    assert line == "That file is over 20 MB, more than I read: send a smaller one."
    assert await extract(b"a" * 10, "small.txt", None, max_bytes=10)


# Pages


async def test_a_long_text_is_split_into_pages_at_paragraphs() -> None:
    """~10 pages of 5-line paragraphs: each page ≤ 3,000 characters ending at a paragraph, not a line; nothing lost."""
    paragraphs = [
        "\n".join(f"Paragraph {i}, line {j}: " + " ".join(["word"] * 8) for j in range(5)) for i in range(120)
    ]
    text = "\n\n".join(paragraphs)
    doc = await extract(text.encode(), "book.txt", None)
    assert "".join(doc.pages) == text and doc.total_pages == len(doc.pages) > 10
    assert all(1500 < len(p) <= MEDIA_DOC_PAGE_CHARS for p in doc.pages[:-1])
    assert all(p.endswith("\n\n") for p in doc.pages[:-1])


async def test_a_text_past_the_character_cap_is_cut_and_its_pages_all_counted() -> None:
    """max_chars=5,000 of 30,100: 5,000 kept in two pages, the whole's twelve pages counted."""
    text = ("a line of text " * 20 + "\n") * 100  # 30,100 characters
    doc = await extract(text.encode(), "log.txt", None, max_chars=5000)
    assert doc.cut and len("".join(doc.pages)) == 5000 and len(doc.pages) == 2
    assert doc.total_pages == len(list(split_pages(text.strip()))) == 12


def test_pages_fall_back_to_line_ends_spaces_and_hard_cuts() -> None:
    """No blank lines: cut after a line end; one long line: after a space; no spaces: at the size."""
    lines = "\n".join(["x" * 70] * 10)
    assert all(p.endswith("\n") for p in list(split_pages(lines, 100))[:-1])
    words = " ".join(["y" * 30] * 10)
    assert [len(p) for p in split_pages(words, 100)] == [93, 93, 93, 30]
    assert [len(p) for p in split_pages("z" * 250, 100)] == [100, 100, 50]
    assert list(split_pages("", 100)) == []
