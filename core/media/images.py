"""Photos for the model: decoded off the event loop with Pillow, decompression-bomb safe, turned upright, flattened to
RGB, shrunk to MEDIA_IMAGE_MAX_SIDE and re-encoded as a metadata-free JPEG (no EXIF, GPS, XMP, comment or ICC
profile reaches the model or the database). Stickers and GIFs get a short text instead: no image goes to the model."""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import math
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from core.constants import (
    MEDIA_IMAGE_JPEG_QUALITY,
    MEDIA_IMAGE_MAX_BYTES,
    MEDIA_IMAGE_MAX_INPUT_BYTES,
    MEDIA_IMAGE_MAX_PIXELS,
    MEDIA_IMAGE_MAX_SIDE,
    MEDIA_IMAGE_MIN_QUALITY,
    MEDIA_IMAGE_MIN_SIDE,
    MEDIA_IMAGE_QUALITY_STEP,
    MEDIA_IMAGE_SHRINK,
    MEDIA_STICKER_EMOJI_CHARS,
    MEDIA_STICKER_NAME_CHARS,
)

if TYPE_CHECKING:  # Pillow loads with the first image (a process that never sees one never pays)
    from PIL import Image

log = logging.getLogger(__name__)


@cache
def formats() -> tuple[str, ...]:
    """Only these decoders ever see a file (no EPS/Ghostscript, no TIFF codecs, ...); GIF, WebP, PNG (APNG) give
    frame 0; JPEG takes MPO too; AVIF when this Pillow has it."""
    from PIL import features

    return ("JPEG", "PNG", "GIF", "WEBP", "BMP") + (("AVIF",) if features.check_module("avif") else ())


# How the files of formats() start (WebP and AVIF sit in containers whose first bytes say less: left out)
IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")

TOO_LARGE = "That image is over {mb} MB, more than I take: send a smaller one."
NOT_AN_IMAGE = "That file isn't an image I can read (I take JPEG, PNG, GIF, WebP, BMP and AVIF)."
TOO_MANY_PIXELS = "That image is {w}×{h} pixels, more than I open (at most {mp:g} million): send a smaller one."
FAR_TOO_MANY_PIXELS = "That image has far too many pixels for me to open (at most {mp:g} million): send a smaller one."
DAMAGED = "That image is damaged or cut short: I can't read it."
EMPTY = "That image has no pixels."
CANNOT_SHRINK = "I couldn't make that image small enough for the model."


class ImageRefused(Exception):
    """An image that is not taken; str(e) is one line for the person who sent it."""


@dataclass(frozen=True)
class Prepared:
    """An image ready for the model: a metadata-free JPEG and its size, beside the original's (as displayed)."""

    data: bytes
    mime: Literal["image/jpeg"]
    width: int
    height: int
    original_width: int
    original_height: int


async def prepare(
    data: bytes,
    *,
    max_side: int = MEDIA_IMAGE_MAX_SIDE,
    max_bytes: int = MEDIA_IMAGE_MAX_BYTES,
    max_pixels: int = MEDIA_IMAGE_MAX_PIXELS,
    max_input_bytes: int = MEDIA_IMAGE_MAX_INPUT_BYTES,
) -> Prepared:
    """The image in `data` made ready for the model, in a worker thread; ImageRefused (one line) if it is not taken."""
    return await asyncio.to_thread(
        _prepare, data, max_side=max_side, max_bytes=max_bytes, max_pixels=max_pixels, max_input_bytes=max_input_bytes
    )


def image_part(jpeg: bytes) -> dict[str, Any]:
    """The OpenAI chat content part carrying a prepared image (its JPEG) inline."""
    url = f"data:image/jpeg;base64,{base64.b64encode(jpeg).decode('ascii')}"
    return {"type": "image_url", "image_url": {"url": url}}


def sticker_text(emoji: str | None, name: str | None, animated: bool) -> str:
    """What the model reads for a sticker (animated=False) or a GIF/animation (True): "[sticker 😂]", "[GIF: a.gif]"."""
    label = "GIF" if animated else "sticker"
    shown_emoji = _one_line(emoji or "", MEDIA_STICKER_EMOJI_CHARS)
    shown_name = _one_line(name or "", MEDIA_STICKER_NAME_CHARS)
    if shown_emoji:
        label += f" {shown_emoji}"
    if shown_name:
        label += f": {shown_name}"
    return f"[{label}]"


def _one_line(text: str, limit: int) -> str:
    """`text` without control characters or brackets, whitespace runs as one space, cut to `limit` characters."""
    kept = "".join(" " if c.isspace() or not c.isprintable() or c in "[]" else c for c in text)
    return " ".join(kept.split())[:limit].strip()


