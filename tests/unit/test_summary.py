"""The Markdown that ``spar batch run --summary FILE`` writes for a pull-request comment or
``$GITHUB_STEP_SUMMARY``: what it says of a batch with a baseline, flaky scenarios and
judge trust; that it stays under GitHub's limits; and that nothing an agent or a judge
wrote becomes a link, an image, a heading, a mention, HTML, or breaks out of its table
or code block.  The Markdown is read back with markdown-it-py (CommonMark with GitHub's
tables) to see what a renderer makes of it."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from client.reports import FailedTurn, Outcome
from client.summary import SUMMARY_LIMIT, markdown_summary, write_summary
from shared.batches.schemas import (
    BatchComparison,
    BatchRunRead,
    Change,
    PassRateDifference,
    ScenarioComparison,
    ScenarioTrials,
)
from shared.calibration.schemas import Interval, JudgeTrust, TrustedCriterion, UncalibratedCriterion

LINK = "https://spar.example.com/ui/orgs/o-1/batches/b-1"
# What a hostile reply, critique or scenario name may try.
HOSTILE = (
    "# Heading\n![pixel](https://evil.example/p.png) [click](https://evil.example/x) "
    "<img src=x onerror=alert(1)> <a href='https://evil.example'>a</a> @octocat @org/team "
    "see #1 https://evil.example/bare www.evil.example mail@evil.example "
    "| broken | table |\n```\nout of the block\n</details>\n\x1b[31mred\x1b[0m **bold** _it_"
)


def markdown() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table")


def flat(tokens: list[Token]) -> list[Token]:
    """Every token, the inline ones' children too."""
    out = []
    for token in tokens:
        out.append(token)
        out.extend(flat(token.children or []))
    return out


def batch(**changes: object) -> BatchRunRead:
    now = datetime.now(UTC)
    made = BatchRunRead(
        id=uuid.uuid4(),
        organization_id=uuid.uuid4(),
        agent_id=uuid.uuid4(),
        agent_name="support-bot",
        status="completed",
        total_scenarios=8,
        completed_scenarios=8,
        passed_scenarios=5,
        failed_scenarios=3,
        error_scenarios=0,
        max_concurrency=2,
        started_at=now,
        completed_at=now,
        created_at=now,
        updated_at=now,
    )
    return msgspec.structs.replace(made, **changes)


def failed_run(name: str, reply: str = "Echo: refund please", critique: str = "no 30") -> Outcome:
    return Outcome(
        run_id=uuid.uuid4(),
        scenario_id=uuid.uuid4(),
        scenario=name,
        status="failed",
        passed_turns=1,
        total_turns=2,
        seconds=1.0,
        failed=[
            FailedTurn(
                1,
                "and the policy?",
                reply,
                [("30 days", "FAIL", critique)],
                tool_calls=['refund_order({"order_id":"AB-1"})'],
            )
        ],
        failed_conversation=[("Was the agent polite?", "FAIL", "it was curt")],
        simulation_outcome="goal_reached",
    )


def errored_run(name: str) -> Outcome:
    return Outcome(
        run_id=uuid.uuid4(),
        scenario_id=uuid.uuid4(),
        scenario=name,
        status="error",
        passed_turns=0,
        total_turns=1,
        seconds=0.5,
        error="agent answered HTTP 500",
    )


def repeated_batch() -> BatchRunRead:
    flaky = ScenarioTrials(
        scenario_id=uuid.uuid4(), scenario_name="wobbly", trials=4, passes=3, errors=0, flaky=True
    )
    steady = msgspec.structs.replace(flaky, scenario_name="steady", passes=4, flaky=False)
    criterion = TrustedCriterion(
        question="Was the agent polite?",
        criteria_ids=[uuid.uuid4()],
        scenarios=2,
        judged=8,
        passed=6,
        raw_pass_rate=0.75,
        calibration_id=uuid.uuid4(),
        calibration_examples=40,
        tpr=0.9,
        tnr=0.8,
        corrected_pass_rate=0.81,
        interval=Interval(low=0.62, high=0.97),
        stale=False,
    )
    uncalibrated = UncalibratedCriterion(
        question="Helpful?",
        criteria_ids=[uuid.uuid4()],
        scenarios=1,
        judged=4,
        passed=4,
        raw_pass_rate=1.0,
    )
    return batch(
        repetitions=4,
        scenarios=[flaky, steady],
        pass_hat_k=[7 / 8, 3 / 4, 5 / 8, 1 / 2],
        pass_at_k=1.0,
        flaky_scenarios=1,
        judge_trust=JudgeTrust(
            status="ready",
            computed_at=datetime.now(UTC),
            criteria=[criterion],
            uncalibrated=[uncalibrated],
        ),
    )


