"""Judge calibration over REST (spec 16, DESIGN §5.6): validation, the record, the 202
answer while judging, and the metrics the ``calibration`` actor stores, judged by a
loopback :class:`FakeOpenAI` through the runs' own judge module.  The 200 answer, with a
real worker judging while the request waits, is in ``tests/e2e/test_worker.py``."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from shared.calibration.judging import judge_examples
from shared.settings import Settings
from tests.support.calibration import EXAMPLES
from tests.support.factories import Tenant, single_validation_entry, tenant
from tests.support.fakes import FakeAgent, FakeOpenAI, verdict_from_marker
from tests.support.scenario_setup import (
    create_judge_provider,
    create_scenario,
    criterion,
    outbound_setup,
    turn,
)


@pytest.fixture
def judge() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(reply=verdict_from_marker) as fake:
        yield fake


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent() as fake:
        yield fake


def calibrate_path(t: Tenant, agent_id: str | None) -> str:
    query = f"?agent_id={agent_id}" if agent_id else ""
    return f"/v1/orgs/{t.id}/scenarios/calibrate{query}"


async def test_a_calibration_is_recorded_judged_and_measured(
    client: AsyncTestClient,
    impatient: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url, judge.url)
    response = await impatient.post(
        calibrate_path(t, setup.agent_id), json={"examples": EXAMPLES}, headers=t.owner.headers
    )
    assert response.status_code == 202, response.text
    pending = response.json()
    assert set(pending) == {"id", "status"}
    one = f"/v1/orgs/{t.id}/scenarios/calibrations/{pending['id']}"
    before = (await client.get(one, headers=t.owner.headers)).json()
    assert before["status"] == "queued" and "results" not in before

    await judge_examples(app.state.database, settings, UUID(pending["id"]))
    body = (await client.get(one, headers=t.owner.headers)).json()
    assert body["status"] == "completed", body
    counts = {
        k: body[k]
        for k in (
            "total",
            "agreements",
            "true_positives",
            "true_negatives",
            "false_positives",
            "false_negatives",
            "undecided",
        )
    }
    assert counts == {
        "total": 6,
        "agreements": 3,
        "true_positives": 2,
        "true_negatives": 1,
        "false_positives": 1,
        "false_negatives": 1,
        "undecided": 1,
    }
    assert body["agreement_rate"] == pytest.approx(3 / 5)  # of the 5 decided
    assert body["tpr"] == pytest.approx(2 / 3) and body["tnr"] == pytest.approx(1 / 2)
    assert body["kappa"] == pytest.approx((0.6 - 0.52) / 0.48)
    low, high = body["agreement_rate_interval"]["low"], body["agreement_rate_interval"]["high"]
    assert low < 0.6 < high
    results = {r["example_id"]: r for r in body["results"]}
    assert set(results) == {f"ex-{n}" for n in range(1, 7)}
    assert results["ex-3"] == {
        "example_id": "ex-3",
        "criterion": EXAMPLES[2]["criterion_question"],
        "human_verdict": "PASS",
        "judge_verdict": "FAIL",
        "agrees": False,
        "judge_critique": "judged FAIL",
    }
    assert results["ex-6"]["judge_verdict"] is None and results["ex-6"]["agrees"] is False
    assert results["ex-6"]["judge_critique"].startswith("undecided")
    billing = body["by_tag"]["billing"]
    assert (billing["total"], billing["true_positives"], billing["false_positives"]) == (3, 2, 1)
    assert body["by_tag"]["refunds"]["agreements"] == 1

    await judge_examples(app.state.database, settings, UUID(pending["id"]))  # redelivered
    again = (await client.get(one, headers=t.owner.headers)).json()
    assert again == body
    listed = (
        await client.get(f"/v1/orgs/{t.id}/scenarios/calibrations", headers=t.owner.headers)
    ).json()
    assert listed["total"] == 1 and listed["calibrations"][0]["agreements"] == 3
    assert "results" not in listed["calibrations"][0]


async def test_bad_calibration_requests_answer_422_or_404(
    client: AsyncTestClient, agent: FakeAgent, judge: FakeOpenAI
) -> None:
    t, other = await tenant(client), await tenant(client)
    setup = await outbound_setup(client, t, agent.url, judge.url)
    theirs = await outbound_setup(client, other, agent.url, judge.url)
    h = t.owner.headers
    missing = await client.post(calibrate_path(t, None), json={"examples": EXAMPLES}, headers=h)
    assert single_validation_entry(missing)["loc"] == ["query", "agent_id"]
    empty = await client.post(calibrate_path(t, setup.agent_id), json={"examples": []}, headers=h)
    assert single_validation_entry(empty)["loc"] == ["body", "examples"]
    twice = [EXAMPLES[0], {**EXAMPLES[1], "id": "ex-1"}]
    dup = await client.post(calibrate_path(t, setup.agent_id), json={"examples": twice}, headers=h)
    assert single_validation_entry(dup)["loc"] == ["body", "examples", "1", "id"]
    many = [{**EXAMPLES[0], "id": f"e{i}"} for i in range(1001)]
    over = await client.post(calibrate_path(t, setup.agent_id), json={"examples": many}, headers=h)
    assert single_validation_entry(over)["loc"] == ["body", "examples"]
    bad = [{**EXAMPLES[0], "human_verdict": "MAYBE"}]
    verdict = await client.post(
        calibrate_path(t, setup.agent_id), json={"examples": bad}, headers=h
    )
    assert single_validation_entry(verdict)["loc"] == ["body", "examples", "0", "human_verdict"]
    foreign = await client.post(
        calibrate_path(t, theirs.agent_id), json={"examples": EXAMPLES}, headers=h
    )
    assert foreign.status_code == 404
    listed = await client.get(f"/v1/orgs/{t.id}/scenarios/calibrations", headers=h)
    assert listed.json()["total"] == 0  # nothing recorded
    viewer_t = await tenant(client, with_roles=("VIEWER",))
    response = await client.post(
        calibrate_path(viewer_t, setup.agent_id),
        json={"examples": EXAMPLES},
        headers=viewer_t.members["VIEWER"].headers,
    )
    assert response.status_code == 403


async def test_an_agent_without_a_judge_answers_409_and_others_calibrations_404(
    client: AsyncTestClient, impatient: AsyncTestClient, agent: FakeAgent, judge: FakeOpenAI
) -> None:
    t, other = await tenant(client), await tenant(client)
    no_judge = await outbound_setup(client, t, agent.url)
    response = await client.post(
        calibrate_path(t, no_judge.agent_id), json={"examples": EXAMPLES}, headers=t.owner.headers
    )
    assert response.status_code == 409 and "judge" in response.json()["detail"]
    theirs = await outbound_setup(client, other, agent.url, judge.url)
    made = await impatient.post(
        calibrate_path(other, theirs.agent_id),
        json={"examples": EXAMPLES},
        headers=other.owner.headers,
    )
    response = await client.get(
        f"/v1/orgs/{t.id}/scenarios/calibrations/{made.json()['id']}", headers=t.owner.headers
    )
    assert response.status_code == 404


async def test_examples_naming_a_criterion_use_it_and_its_calibration_goes_stale(
    client: AsyncTestClient,
    impatient: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    t, other = await tenant(client), await tenant(client)
    setup = await outbound_setup(client, t, agent.url, judge.url)
    question = "Is the answer polite? [judge:PASS]"
    few_shot = [{"response": "Get lost.", "verdict": "FAIL", "critique": "rude"}]
    turns = [turn("Hello", criterion(question, few_shot_examples=few_shot))]
    scenario = await create_scenario(client, t, turns=turns)
    criteria_id = scenario["turns"][0]["criteria"][0]["id"]
    named = [
        {
            **{k: v for k, v in EXAMPLES[0].items() if k != "criterion_question"},
            "criteria_id": criteria_id,
        },
        {
            **{k: v for k, v in EXAMPLES[2].items() if k != "criterion_question"},
            "criteria_id": criteria_id,
        },
        EXAMPLES[3],  # a free question beside them
    ]
    response = await impatient.post(
        calibrate_path(t, setup.agent_id), json={"examples": named}, headers=t.owner.headers
    )
    assert response.status_code == 202, response.text
    calibration_id = response.json()["id"]
    await judge_examples(app.state.database, settings, UUID(calibration_id))
    one = f"/v1/orgs/{t.id}/scenarios/calibrations/{calibration_id}"
    body = (await client.get(one, headers=t.owner.headers)).json()
    # Judged with the criterion's own question (PASS marker) and its few-shot examples.
    prompts = ["\n".join(str(m["content"]) for m in r.json["messages"]) for r in judge.requests]
    assert sum("Get lost." in p for p in prompts) == 2
    assert [r["judge_verdict"] for r in body["results"]] == ["PASS", "PASS", "FAIL"]
    assert body["results"][0]["criterion"] == question
    (entry,) = body["criteria"]
    assert entry["criteria_id"] == criteria_id
    assert (entry["stale"], entry["reason"]) == (False, None)

    # Another judge model: stale; back to the same: fresh again.
    agent_url = f"/v1/orgs/{t.id}/agents/{setup.agent_id}"
    await client.patch(agent_url, json={"judge_model": "stricter-judge"}, headers=t.owner.headers)
    stale = (await client.get(one, headers=t.owner.headers)).json()["criteria"][0]
    assert stale["stale"] is True and "judge" in stale["reason"]
    await client.patch(agent_url, json={"judge_model": None}, headers=t.owner.headers)
    assert (await client.get(one, headers=t.owner.headers)).json()["criteria"][0]["stale"] is False
    # The agent naming a judge of its own: the default judge named is the same judge (the
    # read's rule in SQL and the recording's in Python agree); another provider is not.
    other_judge = await create_judge_provider(
        client, t, judge.url, name="other judge", is_default_judge=False
    )
    for own, stale in ((setup.judge_provider_id, False), (other_judge["id"], True), (None, False)):
        named = await client.patch(
            agent_url, json={"judge_provider_id": own}, headers=t.owner.headers
        )
        assert named.status_code == 200, named.text
        entry = (await client.get(one, headers=t.owner.headers)).json()["criteria"][0]
        assert entry["stale"] is stale, (own, entry)
        listed = (
            await client.get(f"/v1/orgs/{t.id}/scenarios/calibrations", headers=t.owner.headers)
        ).json()
        assert listed["calibrations"][0]["criteria"] == [entry]
    # The scenario's turns replaced: the criterion is gone.
    replaced = await client.put(
        f"/v1/orgs/{t.id}/scenarios/{scenario['id']}",
        json={"turns": [turn("Hello", criterion("Is it kind?"))]},
        headers=t.owner.headers,
    )
    assert replaced.status_code == 200, replaced.text
    gone = (await client.get(one, headers=t.owner.headers)).json()["criteria"][0]
    assert gone["stale"] is True and "no longer exists" in gone["reason"]

    # Both or neither of criterion_question and criteria_id: 422; another tenant's: 404.
    h = t.owner.headers
    both = [{**EXAMPLES[0], "criteria_id": criteria_id}]
    response = await client.post(
        calibrate_path(t, setup.agent_id), json={"examples": both}, headers=h
    )
    assert single_validation_entry(response)["loc"] == [
        "body",
        "examples",
        "0",
        "criterion_question",
    ]
    neither = [{k: v for k, v in EXAMPLES[0].items() if k != "criterion_question"}]
    response = await client.post(
        calibrate_path(t, setup.agent_id), json={"examples": neither}, headers=h
    )
    assert single_validation_entry(response)["loc"] == [
        "body",
        "examples",
        "0",
        "criterion_question",
    ]
    theirs = await create_scenario(client, other)
    foreign = [
        {
            **{k: v for k, v in EXAMPLES[0].items() if k != "criterion_question"},
            "criteria_id": theirs["turns"][0]["criteria"][0]["id"],
        }
    ]
    response = await client.post(
        calibrate_path(t, setup.agent_id), json={"examples": foreign}, headers=h
    )
    assert response.status_code == 404


async def test_a_calibration_is_listed_as_it_reads_and_judged_stale_by_its_own_organization(
    client: AsyncTestClient,
    impatient: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    # Both organizations' agents use their default judge; the first's is the older one, and
    # no calibration of the second may be measured against it.
    first, t = await tenant(client), await tenant(client)
    for org in (first, t):
        setup = await outbound_setup(client, org, agent.url, judge.url)
        scenario = await create_scenario(
            client, org, turns=[turn("Hello", criterion("Is it polite? [judge:PASS]"))]
        )
        named = {
            **{k: v for k, v in EXAMPLES[0].items() if k != "criterion_question"},
            "criteria_id": scenario["turns"][0]["criteria"][0]["id"],
        }
        response = await impatient.post(
            calibrate_path(org, setup.agent_id),
            json={"examples": [named, EXAMPLES[1]]},
            headers=org.owner.headers,
        )
        assert response.status_code == 202, response.text
        calibration_id = response.json()["id"]
        await judge_examples(app.state.database, settings, UUID(calibration_id))

    calibrations = f"/v1/orgs/{t.id}/scenarios/calibrations"
    body = (await client.get(f"{calibrations}/{calibration_id}", headers=t.owner.headers)).json()
    assert body["status"] == "completed" and body["total"] == 2
    (entry,) = body["criteria"]
    assert (entry["stale"], entry["reason"]) == (False, None)
    listed = (await client.get(calibrations, headers=t.owner.headers)).json()
    assert listed["total"] == 1
    assert listed["calibrations"] == [
        {k: v for k, v in body.items() if k not in ("results", "by_tag")}
    ]
