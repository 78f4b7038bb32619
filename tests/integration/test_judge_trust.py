"""A batch's judge trust (DESIGN §5.6, issue 15 item 4): each LLM-judged criterion's raw pass
rate and, where a calibration measured the judge on it, the rate with the judge's measured
error taken out, its interval, and the stale and no-better-than-chance cases.

The batch is played in-process as the workers play it, judged by a loopback
:class:`FakeOpenAI` that passes exactly the replies carrying ``[judge:PASS]``; the fake
agent echoes the user message, so each scenario's message decides its verdict."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from dramatiq import Message
from dramatiq.common import iter_queue
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from shared.batches.window import dispatch_committed
from shared.calibration import trust
from shared.calibration.judging import judge_examples
from shared.db.base import utcnow
from shared.db.models import BatchRun
from shared.queue import JUDGE_TRUST
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.factories import Tenant, stub_broker, tenant
from tests.support.fakes import FakeAgent, FakeOpenAI, verdict_from_marker
from tests.support.scenario_setup import create_scenario, criterion, outbound_setup, turn

ANSWERED = "Did the agent answer the question about the order?"
POLITE = "Was the agent polite?"
COIN = "Did the agent follow the refund policy?"


@pytest.fixture
def judge() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(reply=verdict_from_marker) as fake:
        yield fake


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply=lambda body: f"Echo: {body['message']}") as fake:
        yield fake


def labelled(question: str, n: int, human: str, judge_passes: bool) -> dict[str, Any]:
    marker = " [judge:PASS]" if judge_passes else ""
    return {
        "id": f"{abs(hash(question))}-{human}-{n}",
        "user_message": f"question {n}",
        "agent_response": f"answer {n}{marker}",
        "criterion_question": question,
        "human_verdict": human,
    }


def examples(question: str, tp: int, fn: int, tn: int, fp: int) -> list[dict[str, Any]]:
    """Labelled examples the fake judge gets to exactly these confusion counts."""
    made = [labelled(question, i, "PASS", True) for i in range(tp)]
    made += [labelled(question, tp + i, "PASS", False) for i in range(fn)]
    made += [labelled(question, i, "FAIL", False) for i in range(tn)]
    made += [labelled(question, tn + i, "FAIL", True) for i in range(fp)]
    return made


async def calibrate(
    impatient: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    t: Tenant,
    agent_id: str,
    body: list[dict[str, Any]],
) -> str:
    response = await impatient.post(
        f"/v1/orgs/{t.id}/scenarios/calibrate?agent_id={agent_id}",
        json={"examples": body},
        headers=t.owner.headers,
    )
    assert response.status_code == 202, response.text  # no worker here: judged below
    calibration_id = response.json()["id"]
    await judge_examples(app.state.database, settings, UUID(calibration_id))
    return calibration_id


async def play_batch(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    t: Tenant,
    agent_id: str,
    tag: str,
    **body: Any,
) -> str:
    response = await client.post(
        f"/v1/orgs/{t.id}/scenarios/batch-runs",
        json={"agent_id": agent_id, "tags": [tag], "max_concurrency": 5, **body},
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    batch_id = response.json()["id"]
    database = app.state.database
    pending = deque(await dispatch_committed(database, UUID(batch_id)))
    while pending:
        pending.extend(await execute_run(database, settings, pending.popleft()) or [])
    return batch_id


def judge_trust_messages(broker: Any) -> list[str]:
    sent = []
    for data in iter_queue(broker.queues[JUDGE_TRUST[0]]):
        message = Message.decode(data)
        if message.actor_name == JUDGE_TRUST[1]:
            sent.append(message.args[0])
    return sent


@pytest.fixture
def broker(app: Litestar) -> Iterator[Any]:
    """The app's broker swapped for an in-memory one, to read back what it sends."""
    real, app.state.broker = app.state.broker, stub_broker()
    yield app.state.broker
    app.state.broker = real


async def test_a_batch_without_an_llm_judged_criterion_is_ready_at_once(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent, broker: Any
) -> None:
    """Nothing for the judge-trust actor to work out: the batch's detail says so once it is
    over (never ``computing``), and no message goes to the calibration queue."""
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    await create_scenario(
        client, t, tags=["smoke"], turns=[turn("hello", criterion("Echo", "contains"))]
    )
    batch_id = await play_batch(client, app, settings, t, setup.agent_id, "smoke")
    one = f"/v1/orgs/{t.id}/scenarios/batch-runs/{batch_id}"
    for _ in range(2):
        report = (await client.get(one, headers=t.owner.headers)).json()["judge_trust"]
        assert report["status"] == "ready" and report["computed_at"], report
        assert (report["criteria"], report["uncalibrated"]) == ([], [])
    assert judge_trust_messages(broker) == []


