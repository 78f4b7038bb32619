"""Batch-run endpoints: create, read (spec 15), list, cancel, replay, and live progress (SSE)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated
from uuid import UUID

import msgspec
from litestar import Controller, get, post
from litestar.datastructures import State
from litestar.openapi import ResponseSpec
from litestar.params import JSONBody, QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage
from litestar.status_codes import HTTP_200_OK

from api.deps import Access, DbReads, DbSession, Page, PathId, reading
from shared.batches import detail, replays, schemas, services
from shared.identity.access import OrgAccess, requires
from shared.outbound.limits import Destination

EVENT_POLL_S = 0.5
EVENTS = (
    "Server-Sent Events: for each, an `event: <name>` line, a `data: <JSON object>` line "
    "and a blank line.  `progress`: the batch (a `BatchRunRead` without `runs` and "
    "`judge_trust`, with `rate_limited`), at once and then on every change of a counter, "
    "of the status or of `rate_limited`.  "
    "`run`: a run that ended (a `BatchRunItemSummary`: scenario, status, passed and total "
    "turns), once per run.  `end`: the batch once it is over and every run is counted (the "
    "last `progress` again); the stream then closes."
)


class BatchRunController(Controller):
    path = "/orgs/{org_id:str}/scenarios/batch-runs"
    tags = ["batch runs"]

    @post("/", operation_id="createBatchRun", access=requires("scenarios:run"))
    async def create_batch(
        self,
        db_session: DbSession,
        state: State,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.BatchRunCreate],
    ) -> schemas.BatchRunRead:
        """Run many scenarios (by id and/or tag) against one agent: 201, status `queued`.
        Each scenario runs `repetitions` times (1-20, default 1), each run its own
        conversation; `max_concurrency` bounds all of the batch's runs, and the counters
        (`total_scenarios`, `completed_scenarios`, `passed_scenarios`, `failed_scenarios`,
        `error_scenarios`) count runs: scenarios x repetitions.  `baseline_batch_id` names a
        batch of the same organization (else 404) and agent (else 422) to compare this one
        with: once it has completed and the baseline is over, the comparison is stored on
        it (`comparison` in its detail).  `judge_repetitions` (1-5, default 1) has the judge
        decide each `llm_evaluated` criterion that many times on the same conversation: the
        verdict is the majority (a tie is FAIL), each such criterion result carries its
        `votes`, and every vote counts in the cost."""
        batch = await services.create_batch(
            db_session, access=access, body=data, broker=state.broker
        )
        return services.batch_read(batch)

    @get("/", operation_id="listBatchRuns", access=requires("scenarios:read"))
    async def list_batches(
        self,
        db_reads: DbReads,
        access: Access,
        org_id: PathId,
        paging: Page,
        status: Annotated[schemas.BatchStatus | None, QueryParameter()] = None,
        agent_id: Annotated[
            UUID | None, QueryParameter(description="Only the batches of this agent.")
        ] = None,
    ) -> schemas.BatchRunList:
        """The organization's batch runs, paged, oldest first; `status` keeps those in that
        state, `agent_id` those of that agent."""
        rows, total = await reading(
            db_reads,
            services.list_batches,
            access=access,
            paging=paging,
            status=status,
            agent_id=agent_id,
        )
        return schemas.BatchRunList(batch_runs=[services.batch_read(b) for b in rows], total=total)

    @get("/compare", operation_id="compareBatchRuns", access=requires("scenarios:read"))
    async def compare_batches(
        self,
        db_reads: DbReads,
        access: Access,
        org_id: PathId,
        a: Annotated[UUID, QueryParameter(description="Batch A (before).")],
        b: Annotated[UUID, QueryParameter(description="Batch B (after).")],
    ) -> schemas.BatchComparison:
        """Two batch runs side by side, scenario by scenario (matched by scenario id):
        `regressed` (a lower pass rate in B than in A: passed, then failed, with one run
        each) first, then `fixed`, `changed`, `edited`, `only_in_a`, `only_in_b` and
        `unchanged`; `regressions` and `fixes` count them.  A trial is a run that passed or
        failed (an `error` run is none).  Each scenario with trials in both and not edited
        has `p_value`, the one-sided Fisher exact test that B's pass proportion is lower
        than A's, and `significant` (p < 0.05; `significant_regressions` counts them);
        `pass_rate_difference` is the mean of those scenarios' pass-rate differences, B - A,
        with its 95 % paired bootstrap interval (scenarios resampled with replacement,
        2,000 resamples, seed 0)."""
        return await reading(db_reads, services.compare_batches, access=access, a_id=a, b_id=b)

    @get("/{batch_run_id:str}", operation_id="getBatchRun", access=requires("scenarios:read"))
    async def get_batch(
        self,
        db_reads: DbReads,
        state: State,
        access: Access,
        org_id: PathId,
        batch_run_id: PathId,
    ) -> schemas.BatchRunRead:
        """The batch with its counters (of runs), a summary of every run and, once it is
        over, its judge trust: each LLM-judged criterion's pass rate with the judge's
        measured error taken out (`computing` at first: the `calibration` queue works it
        out).  While it runs, `rate_limited` names the destination (host, and `agent` or
        `judge`) whose rate limit holds its calls back now, and since when; else null.
        `scenarios` gives each scenario's `trials` (its runs that passed or failed; an
        `error` run is no trial), `passes` and `errors` so far, and `flaky` (0 < passes <
        trials); `pass_hat_k` is pass^j for j = 1..repetitions (index j - 1: the mean over
        the scenarios with at least j trials of C(passes, j) / C(trials, j), null where
        none has j), `pass_at_k` the share of scenarios with a trial that passed at least
        once, `flaky_scenarios` how many are flaky.  With a baseline, `comparison` is its
        comparison (as `compareBatchRuns` gives it, listing the scenarios that did not stay
        unchanged), stored once the batch has completed and the baseline is over; null
        until then.  `judge_flip_rate` is the share of the criterion results the judge
        decided whose votes were not unanimous (null with `judge_repetitions` 1);
        `replays` the batches replaying this one."""
        return await detail.batch_detail(
            db_reads,
            state.database,
            access=access,
            batch_id=batch_run_id,
            broker=state.broker,
            limiter=state.limiter,
        )

    @post(
        "/{batch_run_id:str}/cancel",
        operation_id="cancelBatchRun",
        access=requires("scenarios:run"),
        status_code=HTTP_200_OK,
    )
    async def cancel_batch(
        self, db_session: DbSession, access: Access, org_id: PathId, batch_run_id: PathId
    ) -> schemas.BatchRunRead:
        """Stop the batch: runs not yet started end as cancelled errors; status `error`."""
        batch = await services.cancel_batch(db_session, access=access, batch_id=batch_run_id)
        return services.batch_read(batch)

    @post(
        "/{batch_run_id:str}/replay",
        operation_id="replayBatchRun",
        access=requires("scenarios:run"),
    )
    async def replay_batch(
        self,
        db_session: DbSession,
        state: State,
        access: Access,
        org_id: PathId,
        batch_run_id: PathId,
        data: JSONBody[schemas.BatchReplayCreate | None] = None,
    ) -> schemas.BatchRunRead:
        """Re-judge a completed batch's stored conversations: 201 with a new batch
        (`replay_of` names the source; same agent, `max_concurrency` and `repetitions`),
        status `queued`, one run per run of the source.  Each run takes every turn's message
        and reply (and tool calls, and simulated turns) from its source run, as stored, and
        judges them with the scenario's criteria as they are now (per turn by position, and
        the conversation criteria) and the agent's current judge: the agent and the
        simulated user are not called; deterministic checks read the stored (redacted)
        reply.  `judge_repetitions` (1-5) defaults to the source's.  A run ends `error`
        ("scenario changed: ...") when its scenario's scripted turns changed in number or
        the scenario was deleted, and when its source run ended in error.  409 when the
        batch is not `completed`."""
        batch = await replays.replay_batch(
            db_session,
            access=access,
            batch_id=batch_run_id,
            body=data or schemas.BatchReplayCreate(),
            broker=state.broker,
        )
        return services.batch_read(batch)

    @get(
        "/{batch_run_id:str}/events",
        operation_id="streamBatchRunEvents",
        access=requires("scenarios:read"),
        responses={
            HTTP_200_OK: ResponseSpec(
                str,
                media_type="text/event-stream",
                description=EVENTS,
                generate_examples=False,
            )
        },
    )
    async def events(
        self,
        db_reads: DbReads,
        state: State,
        access: Access,
        org_id: PathId,
        batch_run_id: PathId,
    ) -> ServerSentEvent:
        """Server-Sent Events: `progress` (counters) on every change, `run` per finished run,
        and a final `end` once the batch is over and every one of its runs is counted."""
        # Where its runs call out, looked up once: the stream asks the limiter about them.
        destinations = await reading(
            db_reads, services.batch_destinations, access=access, batch_id=batch_run_id
        )
        return ServerSentEvent(_progress(state, access, batch_run_id, destinations))


async def _progress(
    state: State, access: OrgAccess, batch_id: UUID, destinations: list[Destination]
) -> AsyncIterator[ServerSentEventMessage]:
    seen: set[UUID] = set()
    since: datetime | None = None  # runs ended before this were all reported
    last: bytes | None = None
    while True:
        # Only what ended lately (a run commits within moments of its completed_at).  A
        # connection per look: the stream holds none while it sleeps.
        async with state.database.connection() as connection:
            now = await services.progress(
                connection,
                access=access,
                batch_id=batch_id,
                ended_since=since - services.RECENT if since is not None else None,
                limiter=state.limiter,
                destinations=destinations,
            )
        for run in now.ended:
            if run.id not in seen:
                seen.add(run.id)
                if run.completed_at is not None:
                    since = max(since, run.completed_at) if since else run.completed_at
                # The batch detail's run summary: scenario name, passed and total turns.
                yield ServerSentEventMessage(event="run", data=msgspec.json.encode(run).decode())
        progress = msgspec.json.encode(services.batch_read(now.batch, limited=now.rate_limited))
        if progress != last:
            last = progress
            yield ServerSentEventMessage(event="progress", data=progress.decode())
        if now.over:
            yield ServerSentEventMessage(event="end", data=progress.decode())
            return
        await asyncio.sleep(EVENT_POLL_S)


CONTROLLERS = [BatchRunController]
