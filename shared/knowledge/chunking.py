"""A document's text into heading-aware chunks (DESIGN §5.4).

Markdown is parsed with markdown-it-py (CommonMark) at block level only: the inline rules
(emphasis, links) are switched off, since the chunks keep each block's own markdown and
only the block structure and the headings matter.  That keeps a 5 MiB single-line
document to a fraction of a second.  Every top-level block is taken from the source lines
it spans, so lists, tables and code stay as written.

* A heading (ATX or setext) closes the section before it and opens one whose **heading
  path** is the chain of headings above it (``["Refunds", "Exceptions"]``).
* A section's blocks are packed into chunks of at most ``MAX_CHUNK_CHARS``; a longer
  block is cut at line breaks, then at spaces, then anywhere.
* A section with no body gives no chunk; its heading still heads its subsections.

Plain text has no headings: its paragraphs (blank-line separated) are packed the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from markdown_it import MarkdownIt

MAX_CHUNK_CHARS = 2000
MAX_CHUNKS = 20_000
MAX_LISTED_HEADINGS = 200

_MARKDOWN = MarkdownIt("commonmark").disable("inline")
_BLOCK_OPENERS = {"heading_open"}


class TooManyChunks(ValueError):
    """The document would split into more than ``MAX_CHUNKS`` chunks."""


@dataclass(frozen=True, slots=True)
class Chunk:
    position: int
    heading_path: tuple[str, ...]
    content: str


@dataclass(slots=True)
class Parsed:
    chunks: list[Chunk] = field(default_factory=list)
    headings: list[tuple[int, str]] = field(default_factory=list)  # (level, text)

    @property
    def first_heading(self) -> str | None:
        top = [text for level, text in self.headings if level == 1]
        return (top or [text for _, text in self.headings] or [None])[0]


def _pieces(text: str, limit: int) -> Iterator[str]:
    """``text`` in pieces of at most ``limit`` characters, cut at the last line break, else
    the last space, before the limit; anywhere if there is neither."""
    start, end = 0, len(text)
    while end - start > limit:
        stop = start + limit
        cut = text.rfind("\n", start + 1, stop)
        if cut < 0:
            cut = text.rfind(" ", start + 1, stop)
        if cut < 0:
            cut = stop
        piece = text[start:cut].strip()
        if piece:
            yield piece
        start = cut
    if text[start:].strip():
        yield text[start:].strip()


def _packed(blocks: list[str], limit: int) -> Iterator[str]:
    """Consecutive blocks joined by blank lines into chunks of at most ``limit``."""
    current: list[str] = []
    size = 0
    for block in blocks:
        for piece in _pieces(block, limit):
            if current and size + 2 + len(piece) > limit:
                yield "\n\n".join(current)
                current, size = [], 0
            current.append(piece)
            size += len(piece) + (2 if size else 0)
    if current:
        yield "\n\n".join(current)


class _Builder:
    def __init__(self) -> None:
        self.parsed = Parsed()
        self._path: list[tuple[int, str]] = []
        self._blocks: list[str] = []

    def heading(self, level: int, text: str) -> None:
        self.flush()
        while self._path and self._path[-1][0] >= level:
            self._path.pop()
        self._path.append((level, text))
        self.parsed.headings.append((level, text))

    def block(self, text: str) -> None:
        if text.strip():
            self._blocks.append(text.strip("\n"))

    def flush(self) -> None:
        path = tuple(text for _, text in self._path)
        for content in _packed(self._blocks, MAX_CHUNK_CHARS):
            if len(self.parsed.chunks) >= MAX_CHUNKS:
                raise TooManyChunks(
                    f"the document splits into more than {MAX_CHUNKS} chunks; "
                    "split it into several documents"
                )
            self.parsed.chunks.append(Chunk(len(self.parsed.chunks), path, content))
        self._blocks = []


def parse_markdown(content: str) -> Parsed:
    lines = content.split("\n")
    builder = _Builder()
    tokens = _MARKDOWN.parse(content)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.level != 0 or token.map is None:
            i += 1
            continue
        if token.type in _BLOCK_OPENERS:
            heading = " ".join(tokens[i + 1].content.split())  # the inline token after it
            builder.heading(int(token.tag[1:]), heading)
        else:
            start, end = token.map
            builder.block("\n".join(lines[start:end]))
        # Skip to the token after this block's close (nesting 0 again).
        depth = token.nesting
        i += 1
        while depth > 0 and i < len(tokens):
            depth += tokens[i].nesting
            i += 1
    builder.flush()
    return builder.parsed


def parse_text(content: str) -> Parsed:
    builder = _Builder()
    for paragraph in content.replace("\r\n", "\n").split("\n\n"):
        builder.block(paragraph)
    builder.flush()
    return builder.parsed


def parse(content: str, mime_type: str) -> Parsed:
    """The chunks and headings of ``content`` (``text/markdown`` or ``text/plain``)."""
    return parse_markdown(content) if mime_type == "text/markdown" else parse_text(content)