async def test_judge_trust_counts_the_verdicts_of_every_repetition(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    broker: Any,
) -> None:
    """Each run of a repeated scenario is judged on its own conversation: the criterion's
    raw pass rate counts every run's verdict, its scenarios each scenario once."""
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url, judge.url)
    for n, marker in enumerate((" [judge:PASS]", "")):
        await create_scenario(
            client, t, name=f"s{n}", tags=["k"], turns=[turn(f"hi {n}{marker}", criterion(POLITE))]
        )
    batch_id = await play_batch(client, app, settings, t, setup.agent_id, "k", repetitions=3)
    await trust.compute(app.state.database, UUID(batch_id))
    one = f"/v1/orgs/{t.id}/scenarios/batch-runs/{batch_id}"
    (polite,) = (await client.get(one, headers=t.owner.headers)).json()["judge_trust"][
        "uncalibrated"
    ]
    assert (polite["judged"], polite["passed"], polite["scenarios"]) == (6, 3, 2)
    assert polite["raw_pass_rate"] == pytest.approx(0.5)
    assert len(polite["criteria_ids"]) == 2


async def test_a_batch_reports_corrected_pass_rates_per_calibrated_criterion(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    broker: Any,
    db: AsyncSession,
    impatient: AsyncTestClient,
) -> None:
    t, other = await tenant(client), await tenant(client)
    setup = await outbound_setup(client, t, agent.url, judge.url)
    # 20 scenarios ask the same three judged questions and one free check; the judge
    # passes the 14 whose message carries the marker: raw pass rate 0.7 on each question.
    for n in range(20):
        marker = " [judge:PASS]" if n < 14 else ""
        criteria = [criterion(q) for q in (ANSWERED, POLITE, COIN)]
        criteria.append(criterion("Echo", "contains"))
        await create_scenario(
            client,
            t,
            name=f"order {n}",
            tags=["smoke"],
            turns=[turn(f"order {n}{marker}", *criteria)],
        )
    # The judge measured on ANSWERED: TPR 40/50 = 0.8, TNR 45/50 = 0.9; on COIN: chance.
    calibration_id = await calibrate(
        impatient,
        app,
        settings,
        t,
        setup.agent_id,
        examples(ANSWERED, tp=40, fn=10, tn=45, fp=5) + examples(COIN, tp=5, fn=5, tn=5, fp=5),
    )

    batch_id = await play_batch(client, app, settings, t, setup.agent_id, "smoke")
    one = f"/v1/orgs/{t.id}/scenarios/batch-runs/{batch_id}"
    first = (await client.get(one, headers=t.owner.headers)).json()
    assert first["status"] == "completed"
    assert first["judge_trust"] == {
        "status": "computing",
        "computed_at": None,
        "criteria": [],
        "uncalibrated": [],
    }
    await client.get(one, headers=t.owner.headers)  # asked once, however many readers
    assert judge_trust_messages(broker) == [batch_id]
    # A request whose message was lost is made again once it is REQUEST_STALL old.
    old = (utcnow() - trust.REQUEST_STALL - timedelta(seconds=1)).isoformat()
    await db.execute(
        update(BatchRun)
        .where(BatchRun.id == UUID(batch_id))
        .values(judge_trust={"status": "computing", "requested_at": old})
    )
    await db.commit()
    await client.get(one, headers=t.owner.headers)
    assert judge_trust_messages(broker) == [batch_id]
    listed = await client.get(f"/v1/orgs/{t.id}/scenarios/batch-runs", headers=t.owner.headers)
    assert "judge_trust" not in listed.json()["batch_runs"][0]
    foreign = await client.get(
        f"/v1/orgs/{other.id}/scenarios/batch-runs/{batch_id}", headers=other.owner.headers
    )
    assert foreign.status_code == 404

    await trust.compute(app.state.database, UUID(batch_id))
    report = (await client.get(one, headers=t.owner.headers)).json()["judge_trust"]
    assert report["status"] == "ready" and report["computed_at"]
    answered, coin = report["criteria"]
    assert (answered["question"], coin["question"]) == (ANSWERED, COIN)
    assert (answered["judged"], answered["passed"], answered["scenarios"]) == (20, 14, 20)
    assert len(answered["criteria_ids"]) == 20
    assert answered["raw_pass_rate"] == pytest.approx(0.7)
    assert (answered["tpr"], answered["tnr"]) == (pytest.approx(0.8), pytest.approx(0.9))
    assert answered["calibration_id"] == calibration_id
    assert answered["calibration_examples"] == 100
    # θ = (0.7 + 0.9 - 1) / (0.8 + 0.9 - 1) = 0.857…, inside its interval; 20 items and 100
    # examples leave that interval wide, but not the whole of [0, 1].
    assert answered["corrected_pass_rate"] == pytest.approx(0.6 / 0.7, abs=1e-6)
    low, high = answered["interval"]["low"], answered["interval"]["high"]
    assert low < answered["corrected_pass_rate"] <= high
    assert low > 0.4 and high - low < 0.6
    assert (answered["stale"], answered["message"]) == (False, None)
    # TPR + TNR = 1: no number, a message.
    assert (coin["tpr"], coin["tnr"]) == (0.5, 0.5)
    assert coin["corrected_pass_rate"] is None and coin["interval"] is None
    assert "no better than chance" in coin["message"]
    # POLITE: never calibrated; the "contains" check is not the judge's.
    (polite,) = report["uncalibrated"]
    assert (polite["question"], polite["judged"], polite["passed"]) == (POLITE, 20, 14)
    assert set(polite) == {
        "question",
        "conversation",
        "criteria_ids",
        "scenarios",
        "judged",
        "passed",
        "raw_pass_rate",
    }
    # Recomputing (a redelivery) gives the same seeded interval.
    await trust.compute(app.state.database, UUID(batch_id))
    again = (await client.get(one, headers=t.owner.headers)).json()["judge_trust"]
    assert again["criteria"] == report["criteria"]
    assert judge_trust_messages(broker) == []  # ready: never asked again

    # Another judge model since the calibration: the numbers stand, flagged stale.
    agent_url = f"/v1/orgs/{t.id}/agents/{setup.agent_id}"
    patched = await client.patch(
        agent_url, json={"judge_model": "stricter-judge"}, headers=t.owner.headers
    )
    assert patched.status_code == 200, patched.text
    await trust.compute(app.state.database, UUID(batch_id))
    stale = (await client.get(one, headers=t.owner.headers)).json()["judge_trust"]["criteria"][0]
    assert stale["stale"] is True and "judge" in stale["stale_reason"]
    assert stale["corrected_pass_rate"] == answered["corrected_pass_rate"]


