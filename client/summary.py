r"""The Markdown summary of a batch that ``spar batch run --summary FILE`` writes, for a
pull-request comment or a GitHub Actions job summary (``$GITHUB_STEP_SUMMARY``): the
counts and pass rate, each calibrated criterion's judge-corrected pass rate, the
regressions against the baseline with their p-values, pass^k and the flaky scenarios,
what did not pass (each failed turn with its criterion and critique, each failed
conversation criterion, each error) and the link to the results page.

Sized for GitHub: a comment holds at most 65,536 characters, a step summary 1 MiB.  The
summary stays under :data:`SUMMARY_LIMIT`, leaving out whole blocks of what did not pass
first, then table rows, each time with a line saying how many.

What an agent, a judge or a scenario's author wrote is untrusted: a reply may be Markdown
or HTML meant to add a link, an image, a heading or a mention (``@user`` notifies).  In
tables and lines, such text is plain text: each character that starts markup inside a
line backslash-escaped (so ``|`` stays in its cell, ``<img>`` is text), line ends made spaces,
and a zero-width space put where GitHub would make a mention, an issue reference or a
link of plain text (``@user``, ``#12``, ``https://``, ``www.``, ``a@b.c``).  Longer texts
(a reply, a critique) go in code blocks, whose fence is longer than any run of backticks
in them.  Control characters are escaped first, as the terminal shows them
(:func:`client.reports.shown`).
"""

from __future__ import annotations

import dataclasses
import html
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from client.reports import (
    FailedTurn,
    Outcome,
    comparison_counts,
    corrected_rate,
    describe_conversation,
    describe_turn,
    first_failure,
    reliability_line,
    shown,
)
from shared.batches.schemas import BatchComparison, BatchRunRead
from shared.calibration.schemas import JudgeTrust

SUMMARY_LIMIT = 60_000  # characters: under a PR comment's 65,536 with room to add to it
CELL_CHARS = 300  # a name or a question in a table or a line
TEXT_CHARS = 2_000  # a message, a reply, a critique or an error in a code block

# What starts markup inside a line (emphasis, code, links and images, HTML, entities,
# table cells, strikethrough, math); CommonMark lets a backslash escape each.  Text here
# never starts a line, so what only starts a block there (#, >, -, 1.) is text.
_PUNCTUATION = re.compile(r"[\\`*_\[\]<>&|!~$]")
# Where GitHub makes a notification, a reference or a link of plain text: a mention
# (@user, @org/team) or an e-mail address, an issue reference (#12), a URL (https://…,
# www.…).  A zero-width space after the @, the #, the colon or the www breaks each.
_AUTOLINKED = re.compile(r"[@#](?=[A-Za-z0-9])|:(?=//)|(?i:www)(?=\.)")
_ZERO_WIDTH_SPACE = "\u200b"


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def _unlinked(text: str, limit: int) -> str:
    """``text`` on one line, cut at ``limit``, control characters escaped, with nothing
    GitHub would turn into a mention, a reference or a link."""
    one_line = " ".join(shown(text).split())
    return _AUTOLINKED.sub(lambda m: m.group() + _ZERO_WIDTH_SPACE, _cut(one_line, limit))


def inline(text: str, limit: int = CELL_CHARS) -> str:
    """Untrusted ``text`` as plain text in a line or a table cell of Markdown."""
    return _PUNCTUATION.sub(r"\\\g<0>", _unlinked(text, limit))


def html_text(text: str, limit: int = CELL_CHARS) -> str:
    """Untrusted ``text`` as plain text inside HTML (where Markdown is not read)."""
    return html.escape(_unlinked(text, limit))


