"""A loopback OpenAI-compatible provider behind a rate limit, as real providers enforce one.

:class:`TokenBucketOpenAI` answers chat completions (:class:`~tests.support.fakes.FakeOpenAI`)
while its token bucket (``rate`` requests a second, ``burst`` at most) has a token, and 429
with the wait until the next token past it, in each Retry-After form in turn: seconds
(``Retry-After: 0.25``), milliseconds (``retry-after-ms: 250``) and an HTTP date (rounded
up to the next second, as a date cannot say less).  ``concurrency`` (optional) refuses too
the calls beyond that many at once.  Each answer takes ``service_s``.

It records the most calls it saw at once (``max_in_flight``), the refusals (``refused``)
and the Retry-After forms it sent (``forms``).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from email.utils import formatdate
from typing import Any

from bench.fakes import TokenBucket  # the benchmark's bucket: one rule of the limit
from tests.support.fakes import FakeOpenAI, RecordedRequest, Reply, openai_error

FORMS = ("seconds", "ms", "date")
PASSING = '{"verdict": "PASS", "critique": "ok", "evidence": "ok"}'


class TokenBucketOpenAI(FakeOpenAI):
    def __init__(
        self,
        *,
        rate: float,
        burst: int,
        concurrency: int | None = None,
        service_s: float = 0.01,
        reply: str = PASSING,
        refuse_always: bool = False,
    ) -> None:
        super().__init__(reply=reply)
        self.rate = rate
        self.burst = burst
        self.concurrency = concurrency
        self.service_s = service_s
        self.refuse_always = refuse_always
        self.bucket = TokenBucket(rate, burst)
        self.in_flight = 0
        self.max_in_flight = 0
        self.served = 0
        self.refused = 0
        self.forms: list[str] = []
        self._next_form = itertools.cycle(FORMS)
        self._bucket = threading.Lock()

    def handle(self, request: RecordedRequest) -> Reply:
        with self._bucket:
            crowded = self.concurrency is not None and self.in_flight >= self.concurrency
            wait = 1 / self.rate if self.refuse_always or crowded else self.bucket.take()
            if wait:
                self.refused += 1
                form = next(self._next_form)
                self.forms.append(form)
                return Reply(status=429, headers=_retry_after(form, wait), json=_limited())
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.service_s)
            return super().handle(request)
        finally:
            with self._bucket:
                self.in_flight -= 1
                self.served += 1


def _retry_after(form: str, wait_s: float) -> dict[str, str]:
    if form == "seconds":
        return {"Retry-After": f"{wait_s:.3f}"}
    if form == "ms":
        return {"retry-after-ms": str(math.ceil(wait_s * 1000))}
    return {"Retry-After": formatdate(math.ceil(time.time() + wait_s), usegmt=True)}


def _limited() -> Any:
    return openai_error("Rate limit reached", type="requests", code="rate_limit_exceeded")