def comparison(now: BatchRunRead, name: str = "lost") -> BatchComparison:
    regressed = ScenarioComparison(
        scenario_id=uuid.uuid4(),
        scenario_name=name,
        change=Change.REGRESSED,
        a_trials=4,
        a_passes=4,
        b_trials=4,
        b_passes=0,
        p_value=1 / 70,
        significant=True,
        a=None,
        b=None,
    )
    fixed = msgspec.structs.replace(
        regressed,
        scenario_name="mended",
        change=Change.FIXED,
        a_passes=0,
        b_passes=4,
        p_value=1.0,
        significant=False,
    )
    same = msgspec.structs.replace(regressed, scenario_name="same", change=Change.UNCHANGED)
    return BatchComparison(
        a=batch(),
        b=now,
        scenarios=[regressed, fixed, same],
        regressions=1,
        fixes=1,
        edited=0,
        significant_regressions=1,
        pass_rate_difference=PassRateDifference(
            difference=-0.25, low=-0.5, high=0.0, pairs=4, resamples=2000, seed=0
        ),
    )


def test_a_batch_with_a_baseline_flaky_scenarios_and_judge_trust_says_it_all() -> None:
    now = repeated_batch()
    found = [failed_run("lost"), failed_run("wobbly"), errored_run("down")]
    text = markdown_summary(now, found, LINK, comparison(now))

    headline = text.splitlines()[0]
    assert headline.startswith("### ")
    assert "5 passed, 3 failed, 0 error of 8 runs (62% passed)" in headline
    # The judge-corrected pass rate of the calibrated criterion, with its interval; the
    # uncalibrated one counted.
    assert "| Was the agent polite? | 75% | 81% (62% to 97%) |" in text
    assert "1 LLM-judged criterion uncalibrated" in text
    # Against the baseline: the counts, the difference and each changed scenario's p-value.
    assert "1 regression (1 significant, p < 0.05), 1 fix" in text
    assert "pass rate -25.0% (95 % interval -50.0% to +0.0%, 4 scenarios)" in text
    assert "| lost | regressed | 4 of 4 | 0 of 4 | 0.0143 | **significant** |" in text
    assert "| mended | fixed | 0 of 4 | 4 of 4 | 1.0000 |  |" in text
    assert "| same |" not in text  # unchanged: not listed
    # Repetitions: pass^k and the flaky scenarios.
    assert "pass^1 88%, pass^2 75%, pass^3 62%, pass^4 50%; pass@4 100%" in text
    assert "| wobbly | 3 of 4 | 0 |" in text and "| steady |" not in text
    # The failed turns with their criterion and critique, the conversation criteria, the
    # tool calls, the error.
    assert "FAIL: 30 days\n    critique: no 30" in text
    assert "FAIL: Was the agent polite?\n    critique: it was curt" in text
    assert 'tool call: refund_order({"order_id":"AB-1"})' in text
    assert "agent answered HTTP 500" in text
    assert text.count("<details>") == 3 == text.count("</details>")
    assert f"[results page]({LINK})" in text

    tokens = flat(markdown().parse(text))
    headings = [t for t in tokens if t.type == "heading_open"]
    assert [t.tag for t in headings] == ["h3", "h4", "h4", "h4", "h4"]
    links = [t.attrGet("href") for t in tokens if t.type == "link_open"]
    assert links and set(links) == {LINK}
    assert [t.type for t in tokens].count("table_open") == 3  # trust, baseline, flaky
    assert len(text) < SUMMARY_LIMIT


def test_without_baseline_repetitions_or_trust_only_the_counts_failures_and_link() -> None:
    text = markdown_summary(
        batch(passed_scenarios=1, failed_scenarios=0, total_scenarios=1, completed_scenarios=1),
        [],
        LINK,
    )
    assert "1 passed, 0 failed, 0 error of 1 runs (100% passed)" in text
    for absent in ("baseline", "pass^", "Flaky", "judge", "did not pass", "<details>"):
        assert absent not in text
    computing = markdown_summary(batch(judge_trust=JudgeTrust(status="computing")), [], LINK)
    assert "judge trust: still computing" in computing.lower()