def code_block(text: str) -> str:
    """Untrusted ``text`` as a code block: shown as it is, nothing in it read as Markdown,
    HTML, a mention or a link; no line of it can close the block."""
    text = shown(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _table(header: list[str]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


@dataclass
class _Part:
    """A section of the summary: ``head`` lines always kept, then ``items`` (table rows
    joined by a line end, or blocks by a blank line) that may be left out from the end,
    with ``left_out(n)`` saying so."""

    head: list[str]
    items: list[str] = dataclasses.field(default_factory=list)
    left_out: Callable[[int], str] | None = None
    separator: str = "\n"
    kept: int = -1  # how many items stay: all (-1) until the cap says otherwise

    def render(self) -> str:
        kept = self.items if self.kept < 0 else self.items[: self.kept]
        text = "\n".join(self.head)
        if kept:
            text += ("\n" if self.head else "") + self.separator.join(kept)
        dropped = len(self.items) - len(kept)
        if dropped and self.left_out is not None:
            text += "\n\n" + self.left_out(dropped)
        return text


def _fit(parts: list[_Part], cut_order: list[_Part], limit: int) -> str:
    """The parts, joined, under ``limit`` characters: items left out from the end of each
    part of ``cut_order`` in turn until the rest fits."""
    total = len(_join(parts))
    for part in cut_order:
        if total <= limit or not part.items or part.left_out is None:
            continue
        # Room for the line saying how many were left out, at its longest.
        total += 2 + len(part.left_out(len(part.items)))
        kept = len(part.items)
        while total > limit and kept:
            kept -= 1
            total -= len(part.items[kept]) + (len(part.separator) if kept else 1)
        part.kept = kept
    return _join(parts)[:limit]


def _join(parts: list[_Part]) -> str:
    return "\n\n".join(part.render() for part in parts) + "\n"


# --- the sections ------------------------------------------------------------------------------


def _headline(batch: BatchRunRead, link: str) -> _Part:
    total, passed = batch.total_scenarios, batch.passed_scenarios
    rate = passed / total if total else 0.0
    title = (
        f"### Spar: {passed} passed, {batch.failed_scenarios} failed, {batch.error_scenarios} "
        f"error of {total} runs ({rate:.0%} passed)"
    )
    about = f"Agent {inline(batch.agent_name)}, batch `{batch.id}` {batch.status}"
    if batch.error_message:
        about += f": {inline(batch.error_message)}"
    if batch.repetitions > 1:
        scenarios = total // batch.repetitions
        about += f"; {_plural(scenarios, 'scenario', 'scenarios')} x {batch.repetitions} runs"
    return _Part([title, "", f"{about}. [results page]({link})"])


def _trust(batch: BatchRunRead) -> _Part | None:
    trust = batch.judge_trust
    if not isinstance(trust, JudgeTrust):
        return None
    if trust.status == "computing":
        return _Part(["Judge trust: still computing (the results page shows it once done)."])
    if not trust.criteria and not trust.uncalibrated:
        return None
    head = ["#### Pass rates with the judge's measured error taken out"]
    if trust.uncalibrated:
        count = _plural(len(trust.uncalibrated), "LLM-judged criterion", "LLM-judged criteria")
        head += [
            "",
            f"{count} uncalibrated (no calibration measured the judge on "
            f"{'it' if len(trust.uncalibrated) == 1 else 'them'}): raw pass rates on the "
            "results page.",
        ]
    if not trust.criteria:
        return _Part(head)
    head += ["", *_table(["criterion", "raw", "corrected (95 % interval)", ""])]
    rows = []
    for c in trust.criteria:
        question = inline(c.question) + (" (conversation)" if c.conversation else "")
        note = f"stale: {inline(c.stale_reason or '')}" if c.stale else ""
        rows.append(_row(question, f"{c.raw_pass_rate:.0%}", corrected_rate(c), note))
    left_out = lambda n: f"{_plural(n, 'more criterion', 'more criteria')} left out."  # noqa: E731
    return _Part(head, rows, left_out)


def _comparison(comparison: BatchComparison) -> _Part:
    head = ["#### Against the baseline", ""]
    baseline = f"Baseline `{comparison.a.id}`"
    if comparison.a.status in ("queued", "running"):
        baseline += " (still running: compared with its runs so far)"
    head.append(f"{baseline}: {comparison_counts(comparison)}.")
    changed = [row for row in comparison.scenarios if row.change != "unchanged"]
    if not changed:
        return _Part(head)
    head += ["", *_table(["scenario", "change", "baseline", "now", "p-value", ""])]
    rows = [
        _row(
            inline(row.scenario_name),
            str(row.change),
            f"{row.a_passes} of {row.a_trials}",
            f"{row.b_passes} of {row.b_trials}",
            "-" if row.p_value is None else f"{row.p_value:.4f}",
            "**significant**" if row.significant else "",
        )
        for row in changed
    ]
    left_out = lambda n: (  # noqa: E731
        f"{_plural(n, 'more changed scenario', 'more changed scenarios')} left out."
    )
    return _Part(head, rows, left_out)


def _reliability(batch: BatchRunRead) -> _Part | None:
    line = reliability_line(batch)
    if line is None:
        return None
    head = ["#### Repetitions", "", f"{line}."]
    scenarios = batch.scenarios if isinstance(batch.scenarios, list) else []
    flaky = [scenario for scenario in scenarios if scenario.flaky]
    if not flaky:
        return _Part([*head, "", "No flaky scenario."])
    head += [
        "",
        f"Flaky ({len(flaky)}): passed some runs, failed others.",
        "",
        *_table(["scenario", "passed", "errors"]),
    ]
    rows = [
        _row(inline(s.scenario_name), f"{s.passes} of {s.trials}", str(s.errors)) for s in flaky
    ]
    left_out = lambda n: f"{_plural(n, 'more flaky scenario', 'more flaky scenarios')} left out."  # noqa: E731
    return _Part(head, rows, left_out)


def _cut_turn(turn: FailedTurn) -> FailedTurn:
    return dataclasses.replace(
        turn,
        user_message=_cut(turn.user_message, TEXT_CHARS),
        response=_cut(turn.response, TEXT_CHARS),
        criteria=[(q, v, _cut(c, TEXT_CHARS)) for q, v, c in turn.criteria],
        tool_calls=[_cut(call, TEXT_CHARS) for call in turn.tool_calls],
    )


def _not_passed(outcome: Outcome) -> str:
    """A run that did not pass as a collapsible block: the scenario and what failed first,
    then every failed turn and conversation criterion (or the error) in a code block."""
    if outcome.status == "failed":
        what = first_failure(outcome)
        described = [describe_turn(_cut_turn(turn)) for turn in outcome.failed]
        if outcome.failed_conversation:
            conversation = [(q, v, _cut(c, TEXT_CHARS)) for q, v, c in outcome.failed_conversation]
            described.append(
                describe_conversation(
                    dataclasses.replace(outcome, failed_conversation=conversation)
                )
            )
        text = "\n\n".join(described)
    else:
        what, text = outcome.status, _cut(outcome.error or outcome.status, TEXT_CHARS)
    return "\n".join(
        [
            "<details>",
            f"<summary>{html_text(outcome.scenario)}: {html_text(what)}</summary>",
            "",
            f"Run `{outcome.run_id}`",
            "",
            code_block(text),
            "",
            "</details>",
        ]
    )


def _failures(found: list[Outcome], limit: int) -> _Part | None:
    bad = [outcome for outcome in found if outcome.status != "passed"]
    if not bad:
        return None
    left_out = lambda n: (  # noqa: E731
        f"_{n} of the {len(bad)} runs that did not pass are left out to keep this summary "
        f"under {limit:,} characters: the results page has them all._"
    )
    heading = f"#### What did not pass ({_plural(len(bad), 'run', 'runs')})"
    return _Part([heading, ""], [_not_passed(o) for o in bad], left_out, separator="\n\n")


def markdown_summary(
    batch: BatchRunRead,
    found: list[Outcome],
    link: str,
    comparison: BatchComparison | None = None,
    *,
    limit: int = SUMMARY_LIMIT,
) -> str:
    """The batch's summary in GitHub-flavoured Markdown, at most ``limit`` characters;
    ``link`` is its results page."""
    trust = _trust(batch)
    compared = _comparison(comparison) if comparison is not None else None
    reliability = _reliability(batch)
    failures = _failures(found, limit)
    parts = [
        part
        for part in (_headline(batch, link), trust, compared, reliability, failures)
        if part is not None
    ]
    parts.append(_Part([f"[results page]({link})"]))
    cut_order = [part for part in (failures, reliability, trust, compared) if part is not None]
    return _fit(parts, cut_order, limit)


def write_summary(path: Path, text: str) -> None:
    """``text`` to the file ``path`` (replaced), or to standard output for ``-``."""
    if str(path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    path.write_text(text, encoding="utf-8")