async def test_a_criterion_edited_since_its_calibration_is_flagged_stale(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    broker: Any,
    impatient: AsyncTestClient,
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url, judge.url)
    scenario = await create_scenario(
        client,
        t,
        name="refund",
        tags=["edit"],
        turns=[turn("refund [judge:PASS]", criterion(POLITE))],
    )
    criteria_id = scenario["turns"][0]["criteria"][0]["id"]
    named = [
        {**{k: v for k, v in e.items() if k != "criterion_question"}, "criteria_id": criteria_id}
        for e in examples(POLITE, tp=9, fn=1, tn=9, fp=1)
    ]
    calibration_id = await calibrate(impatient, app, settings, t, setup.agent_id, named)
    # A batch of the criterion as calibrated: fresh.
    fresh_batch = await play_batch(client, app, settings, t, setup.agent_id, "edit")
    await trust.compute(app.state.database, UUID(fresh_batch))
    path = f"/v1/orgs/{t.id}/scenarios/batch-runs"
    fresh = (await client.get(f"{path}/{fresh_batch}", headers=t.owner.headers)).json()
    (entry,) = fresh["judge_trust"]["criteria"]
    assert (entry["calibration_id"], entry["stale"]) == (calibration_id, False)

    # The question reworded: a new criterion id at the same place, its calibration stale.
    edited = await client.put(
        f"/v1/orgs/{t.id}/scenarios/{scenario['id']}",
        json={"turns": [turn("refund [judge:PASS]", criterion("Was the agent courteous?"))]},
        headers=t.owner.headers,
    )
    assert edited.status_code == 200, edited.text
    later_batch = await play_batch(client, app, settings, t, setup.agent_id, "edit")
    await trust.compute(app.state.database, UUID(later_batch))
    later = (await client.get(f"{path}/{later_batch}", headers=t.owner.headers)).json()
    (entry,) = later["judge_trust"]["criteria"]
    assert entry["question"] == "Was the agent courteous?"
    assert entry["calibration_id"] == calibration_id
    assert entry["stale"] is True and "changed" in entry["stale_reason"]
    assert later["judge_trust"]["uncalibrated"] == []


async def test_a_running_batch_has_no_judge_trust_yet(
    client: AsyncTestClient, app: Litestar, agent: FakeAgent, judge: FakeOpenAI, broker: Any
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url, judge.url)
    await create_scenario(client, t, tags=["wait"], turns=[turn("hi", criterion(POLITE))])
    made = await client.post(
        f"/v1/orgs/{t.id}/scenarios/batch-runs",
        json={"agent_id": setup.agent_id, "tags": ["wait"]},
        headers=t.owner.headers,
    )
    detail = (
        await client.get(
            f"/v1/orgs/{t.id}/scenarios/batch-runs/{made.json()['id']}", headers=t.owner.headers
        )
    ).json()
    assert detail["status"] == "queued" and detail["judge_trust"] is None
    assert judge_trust_messages(broker) == []
