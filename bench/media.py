"""Files people send (issue 23): what a voice note, a long PDF and a 20 MB file cost the bot.

1. A Telegram voice note (--voice-kb of bytes) through the real python-telegram-bot, TelegramAdapter and Core against
   the fake Bot API (tests.fake_telegram: getFile + the file's GET) and the fake model in its own process, whose
   /audio/transcriptions answers at once: push → the reply's sendMessage, against a text turn's, interleaved; and the
   pieces timed inside those turns: the download (getFile + GET) and the transcription upload, and the whole intake.
2. A 50-page PDF (text, built like tests/test_media_documents.py's pdf()): extract() alone, then the whole intake of
   a Telegram document turn (extract + store in PostgreSQL), timed inside the turn.
3. Peak memory for a ~20 MB file, each in a child process of its own: its RSS once imported and warmed up (idle),
   then the peak while it extracts a 20 MB CSV and a ~20 MB PDF, and prepares a ~20 MB JPEG and a ~20 MB PNG (no
   scaled-down decoding: the worst case) for the model (the input bytes count: read after idle). Goal: <= 100 MB above
   idle.
PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server in a temp dir.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import gc
import io
import json
import os
import resource
import subprocess
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from PIL import Image

import adapters.telegram.handlers as tg_handlers
from bench.common import (
    REPO_ROOT,
    FakeLLMProcess,
    bench_database,
    goal_line,
    parse,
    parser,
    percentile,
    quiet_logging,
    spread,
)
from bench.telegram_overhead import ID_BASE, MESSAGE_ID_STRIDE, Rig, make_rig
from core.constants import MEDIA_DOC_MAX_BYTES, MEDIA_IMAGE_MAX_INPUT_BYTES, MEDIA_IMAGE_MAX_PIXELS
from core.front_door import Core
from core.media.documents import extract
from core.media.images import prepare
from tests.fake_openai import TRANSCRIPT
from tests.test_media_documents import pdf

GOAL_PEAK_MB = 100.0
USER = 7101  # a private chat: chat id == user id
PAUSE_S = 0.05  # between turns (not timed): ~20 replies a second stays under the adapter's send window
MB = 1_000_000
TARGET_BYTES = 20 * MB  # "a 20 MB file" (under the 20 MiB caps of documents and images)
P = ParamSpec("P")
R = TypeVar("R")
WORDS = "the tenant shall pay the rent of nine hundred euros on the first day of each month to the landlord".split()


# ---------------------------------------------------------------- timing pieces inside real turns


class Timings:
    """Milliseconds of named pieces, collected while wrapped functions run."""

    def __init__(self) -> None:
        """No samples yet."""
        self.ms: dict[str, list[float]] = {}

    def timed(self, name: str, fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        """`fn` that files its wall time under `name`."""

        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            t0 = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self.ms.setdefault(name, []).append((time.perf_counter() - t0) * 1000)

        return wrapper

    def clear(self) -> None:
        """Forget the samples (after a warm-up)."""
        self.ms.clear()

    def line(self, name: str, label: str) -> str:
        """`label: p50 … p99 … (n=…)`."""
        return f"    {label:<44} {spread(sorted(self.ms.get(name, [])))}"


@contextmanager
def instrumented(core: Core, timings: Timings) -> Iterator[None]:
    """Time the adapter's download, the transcription upload and the core's whole intake inside real turns."""
    names = vars(tg_handlers)  # the adapter's handlers call the `download` they imported
    download = names["download"]
    names["download"] = timings.timed("download", download)
    core.audio.transcribe = timings.timed("transcribe", core.audio.transcribe)  # type: ignore[method-assign]
    core.turns._take_in = timings.timed("intake", core.turns._take_in)  # type: ignore[method-assign]
    try:
        yield
    finally:
        names["download"] = download
        del core.audio.transcribe, core.turns._take_in  # back to the classes' methods


async def media_turn(rig: Rig, update: dict[str, Any], expect: str = "ok") -> float:
    """Push one update and wait for the reply's sendMessage (saying `expect`) at the fake; push → sendMessage in ms."""
    fake = rig.fake
    before = len(fake.sent)
    pushed = time.monotonic()
    rig.push(update)
    await fake.wait_sent(before + 1, timeout=30.0)
    reply = fake.sent[before]
    if reply.get("chat_id") != USER or expect not in str(reply.get("text", "")):
        raise RuntimeError(f"unexpected reply: {str(reply.get('text'))[:200]!r}")
    return (fake.sent_at[before] - pushed) * 1000


