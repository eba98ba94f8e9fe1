"""Text from documents people send: PDF (pypdf), Word .docx (python-docx) and text files (plain text, Markdown, CSV,
JSON, source code; the charset detected). Everything that parses runs in a worker thread within size, page, character
and time caps; a file that is not read raises DocumentRefused with one line for the person who sent it."""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import math
import re
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from core.constants import (
    MEDIA_DOC_DETECT_BYTES,
    MEDIA_DOC_MAX_BYTES,
    MEDIA_DOC_MAX_CHARS,
    MEDIA_DOC_MAX_CONTROL,
    MEDIA_DOC_MAX_PAGES,
    MEDIA_DOC_PAGE_CHARS,
    MEDIA_DOC_TIMEOUT_S,
    MEDIA_DOCX_MAX_XML_BYTES,
    MEDIA_ZIP_MAX_BYTES,
    MEDIA_ZIP_MAX_ENTRIES,
    MEDIA_ZIP_MAX_RATIO,
    MEDIA_ZIP_RATIO_FROM_BYTES,
)
from core.textsafe import strip_nul

if TYPE_CHECKING:  # the readers load with the first file of their kind (a process that never sees one never pays)
    import pypdf
    from docx.table import Table

log = logging.getLogger(__name__)

Kind = Literal["pdf", "docx", "text"]

TOO_LARGE = "That file is over {mb:g} MB, more than I read: send a smaller one."
EMPTY = "That file is empty."
UNSUPPORTED = (
    "I can't read that kind of file: I read PDF, Word (.docx) and text files (text, Markdown, CSV, JSON, code)."
)
NO_TEXT = "That file has no text in it."
SCANNED = "That PDF has no text I can read (a scan?) — send the pages as photos instead."
ENCRYPTED = "That PDF is password-protected: send a copy without the password."
PDF_DAMAGED = "That PDF is damaged or cut short: I can't read it."
DOCX_DAMAGED = "That Word file is damaged or cut short: I can't read it."
ZIP_BOMB = "That Word file unpacks to far more than I open: save it as PDF or send a smaller one."
TOO_SLOW = "Reading that file took over {s:g} seconds, so I stopped: send a smaller one."

PDF_MAGIC = b"%PDF-"
ZIP_MAGIC = b"PK\x03\x04"
PDF_MIMES = {"application/pdf", "application/x-pdf"}
DOCX_MIMES = {"application/vnd.openxmlformats-officedocument.wordprocessingml.document"}
DOCX_BODY = "word/document.xml"
# Characters no text file is made of (tab, newlines, form feed and ESC of coloured logs are allowed).
CONTROL = re.compile("[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f\ufffd]")


class DocumentRefused(Exception):
    """A document that is not read; str(e) is one line for the person who sent it (no path, no traceback)."""


@dataclass(frozen=True)
class Document:
    """A document's text in pages: a PDF's own pages, or a Word or text file cut at paragraphs into ~3,000 characters.

    total_pages counts the whole file even when `cut` (pages or characters capped); for a cut Word file it is
    estimated from the length of its whole text. encoding is the charset a text file was decoded with.
    """

    kind: Kind
    pages: tuple[str, ...]
    total_pages: int
    cut: bool
    encoding: str | None = None


@dataclass(frozen=True)
class _Caps:
    """What one extraction may take, and the flag that tells its worker to stop (set on timeout or cancel)."""

    max_pages: int
    max_chars: int
    stop: threading.Event


async def extract(
    data: bytes,
    filename: str,
    mime: str | None,
    *,
    timeout_s: float = MEDIA_DOC_TIMEOUT_S,
    max_pages: int = MEDIA_DOC_MAX_PAGES,
    max_chars: int = MEDIA_DOC_MAX_CHARS,
    max_bytes: int = MEDIA_DOC_MAX_BYTES,
) -> Document:
    """The text of the document in `data`, read in a worker thread; DocumentRefused (one line) if it is not read."""
    if len(data) > max_bytes:
        raise DocumentRefused(TOO_LARGE.format(mb=round(max_bytes / (1024 * 1024), 1)))
    if not data:
        raise DocumentRefused(EMPTY)
    kind = _kind(data, filename, mime)
    caps = _Caps(max_pages, max_chars, threading.Event())
    try:
        # A thread cannot be killed: on timeout the worker is abandoned and stops at its next page (caps.stop);
        # one page, or one Word/text parse (bounded by the size caps above), is all it can still run for.
        return await asyncio.wait_for(asyncio.to_thread(_extract, kind, data, filename, mime, caps), timeout_s)
    except TimeoutError:
        raise DocumentRefused(TOO_SLOW.format(s=timeout_s)) from None
    finally:
        caps.stop.set()


