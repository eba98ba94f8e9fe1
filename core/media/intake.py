"""What the files that came with a message add to it before the model sees it: a voice note's transcript becomes the
person's words (shown back in the steps as "heard", so a wrong transcription is visible), a document's first page goes
into the message and the rest stays readable with read_attachment; each is kept for the account (core/media/store.py).
A file that cannot be taken in leaves one clear line, and its platform reference is kept so nothing is lost."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from core.activity import heard_step
from core.constants import MEDIA_FIRST_PAGE_CHARS
from core.media import photos, store
from core.media.audio import Audio, AudioRefused
from core.media.documents import DocumentRefused, extract
from core.media.images import ImageRefused, prepare
from core.quoting import truncate
from core.storage.db import Pool
from core.types import Quoted, Step, Upload

NOT_YET = "I can't look at {what} yet — tell me in words what it shows (text sent with it is read)."
NO_VISION = "The model here can't look at images, so I read only the text sent with the photo."
NO_AUDIO = "Voice notes are not set up here (the operator can set TRANSCRIPTION_MODEL) — please type it instead."


@dataclass
class Intake:
    """What a message's files add: text for the model, steps for the reply, and lines saying what could not be read."""

    text: list[str] = field(default_factory=list)  # the person's own words (a transcript)
    quoted: list[Quoted] = field(default_factory=list)  # a document's text: whoever wrote it, data, not instructions
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)  # the attachments whose text the turn holds (linked to it later)

    def message(self, caption: str) -> str:
        """The person's message as the model gets it: what the files said, then the text sent with them."""
        return "\n\n".join(x for x in [*self.text, caption.strip()] if x)


@dataclass(frozen=True)
class Owner:
    """Whose files these are and where they came in."""

    account_id: int
    identity_id: int
    chat_id: int
    now: datetime
    cap_bytes: int
    vision: bool = False  # the turn's model gets photos as images


async def take_in(pool: Pool, audio: Audio | None, uploads: tuple[Upload, ...], owner: Owner) -> Intake:
    """Transcribe, extract and keep the message's files, in order."""
    intake = Intake()
    for up in uploads:
        up = await up.load() if up.load is not None else up  # fetched from its platform only now
        try:
            if up.refused is not None or up.data is None:
                raise _Refused(up.refused or "I could not fetch that file.")
            if up.kind in ("voice", "audio"):
                await _voice(pool, audio, up, owner, intake)
            elif up.kind == "document":
                await _document(pool, up, owner, intake)
            elif up.kind == "photo":
                await _photo(pool, up, owner, intake)
            else:
                raise _Refused(NOT_YET.format(what="stickers"))
        except (_Refused, AudioRefused, DocumentRefused, ImageRefused, store.StorageFull) as e:
            intake.notes.append(str(e))
            await _keep_reference(pool, up, owner)
    return intake


class _Refused(Exception):
    """A file this message cannot use; the message is the line to show."""


async def _voice(pool: Pool, audio: Audio | None, up: Upload, owner: Owner, intake: Intake) -> None:
    """A voice note or audio file: its transcript is the person's words."""
    if audio is None:
        raise _Refused(NO_AUDIO)
    assert up.data is not None
    before = await _known(pool, up, owner)
    saved = before[0] if before is not None else 0
    if before is not None:
        heard = before[1][0] if before[1] else ""
    else:
        heard = (await audio.transcribe(up.data, up.name or "voice.ogg", up.mime, up.duration_s)).strip()
        saved = await _save(pool, up, owner, pages=[heard], total=1)
    intake.text.append(heard)
    intake.steps.append(heard_step(heard))
    intake.kept.append(saved)


async def _document(pool: Pool, up: Upload, owner: Owner, intake: Intake) -> None:
    """A document: its first page goes into the message; the rest is read with read_attachment."""
    assert up.data is not None
    doc = await extract(up.data, up.name, up.mime)
    before = await _known(pool, up, owner)
    attachment = before[0] if before else await _save(pool, up, owner, pages=list(doc.pages), total=doc.total_pages)
    shown = truncate(doc.pages[0], MEDIA_FIRST_PAGE_CHARS) if doc.pages else ""
    more = f"; read_attachment(id={attachment}, page=N) reads pages 2 to {len(doc.pages)}" if len(doc.pages) > 1 else ""
    cut = f" (only the first {len(doc.pages)} of {doc.total_pages} were read)" if doc.cut else ""
    head = f"({doc.kind}, {doc.total_pages} page(s){cut}; attachment #{attachment}{more}; page 1:)"
    intake.quoted.append(Quoted("file", up.name or "document", f"{head}\n{shown}"))


async def _photo(pool: Pool, up: Upload, owner: Owner, intake: Intake) -> None:
    """A photo: made ready for the model and kept; the message holds its mark, the turn sends the image itself."""
    if not owner.vision:
        raise _Refused(NO_VISION)
    assert up.data is not None
    before = await _known(pool, up, owner)
    if before is not None:
        saved = before[0]
    else:
        prepared = await prepare(up.data)
        saved = await _save(pool, up, owner, pages=None, total=None, data=prepared.data, mime=prepared.mime)
    intake.quoted.append(Quoted("photo", up.name or "photo", photos.mark(saved)))  # what it shows: anyone's words
    intake.kept.append(saved)


async def _known(pool: Pool, up: Upload, owner: Owner) -> tuple[int, list[str]] | None:
    """This file as taken in before in this chat (sent again, or handled again after a crash), if it was."""
    if up.platform_ref is None:
        return None
    return await store.known(pool, owner.account_id, owner.chat_id, up.kind, up.platform_ref)


async def _save(
    pool: Pool,
    up: Upload,
    owner: Owner,
    *,
    pages: list[str] | None,
    total: int | None,
    data: bytes | None = None,
    mime: str | None = None,
) -> int:
    """Keep what was made of a file for its account (`data`: a prepared photo, of type `mime`)."""
    return await store.save(
        pool,
        account_id=owner.account_id,
        identity_id=owner.identity_id,
        chat_id=owner.chat_id,
        turn_id=None,
        kind=up.kind,
        name=up.name,
        mime=mime or up.mime,
        platform_ref=up.platform_ref,
        data=data,
        pages=pages,
        total_pages=total,
        now=owner.now,
        cap_bytes=owner.cap_bytes,
    )


async def _keep_reference(pool: Pool, up: Upload, owner: Owner) -> None:
    """A file that could not be taken in: its platform reference is kept (no bytes), so it can be fetched again."""
    if up.platform_ref is None:
        return
    try:
        await _save(pool, up, owner, pages=None, total=None)
    except store.StorageFull:
        pass  # the note already says why nothing more is kept