def message_fields(rig: Rig) -> dict[str, Any]:
    """The sender and a fresh message id for the next update."""
    rig.turns_done += 1
    return {"message_id": ID_BASE * rig.tag + rig.turns_done * MESSAGE_ID_STRIDE, "chat_id": USER, "user_id": USER}


# ---------------------------------------------------------------- part 1: a voice note


async def against_text(
    rig: Rig, turns: int, warmup: int, media: Callable[[], dict[str, Any]], expect: str, label: str
) -> Timings:
    """`media` turns and text turns interleaved (after `warmup` of each, PAUSE_S apart, not timed): both spreads and
    what the media turn adds; its pieces are in the returned Timings."""
    timings = Timings()
    media_ms: list[float] = []
    text_ms: list[float] = []
    with instrumented(rig.core, timings):
        for i in range(warmup + turns):
            if i == warmup:
                timings.clear()
                media_ms.clear()
                text_ms.clear()
            media_ms.append(await media_turn(rig, media(), expect))
            await asyncio.sleep(PAUSE_S)
            text = rig.fake.message_update(f"what is on my list for today? (#{i})", **message_fields(rig))
            text_ms.append(await media_turn(rig, text))
            await asyncio.sleep(PAUSE_S)
    media_ms.sort()
    text_ms.sort()
    print(f"    {label + ' turn':<44} {spread(media_ms)}")
    print(f"    {'text turn':<44} {spread(text_ms)}")
    added = [percentile(media_ms, q) - percentile(text_ms, q) for q in (50, 99)]
    print(f"    {'added by the ' + label + ' (' + label + ' − text)':<44} p50 {added[0]:6.2f}  p99 {added[1]:6.2f} ms")
    return timings


async def part_voice(rig: Rig, turns: int, warmup: int, voice_kb: int) -> None:
    """Voice and text turns interleaved; the voice turn's extra time and its pieces."""
    if turns <= 0:
        return
    print(
        f"== 1. A {voice_kb} KB voice note, push → sendMessage, against a text turn: {turns} of each interleaved "
        f"after {warmup} warm-up, {PAUSE_S:g} s apart (not timed); the fake model transcribes at once =="
    )
    ogg = b"OggS\x00\x02" + os.urandom(voice_kb * 1024 - 6)
    voice = lambda: rig.fake.voice_update(ogg, duration=20, **message_fields(rig))  # noqa: E731
    timings = await against_text(rig, turns, warmup, voice, f"heard: “{TRANSCRIPT}”", "voice note")
    print("  inside the voice turns:")
    print(timings.line("download", "download: getFile + GET of the file [adapter]"))
    print(timings.line("transcribe", "upload to /audio/transcriptions [core, SDK]"))
    print(timings.line("intake", "whole intake: download, transcribe, store"))
    print()


# ---------------------------------------------------------------- part 1b: a photo