def _named(filename: str, mime: str | None, suffix: str, mimes: set[str]) -> bool:
    """Whether the file's name or declared type says it is of this kind."""
    return filename.lower().endswith(suffix) or (mime or "").lower() in mimes


def _kind(data: bytes, filename: str, mime: str | None) -> Kind:
    """The kind by content (magic bytes); a name that promises a PDF or Word file its content isn't is damaged."""
    if data.startswith(PDF_MAGIC):
        return "pdf"
    if data.startswith(ZIP_MAGIC):
        return "docx"  # if it holds a Word body: checked in the worker
    if _named(filename, mime, ".pdf", PDF_MIMES):
        raise DocumentRefused(PDF_DAMAGED)
    if _named(filename, mime, ".docx", DOCX_MIMES):
        raise DocumentRefused(DOCX_DAMAGED)
    return "text"


def _extract(kind: Kind, data: bytes, filename: str, mime: str | None, caps: _Caps) -> Document:
    """The worker: one kind's reader."""
    if kind == "pdf":
        return _pdf(data, caps)
    if kind == "docx":
        return _docx(data, _named(filename, mime, ".docx", DOCX_MIMES), caps)
    return _text(data, caps)


# PDF


def _pdf(data: bytes, caps: _Caps) -> Document:
    """A PDF's pages' text, the first max_pages of them and max_chars in all."""
    import pypdf

    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not _unlock(reader):
            raise DocumentRefused(ENCRYPTED)
        total = len(reader.pages)
    except DocumentRefused:
        raise
    except Exception as e:  # pypdf raises many kinds on broken files; all mean the same to the sender
        log.info("unreadable PDF: %s: %s", type(e).__name__, e)
        raise DocumentRefused(PDF_DAMAGED) from None
    pages: list[str] = []
    chars, failed, cut = 0, 0, total > caps.max_pages
    for page in itertools.islice(reader.pages, caps.max_pages):
        if caps.stop.is_set():
            break
        try:
            text = page.extract_text()
        except Exception as e:  # one broken page is left empty, the others still read
            log.info("unreadable PDF page: %s: %s", type(e).__name__, e)
            text, failed = "", failed + 1
        if chars + len(text) > caps.max_chars:
            pages.append(text[: caps.max_chars - chars])
            cut = True
            break
        pages.append(text)
        chars += len(text)
    if not any(p.strip() for p in pages):
        raise DocumentRefused(PDF_DAMAGED if failed else SCANNED)
    return Document("pdf", tuple(pages), total, cut)


def _unlock(reader: pypdf.PdfReader) -> bool:
    """Whether an encrypted PDF opens without a password (an owner-only password that just restricts printing)."""
    from pypdf import PasswordType
    from pypdf.errors import DependencyError

    try:
        return reader.decrypt("") != PasswordType.NOT_DECRYPTED
    except DependencyError:  # AES needs the cryptography package, which is not installed
        return False


# Word


def _docx(data: bytes, named: bool, caps: _Caps) -> Document:
    """A Word file's paragraphs and tables in order, up to max_chars, after the zip passed its caps unopened."""
    try:
        infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as e:
        log.info("unreadable zip: %s", e)
        raise DocumentRefused(DOCX_DAMAGED if named else UNSUPPORTED) from None
    body = next((i for i in infos if i.filename == DOCX_BODY), None)
    if body is None:
        raise DocumentRefused(DOCX_DAMAGED if named else UNSUPPORTED)
    _check_zip(infos, body)
    import docx
    from docx.oxml.ns import qn
    from docx.table import Table

    try:
        document = docx.Document(io.BytesIO(data))
        lines: list[str] = []
        chars, more = 0, False
        for block in document.iter_inner_content():
            if caps.stop.is_set() or chars >= caps.max_chars:
                more = True  # reading stops: the rest is only measured, from the XML's text runs (fast, in C)
                break
            text = _table_text(block) if isinstance(block, Table) else block.text
            lines.append(text)
            chars += len(text) + 1
        whole = sum(len(t) for t in document.element.body.itertext(qn("w:t"))) if more else 0
    except DocumentRefused:
        raise
    except Exception as e:  # python-docx and lxml raise many kinds on broken files
        log.info("unreadable Word file: %s: %s", type(e).__name__, e)
        raise DocumentRefused(DOCX_DAMAGED) from None
    doc = _paged("docx", "\n".join(lines), caps.max_chars, None)
    total = max(doc.total_pages, math.ceil(whole / MEDIA_DOC_PAGE_CHARS))
    return Document("docx", doc.pages, total, doc.cut or more)


