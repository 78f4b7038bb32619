"""Knowledge: documents ingested per second, and search latency against plain SQL.

One ``spar serve`` and one ``spar worker`` (queue ``documents``) on a throwaway database
and a private ``redis-server``.  Documents of about 5 KB (10 sections of some 500
characters under their own headings, so 10 chunks each) are generated from a vocabulary
of 2,000 words and uploaded over REST, 8 at a time:

1. ``--first`` documents (default 100, 1,000 chunks), then search;
2. the rest up to ``--documents`` (default 1,000, 10,000 chunks), then search again.

Ingest rate: documents from the first upload until all are ``ready`` (polled every
50 ms).  Search: ``--queries`` (200) queries of 2 or 3 vocabulary words through
``POST …/knowledge/search``, one at a time, p50 and p99; baseline: the very same
statement the API runs (``shared.knowledge.services.ranked_chunks``) executed straight on
psycopg in this process, so the ratio is what the API adds around the query.

    python bench/knowledge.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import psycopg
from sqlalchemy.dialects import postgresql

from bench.stack import database_url, ok, percentiles, psycopg_dsn, spar_stack
from shared.knowledge.services import ranked_chunks

SECTIONS = 10
SECTION_WORDS = 70  # about 500 characters


def vocabulary(size: int, rng: random.Random) -> list[str]:
    consonants, vowels = "bcdfghklmnprstvz", "aeiou"
    words: set[str] = set()
    while len(words) < size:
        length = rng.randint(2, 4)
        words.add("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(length)))
    return sorted(words)


def document(n: int, words: list[str], rng: random.Random) -> str:
    parts = [f"# Document {n}\n"]
    for s in range(SECTIONS):
        body = " ".join(rng.choice(words) for _ in range(SECTION_WORDS))
        parts.append(f"## Section {s} {rng.choice(words)}\n\n{body}.\n")
    return "\n".join(parts)


async def ingest(base: str, headers: dict, org: str, cid: str, texts: list[str], dsn: str) -> float:
    """Upload ``texts`` 8 at a time; seconds from the first upload until every document is
    ready (polled every 50 ms)."""
    queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    for item in enumerate(texts):
        queue.put_nowait(item)
    started = time.perf_counter()

    async def uploader(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            n, content = queue.get_nowait()
            response = await http.post(
                f"/v1/orgs/{org}/knowledge/documents/structured",
                json={"collectionId": cid, "filename": f"doc-{n}.md", "content": content},
                headers=headers,
            )
            assert response.status_code == 201, response.text

    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        await asyncio.gather(*(uploader(http) for _ in range(8)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE processing_status IN ('queued', 'processing')),"
                " count(*) FILTER (WHERE processing_status = 'failed') FROM knowledge_documents"
            ).fetchone()
            assert row is not None
            if row[0] == 0:
                assert row[1] == 0, f"{row[1]} documents failed"
                return time.perf_counter() - started
            await asyncio.sleep(0.05)


def search_pass(base: str, headers: dict, org: str, queries: list[str], dsn: str) -> None:
    api: list[float] = []
    with httpx.Client(base_url=base, timeout=30) as http:
        for query in queries:
            began = time.perf_counter()
            response = http.post(
                f"/v1/orgs/{org}/knowledge/search",
                json={"query": query, "limit": 10},
                headers=headers,
            )
            api.append(time.perf_counter() - began)
            assert response.status_code == 200, response.text
    sql: list[float] = []
    with psycopg.connect(dsn) as conn:
        for query in queries:
            statement = ranked_chunks(uuid.UUID(org), query, ["english"], limit=10).compile(
                dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}
            )
            began = time.perf_counter()
            conn.execute(str(statement)).fetchall()
            sql.append(time.perf_counter() - began)
    a, q = percentiles(api), percentiles(sql)
    print(
        f"  search: API p50 {a['p50']:.1f} ms, p99 {a['p99']:.1f} ms; plain SQL p50 "
        f"{q['p50']:.1f} ms, p99 {q['p99']:.1f} ms; ratio p50 {a['p50'] / q['p50']:.1f}, "
        f"p99 {a['p99'] / q['p99']:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--first", type=int, default=100)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    rng = random.Random(7)
    words = vocabulary(2000, rng)
    texts = [document(n, words, rng) for n in range(args.documents)]
    queries = [" ".join(rng.sample(words, rng.choice((2, 3)))) for _ in range(args.queries)]
    url = database_url("knowledge")
    dsn = psycopg_dsn(url)
    worker = ["--processes", "1", "--threads", "8", "--queues", "documents"]
    with spar_stack(url, workers=1, worker_args=worker) as spar:
        base, org, headers = spar.base, spar.org_id, spar.headers
        cid = ok(
            spar.http.post(
                f"/v1/orgs/{org}/knowledge/collections", json={"name": "bench"}, headers=headers
            )
        )["id"]
        size = sum(len(t.encode()) for t in texts) / len(texts)
        print(
            f"knowledge benchmark: {args.documents} documents of {size / 1024:.1f} KB, "
            f"{SECTIONS} chunks each; 1 spar serve, 1 spar worker (8 threads); "
            f"{os.cpu_count()} CPUs"
        )
        for stage in (texts[: args.first], texts[args.first :]):
            seconds = asyncio.run(ingest(base, headers, org, cid, stage, dsn))
            with psycopg.connect(dsn) as conn:
                chunks = conn.execute("SELECT count(*) FROM knowledge_chunks").fetchone()
            print(
                f"ingested {len(stage)} documents in {seconds:.1f} s: "
                f"{len(stage) / seconds:.0f} documents/s; {chunks[0] if chunks else 0} chunks"
            )
            search_pass(base, headers, org, queries, dsn)


if __name__ == "__main__":
    main()