def camera_jpeg(width: int, height: int) -> bytes:
    """A phone-camera-like JPEG: smooth gradients with some noise, quality 90."""
    small = Image.frombytes("RGB", (64, 48), os.urandom(64 * 48 * 3)).resize((width, height), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    small.save(out, "JPEG", quality=90)
    return out.getvalue()


async def part_photo(rig: Rig, turns: int, warmup: int) -> None:
    """Photo and text turns interleaved; the photo turn's extra time (download, resize, store, the image sent; the
    text turns send the 3 newest photos again)."""
    if turns <= 0:
        return
    data = camera_jpeg(4000, 3000)
    print(
        f"== 1b. A 12 MP camera photo ({len(data) / 1024:.0f} KB JPEG), push → sendMessage, against a text turn: "
        f"{turns} of each interleaved after {warmup} warm-up; the fake model answers at once =="
    )
    photo = lambda: rig.fake.photo_update([(4000, 3000, data)], caption="what is this?", **message_fields(rig))  # noqa: E731
    timings = await against_text(rig, turns, warmup, photo, "ok", "photo")
    print(timings.line("download", "download: getFile + GET of the file [adapter]"))
    print(timings.line("intake", "whole intake: download, decode, resize, JPEG, store"))
    print()


# ---------------------------------------------------------------- part 2: a 50-page PDF


def pdf_pages(pages: int, chars: int) -> list[str]:
    """`pages` pages of plain words, about `chars` characters each."""
    line = " ".join(WORDS)
    return [f"Page {n}: " + (line * (chars // len(line) + 1))[:chars] for n in range(1, pages + 1)]


async def part_pdf(rig: Rig, runs: int, pages: int) -> None:
    """extract() alone, then the intake of a Telegram document turn."""
    if runs <= 0:
        return
    data = pdf(pdf_pages(pages, 2000))
    print(f"== 2. A {pages}-page PDF ({len(data) / 1024:.0f} KB, ~2,000 characters a page): {runs} runs each ==")
    await extract(data, "report.pdf", "application/pdf")  # warm-up
    alone: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        doc = await extract(data, "report.pdf", "application/pdf")
        alone.append((time.perf_counter() - t0) * 1000)
    assert doc.total_pages == pages and not doc.cut
    print(f"    {'extract() alone (worker thread)':<44} {spread(sorted(alone))}")
    timings = Timings()
    turn_ms: list[float] = []
    with instrumented(rig.core, timings):
        for i in range(runs + 1):
            if i == 1:
                timings.clear()
                turn_ms.clear()
            update = rig.fake.document_update(data, file_name="report.pdf", mime_type="application/pdf",
                                              caption="what is the rent?", **message_fields(rig))  # fmt: skip
            turn_ms.append(await media_turn(rig, update))
            await asyncio.sleep(PAUSE_S)
    print(timings.line("intake", "whole intake: download, extract, store in PostgreSQL"))
    print(timings.line("download", "download: getFile + GET of the file"))
    print(f"    {'document turn, push → sendMessage':<44} {spread(sorted(turn_ms))}")
    print()


# ---------------------------------------------------------------- part 3: peak memory, one child per file


def big_csv(size: int) -> bytes:
    """A CSV of about `size` bytes."""
    rows = [f"{i},2026-11-{1 + i % 28:02d},{' '.join(WORDS[i % 7 : i % 7 + 6])},{i * 37 % 10007}.{i % 100:02d}\n"
            for i in range(2000)]  # fmt: skip
    block = ("id,date,description,amount\n" + "".join(rows)).encode()
    return (block * (size // len(block) + 1))[:size]


def big_pdf(size: int) -> bytes:
    """A text PDF of about `size` bytes (uncompressed content streams, ~40 KB of text a page)."""
    page = 40_000
    return pdf(pdf_pages(max(1, size // (page + 200)), page))


def big_jpeg(size: int) -> bytes:
    """A JPEG of noise (JPEG's worst case) within MEDIA_IMAGE_MAX_PIXELS, as close under `size` as quality allows."""
    side = int(MEDIA_IMAGE_MAX_PIXELS**0.5) - 8
    img = Image.frombytes("RGB", (side, side), os.urandom(side * side * 3))
    best = b""
    for quality in range(100, 50, -1):
        out = io.BytesIO()
        img.save(out, "JPEG", quality=quality, subsampling=0)  # 4:4:4, as cameras at their best
        best = out.getvalue()
        if len(best) <= size:
            break
    return best


def big_png(size: int) -> bytes:
    """A PNG of dim noise (PNG cannot be decoded scaled down, unlike JPEG) within MEDIA_IMAGE_MAX_PIXELS, about `size`
    bytes or fewer pixels."""
    side = int(MEDIA_IMAGE_MAX_PIXELS**0.5) - 8
    dim = bytes(i & 0x03 for i in range(256))  # 4 levels a channel: ~1.3 bytes a pixel once compressed
    while True:
        noise = Image.frombytes("RGB", (side, side), os.urandom(side * side * 3).translate(dim))
        out = io.BytesIO()
        noise.save(out, "PNG", compress_level=1)
        if out.tell() <= min(size * 1.05, MEDIA_IMAGE_MAX_INPUT_BYTES) or side < 500:
            return out.getvalue()
        side = int(side * 0.97)


def rss_kb(field: str) -> int | None:
    """A field of /proc/self/status in kB (VmRSS, VmHWM), None without /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Make VmHWM the current RSS (Linux >= 4.0); False when it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def child(kind: str, path: str) -> None:
    """Child process: warm the readers up, note idle RSS, then read `path` and process it; one JSON line."""
    loop = asyncio.new_event_loop()
    small = io.BytesIO()
    Image.new("RGB", (64, 64)).save(small, "JPEG")
    loop.run_until_complete(extract(pdf(["warm"]), "w.pdf", None))  # imports, worker thread, lazy plugins
    loop.run_until_complete(extract(b"a,b\n1,2\n", "w.csv", "text/csv"))
    loop.run_until_complete(prepare(small.getvalue()))
    gc.collect()
    idle = rss_kb("VmRSS")
    reset = reset_peak()
    if idle is None or not reset:  # ru_maxrss cannot be reset: the peak since the start, warm-up included
        idle = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    data = Path(path).read_bytes()
    t0 = time.perf_counter()
    if kind in ("jpeg", "png"):
        done = loop.run_until_complete(prepare(data))
        what = f"{done.original_width}×{done.original_height} → {done.width}×{done.height}, {len(done.data)} bytes"
    else:
        doc = loop.run_until_complete(extract(data, f"big.{kind}", None))
        what = f"{len(doc.pages)} of {doc.total_pages} pages read, {sum(map(len, doc.pages))} characters"
    ms = (time.perf_counter() - t0) * 1000
    peak = rss_kb("VmHWM") if reset else None
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"idle_kb": idle, "peak_kb": peak, "ms": ms, "what": what, "reset": reset}))


def part_memory(size: int) -> bool:
    """Each big file in a child process of its own; True when each stays within the goal."""
    print(f"== 3. Peak RSS above idle for a ~{size / MB:g} MB file, each in a child process of its own ==")
    makers: list[tuple[str, str, Callable[[int], bytes]]] = [
        ("csv", "CSV (text) through extract()", big_csv),
        ("pdf", "text PDF through extract()", big_pdf),
        ("jpeg", "noise JPEG through prepare()", big_jpeg),
        ("png", "dim noise PNG through prepare()", big_png),
    ]
    caps = {"csv": MEDIA_DOC_MAX_BYTES, "pdf": MEDIA_DOC_MAX_BYTES, "jpeg": MEDIA_IMAGE_MAX_INPUT_BYTES}
    caps["png"] = caps["jpeg"]
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-media-") as tmp:
        for kind, label, make in makers:
            data = make(min(size, caps[kind]))
            path = Path(tmp) / f"big.{kind}"
            path.write_bytes(data)
            del data
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.getenv("PYTHONPATH")]))}
            cmd = [sys.executable, "-m", "bench.media", "--child", kind, str(path)]
            done = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"    {label}: the child failed:\n{(done.stdout + done.stderr)[-2000:]}")
                ok = False
                continue
            got = json.loads(done.stdout.strip().splitlines()[-1])
            above = (got["peak_kb"] - got["idle_kb"]) / 1024
            ok = ok and above <= GOAL_PEAK_MB
            print(f"    {label}: {path.stat().st_size / MB:.1f} MB, {got['ms']:.0f} ms ({got['what']})")
            how = "" if got["reset"] else "  (peak since the start: /proc/self/clear_refs unavailable)"
            print(f"      idle {got['idle_kb'] / 1024:.0f} MiB, peak {got['peak_kb'] / 1024:.0f} MiB{how}")
            print(f"      {goal_line('peak above idle', above, GOAL_PEAK_MB, 'MiB')}")
    print()
    return ok


# ---------------------------------------------------------------- the run


async def bench(args: argparse.Namespace) -> int:
    """Parts 1 and 2 on one running bot, then part 3; 1 when a goal is missed."""
    async with bench_database() as db:
        print("TelegramAdapter + Core against the fake Bot API; the fake model (own process) answers 'ok' at once")
        print()
        async with FakeLLMProcess(0.0) as llm, make_rig(db, llm, 1) as rig:
            await part_voice(rig, args.voice_turns, args.warmup, args.voice_kb)
            await part_photo(rig, args.photo_turns, args.warmup)
            await part_pdf(rig, args.pdf_runs, args.pdf_pages)
    return 0 if part_memory(args.big_mb * MB) else 1


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; the exit status is 1 when a goal is missed."""
    if (argv if argv is not None else sys.argv[1:])[:1] == ["--child"]:
        _, kind, path = argv if argv is not None else sys.argv[1:]
        child(kind, path)
        return 0
    p = parser("media", __doc__)
    p.add_argument("--voice-turns", type=int, default=50, help="measured voice (and text) turns (50)")
    p.add_argument("--photo-turns", type=int, default=20, help="measured photo (and text) turns (20)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up turns of each (5)")
    p.add_argument("--voice-kb", type=int, default=300, help="size of the voice note (300 KB)")
    p.add_argument("--pdf-runs", type=int, default=20, help="runs of part 2 (20)")
    p.add_argument("--pdf-pages", type=int, default=50, help="pages of the PDF (50)")
    p.add_argument("--big-mb", type=int, default=TARGET_BYTES // MB, help="size of part 3's files (20 MB)")
    args = parse(p, argv, {"voice_turns": 10, "warmup": 2, "pdf_runs": 5})
    quiet_logging()
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