def test_the_summary_stays_under_the_cap_leaving_out_failed_turns_first() -> None:
    now = repeated_batch()
    big = "x" * 5_000
    found = [failed_run(f"scenario {i}", reply=big, critique=big) for i in range(100)]
    text = markdown_summary(now, found, LINK, comparison(now))
    assert len(text) <= SUMMARY_LIMIT
    kept = text.count("<details>")
    assert 0 < kept < 100
    assert f"{100 - kept} of the 100 runs that did not pass are left out" in text
    # The tables and the link are all there; each long text cut, saying by how much.
    assert "| lost | regressed |" in text and "| wobbly | 3 of 4 |" in text
    assert text.rstrip().endswith(f"[results page]({LINK})")
    assert "more characters)" in text
    assert text.count("```") % 2 == 0  # every code block closed

    # So many changed scenarios that even the tables overflow a small cap: rows go too.
    many = [
        msgspec.structs.replace(comparison(now).scenarios[0], scenario_name=f"s{i}")
        for i in range(5_000)
    ]
    crowded = msgspec.structs.replace(comparison(now), scenarios=many)
    small = markdown_summary(now, found, LINK, crowded, limit=8_000)
    assert len(small) <= 8_000
    assert "<details>" not in small and "100 runs that did not pass are left out" in small
    assert re.search(r"\d+ more changed scenarios? left out", small)
    assert small.rstrip().endswith(f"[results page]({LINK})")


def test_nothing_an_agent_or_judge_wrote_becomes_markup() -> None:
    now = msgspec.structs.replace(repeated_batch(), agent_name=HOSTILE)
    hostile = failed_run(HOSTILE, reply=HOSTILE, critique=HOSTILE)
    hostile.failed[0].user_message = HOSTILE
    hostile.failed_conversation = [(HOSTILE, "FAIL", HOSTILE)]
    errored = errored_run(HOSTILE)
    errored.error = HOSTILE
    flaky = [msgspec.structs.replace(s, scenario_name=HOSTILE) for s in now.scenarios]
    trust = now.judge_trust
    criteria = [msgspec.structs.replace(trust.criteria[0], question=HOSTILE)]
    now = msgspec.structs.replace(
        now, scenarios=flaky, judge_trust=msgspec.structs.replace(trust, criteria=criteria)
    )
    text = markdown_summary(now, [hostile, errored], LINK, comparison(now, name=HOSTILE))

    tokens = flat(markdown().parse(text))
    kinds = [t.type for t in tokens]
    assert "image" not in kinds
    assert {t.attrGet("href") for t in tokens if t.type == "link_open"} == {LINK}
    assert [t.tag for t in tokens if t.type == "heading_open"] == ["h3", "h4", "h4", "h4", "h4"]
    # The only HTML is the summary's own collapsible sections.
    html = [t.content for t in tokens if t.type in ("html_inline", "html_block")]
    assert html and all(
        re.fullmatch(r"(\s*(<details>|</details>|<summary>.*?</summary>)\s*)+", h, re.S)
        for h in html
    ), html
    assert all("<img" not in h and "<a " not in h for h in html)
    # Each table keeps its columns on every row: a | in a name is text.
    widths = []
    for token in tokens:
        if token.type == "table_open":
            widths.append([])
        elif token.type == "tr_open":
            widths[-1].append(0)
        elif token.type in ("th_open", "td_open"):
            widths[-1][-1] += 1
    assert len(widths) == 3 and all(len(set(rows)) == 1 and len(rows) > 1 for rows in widths)
    # (A row with too many cells loses the excess: the hostile cells must hold their |.)
    cells = re.findall(r"<td>(.*?)</td>", markdown().render(text), re.S)
    hostile_cells = [cell for cell in cells if "Heading" in cell]
    assert len(hostile_cells) == 3 and all("| broken | table |" in c for c in hostile_cells)
    # Code blocks: the fences the summary opened are the ones that close them.
    fences = [t for t in tokens if t.type == "fence"]
    assert len(fences) == 2 and all("out of the block" in f.content for f in fences)
    assert all("</details>" in f.content for f in fences)
    # Rendered text: no mention, no bare link or address GitHub would make a link of, no
    # control character.
    rendered = markdown().render(text)
    visible = re.sub(r"<pre>.*?</pre>", "", rendered, flags=re.S)  # code: shown as code
    assert not re.search(r"(?<!\w)@[A-Za-z0-9]", visible)  # pass@4 is none
    assert not re.search(r"#\d", visible)
    assert "https://evil" not in visible and "www.evil" not in visible
    assert "\x1b" not in text and "\\x1b[31mred" in rendered
    assert "&lt;img src=x" in rendered  # shown as text


def test_write_summary_writes_the_file_or_standard_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "summary.md"
    write_summary(path, "## hello\n")
    assert path.read_text() == "## hello\n"
    write_summary(Path("-"), "## to stdout\n")
    assert capsys.readouterr().out == "## to stdout\n"