def _prepare(data: bytes, *, max_side: int, max_bytes: int, max_pixels: int, max_input_bytes: int) -> Prepared:
    """The blocking work of prepare(): size check before any decoding, then decode, fix up and encode."""
    if len(data) > max_input_bytes:
        raise ImageRefused(TOO_LARGE.format(mb=max_input_bytes // (1024 * 1024)))
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data), formats=formats()) as img:
            return _convert(img, max_side=max_side, max_bytes=max_bytes, max_pixels=max_pixels)
    except ImageRefused:
        raise
    except UnidentifiedImageError:  # also a file of a format we take whose header Pillow finds broken
        raise ImageRefused(DAMAGED if data.startswith(IMAGE_MAGIC) else NOT_AN_IMAGE) from None
    except Image.DecompressionBombError:  # over twice Pillow's own cap: refused by Image.open from the header
        raise ImageRefused(FAR_TOO_MANY_PIXELS.format(mp=max_pixels / 1_000_000)) from None
    except Exception as e:  # Pillow's decoders raise many kinds (OSError, SyntaxError, ValueError, struct.error, ...)
        log.info("image refused as damaged: %s: %s", type(e).__name__, e, exc_info=True)
        raise ImageRefused(DAMAGED) from None


def _convert(img: Image.Image, *, max_side: int, max_bytes: int, max_pixels: int) -> Prepared:
    """Decode `img` (header read) within max_pixels and make the JPEG; the pixel cap is checked before load()."""
    from PIL import Image

    raw_w, raw_h = img.size
    if raw_w < 1 or raw_h < 1:
        raise ImageRefused(EMPTY)
    scale = min(1.0, max_side / max(raw_w, raw_h))
    img.draft("RGB", (math.ceil(raw_w * scale), math.ceil(raw_h * scale)))  # a JPEG decodes at 1/2, 1/4, 1/8 size
    if img.size[0] * img.size[1] > max_pixels:
        raise ImageRefused(TOO_MANY_PIXELS.format(w=raw_w, h=raw_h, mp=max_pixels / 1_000_000))
    img.load()
    decoded = img.size
    _upright(img)
    original = (raw_w, raw_h) if img.size == decoded else (raw_h, raw_w)  # as displayed
    rgb = _flatten(img)
    if rgb is not img:
        img.close()  # frees the decoded pixels now (the caller's `with` holds img): a smaller peak
    target = _fit(original, max_side)
    if rgb.size != target:
        factor = min(rgb.width // target[0], rgb.height // target[1])
        if factor >= 2:  # a cheap box reduction first, so the full-size pixels are freed before the fine resize
            smaller = rgb.reduce(factor)
            rgb.close()  # the caller's `with` closes it again: harmless
            rgb = smaller
        rgb = rgb.resize(target, Image.Resampling.LANCZOS, reducing_gap=3.0)
    data, rgb = _encode(rgb, max_bytes)
    return Prepared(data, "image/jpeg", rgb.width, rgb.height, original[0], original[1])


def _upright(img: Image.Image) -> None:
    """Turn `img` in place as its EXIF orientation says (left as it is if the EXIF can't be read)."""
    from PIL import ImageOps

    try:
        ImageOps.exif_transpose(img, in_place=True)  # in place: no copy of an image that is upright already
    except Exception as e:
        log.info("image EXIF orientation ignored: %s: %s", type(e).__name__, e)


def _flatten(img: Image.Image) -> Image.Image:
    """`img` as RGB: transparency over white, 16-bit grey scaled to 8 bits, palettes and CMYK converted."""
    from PIL import Image

    if img.mode == "I" or img.mode.startswith("I;16"):
        img = img.convert("I").point(lambda v: v * (1 / 256)).convert("L")
    if img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info:
        rgba = img if img.mode == "RGBA" else img.convert("RGBA")
        white = Image.new("RGB", rgba.size, "white")
        white.paste(rgba, mask=rgba)  # an RGBA mask: its alpha band, without a copy of it
        return white
    return img.convert("RGB") if img.mode != "RGB" else img


def _fit(size: tuple[int, int], max_side: int) -> tuple[int, int]:
    """`size` scaled so its long side is at most max_side, aspect kept, never upscaled."""
    w, h = size
    if max(w, h) <= max_side:
        return w, h
    r = max_side / max(w, h)
    return max(1, round(w * r)), max(1, round(h * r))


def _encode(rgb: Image.Image, max_bytes: int) -> tuple[bytes, Image.Image]:
    """The JPEG of `rgb` within max_bytes (quality lowered stepwise, then the image shrunk), and the image encoded."""
    from PIL import Image

    rgb.info = {}  # nothing of the original's metadata (EXIF, comment, XMP, ICC) is written
    quality = MEDIA_IMAGE_JPEG_QUALITY
    while True:
        buf = io.BytesIO()
        rgb.save(buf, "JPEG", quality=quality, optimize=True)
        if buf.tell() <= max_bytes:
            return buf.getvalue(), rgb
        if quality > MEDIA_IMAGE_MIN_QUALITY:
            quality = max(MEDIA_IMAGE_MIN_QUALITY, quality - MEDIA_IMAGE_QUALITY_STEP)
            continue
        smaller = (max(1, round(rgb.width * MEDIA_IMAGE_SHRINK)), max(1, round(rgb.height * MEDIA_IMAGE_SHRINK)))
        if max(smaller) < MEDIA_IMAGE_MIN_SIDE:
            raise ImageRefused(CANNOT_SHRINK)
        rgb = rgb.resize(smaller, Image.Resampling.LANCZOS)
        rgb.info = {}
