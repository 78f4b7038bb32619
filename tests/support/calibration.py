"""Calibration examples: a human's verdict beside what the loopback judge will say
(``[judge:PASS]`` in the question, read by :func:`tests.support.fakes.verdict_from_marker`)."""

from __future__ import annotations

from typing import Any


def example(n: int, human: str, judged: str, *tags: str) -> dict[str, Any]:
    return {
        "id": f"ex-{n}",
        "user_message": f"question {n}",
        "agent_response": f"answer {n}",
        "criterion_question": f"Is answer {n} correct? [judge:{judged}]",
        "human_verdict": human,
        "human_critique": "",
        "tags": list(tags),
    }


EXAMPLES = [
    example(1, "PASS", "PASS", "billing"),
    example(2, "PASS", "PASS", "billing"),
    example(3, "PASS", "FAIL", "refunds"),  # false negative
    example(4, "FAIL", "FAIL", "refunds"),
    example(5, "FAIL", "PASS", "billing"),  # false positive
    example(6, "FAIL", "garbage"),  # undecided
]
