"""Markdown and plain text into heading-aware chunks (shared/knowledge/chunking.py)."""

from __future__ import annotations

import pytest

from shared.knowledge.chunking import MAX_CHUNK_CHARS, TooManyChunks, parse


def test_headings_make_paths_and_blocks_keep_their_markdown() -> None:
    parsed = parse(
        "# Guide\n\nIntro.\n\n## Setup\n\n- one\n- two\n\n```sh\nmake\n```\n\n"
        "### Linux\n\nUse apt.\n\n## Usage\nRun it.\n\nSetext title\n============\n\nBody.\n",
        "text/markdown",
    )
    assert [(c.heading_path, c.content) for c in parsed.chunks] == [
        (("Guide",), "Intro."),
        (("Guide", "Setup"), "- one\n- two\n\n```sh\nmake\n```"),
        (("Guide", "Setup", "Linux"), "Use apt."),
        (("Guide", "Usage"), "Run it."),
        (("Setext title",), "Body."),
    ]
    assert [c.position for c in parsed.chunks] == list(range(5))
    assert parsed.headings[:3] == [(1, "Guide"), (2, "Setup"), (3, "Linux")]
    assert parsed.first_heading == "Guide"


def test_a_heading_level_skipped_back_pops_the_path() -> None:
    parsed = parse("## A\n\na\n\n#### B\n\nb\n\n### C\n\nc\n", "text/markdown")
    assert [c.heading_path for c in parsed.chunks] == [("A",), ("A", "B"), ("A", "C")]
    assert parsed.first_heading == "A"  # no level 1: the first heading


def test_long_sections_are_packed_and_cut_at_line_then_space_boundaries() -> None:
    paragraphs = "\n\n".join(f"paragraph {i} " + "word " * 100 for i in range(20))
    parsed = parse(f"# Long\n\n{paragraphs}", "text/markdown")
    assert len(parsed.chunks) > 1
    assert all(len(c.content) <= MAX_CHUNK_CHARS for c in parsed.chunks)
    assert all(c.content.startswith("paragraph") for c in parsed.chunks)  # whole paragraphs
    line = parse("x" * (MAX_CHUNK_CHARS * 2 + 5), "text/markdown")
    assert [len(c.content) for c in line.chunks] == [MAX_CHUNK_CHARS, MAX_CHUNK_CHARS, 5]
    spaced = parse(("word " * 1000).strip(), "text/markdown")
    assert all(c.content.endswith("word") for c in spaced.chunks)


def test_plain_text_packs_paragraphs_without_headings() -> None:
    parsed = parse("# not a heading\n\nsecond\r\n\r\nthird", "text/plain")
    assert [(c.heading_path, c.content) for c in parsed.chunks] == [
        ((), "# not a heading\n\nsecond\n\nthird")
    ]
    assert parsed.headings == []


def test_empty_sections_give_no_chunk_and_too_many_chunks_are_refused() -> None:
    assert parse("# Only\n## Headings\n", "text/markdown").chunks == []
    with pytest.raises(TooManyChunks, match="more than 20000 chunks"):
        parse("".join(f"# h{i}\nx\n" for i in range(20_001)), "text/markdown")