def _check_zip(infos: list[zipfile.ZipInfo], body: zipfile.ZipInfo) -> None:
    """Refuse a zip bomb before anything is decompressed, from its directory's declared sizes.

    The declared sizes bound what is read: zipfile stops at an entry's declared size (and fails its CRC check).
    """
    if len(infos) > MEDIA_ZIP_MAX_ENTRIES or sum(i.file_size for i in infos) > MEDIA_ZIP_MAX_BYTES:
        raise DocumentRefused(ZIP_BOMB)
    if body.file_size > MEDIA_DOCX_MAX_XML_BYTES:
        raise DocumentRefused(ZIP_BOMB)
    for i in infos:
        if i.file_size > MEDIA_ZIP_RATIO_FROM_BYTES and i.file_size > MEDIA_ZIP_MAX_RATIO * max(i.compress_size, 1):
            raise DocumentRefused(ZIP_BOMB)


def _table_text(table: Table) -> str:
    """A table as lines of ` | `-separated cells (a merged cell once), with a blank line before and after."""
    rows = []
    for row in table.rows:
        cells: list[str] = []
        last = None
        for cell in row.cells:
            if cell is not last:  # a cell spanning columns comes once per column, as the same object
                cells.append(" ".join(cell.text.split()))
            last = cell
        rows.append(" | ".join(cells))
    return "\n" + "\n".join(rows) + "\n"


# Text


def _text(data: bytes, caps: _Caps) -> Document:
    """A text file decoded (charset detected); binary content is refused."""
    text, encoding = _decode(data)
    sample = text[:MEDIA_DOC_DETECT_BYTES]
    if len(CONTROL.findall(sample)) > MEDIA_DOC_MAX_CONTROL * len(sample):
        raise DocumentRefused(UNSUPPORTED)
    return _paged("text", text.replace("\r\n", "\n"), caps.max_chars, encoding)


def _decode(data: bytes) -> tuple[str, str]:
    """The text and its encoding: UTF-8 (its byte order mark dropped), else what charset-normalizer finds."""
    try:
        return data.decode("utf-8-sig"), "utf-8"
    except UnicodeDecodeError:
        pass
    import charset_normalizer

    matches = charset_normalizer.from_bytes(data[:MEDIA_DOC_DETECT_BYTES])
    best = matches.best()
    if best is None:
        raise DocumentRefused(UNSUPPORTED)
    encoding = best.encoding
    # Latin-1 text often decodes equally well as cp1250 and cp1252 (a tie charset-normalizer breaks by name):
    # prefer Windows' Western encoding, by far the commonest, when it is as good as the best.
    for m in matches:
        if m.encoding == "cp1252" and m.chaos <= best.chaos and m.coherence >= best.coherence:
            encoding = m.encoding
    return data.decode(encoding, errors="replace"), encoding


# Pages


def _paged(kind: Kind, text: str, max_chars: int, encoding: str | None) -> Document:
    """Text cut to max_chars and split into pages (without NUL: a stray one in a text file, or in a PDF's text, is
    no character PostgreSQL can store); total_pages counts the pages of the whole text."""
    text = re.sub(r"\n{3,}", "\n\n", strip_nul(text).strip())
    if not text:
        raise DocumentRefused(NO_TEXT)
    cut = len(text) > max_chars
    pages = tuple(split_pages(text[:max_chars]))
    total = sum(1 for _ in split_pages(text)) if cut else len(pages)
    return Document(kind, pages, total, cut, encoding)


def split_pages(text: str, size: int = MEDIA_DOC_PAGE_CHARS) -> Iterator[str]:
    """Pages of at most `size` characters, cut at a blank line, else a line end, else a space in their second half.

    Nothing is lost: the pages joined are the text.
    """
    start, end = 0, len(text)
    while end - start > size:
        stop = start + size
        cut = stop
        for sep in ("\n\n", "\n", " "):
            at = text.rfind(sep, start + size // 2, stop)
            if at >= 0:
                cut = at + len(sep)
                break
        yield text[start:cut]
        start = cut
    if start < end:
        yield text[start:]
