"""The runs a worker plays on its event loop (workers.conversations): bounded in number,
sent again after a failure with a growing backoff until their retries run out, cancelled
at their time limit, and handed back when the worker stops.  A real Dramatiq worker on the
in-memory broker gives the event loop thread; ``play`` stands for a run's delivery."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from shared.queue import _AsyncIO
from workers.conversations import Conversations


class Plays:
    """What each run's delivery does, and what was sent again (run, delay, retries)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int | None, int]] = []
        self.now = 0
        self.most = 0
        self.cancelled: list[str] = []
        self.played: list[str] = []
        # The successors each run offers as it ends, and whether each was kept here.
        self.offers: dict[str, list[str]] = {}
        self.keep: Callable[..., bool] = lambda run_id, after: False
        self.kept: dict[str, bool] = {}
        # How long a send blocks its caller (a broker's round trip), and the wake-ups of
        # the runs named "ticking:…" on the event loop, each every 10 ms, as they come.
        self.send_s = 0.0
        self.refusing = False  # the broker refuses every send (Redis away)
        self.ticks = 0
        self.ticks_during_sends: list[int] = []

    async def play(self, run_id: str, claimed: Callable[[], None]) -> None:
        self.played.append(run_id)
        if run_id.startswith("claimed-late"):  # its claim's round trip
            await asyncio.sleep(0.3)
        claimed()
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            if run_id.startswith("fail"):
                raise RuntimeError("the delivery failed")
            seconds = float(run_id.partition(":")[2] or 0)
            if run_id.startswith("ticking"):
                ends = time.monotonic() + seconds
                while time.monotonic() < ends:
                    await asyncio.sleep(0.01)
                    self.ticks += 1
            else:
                await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.cancelled.append(run_id)
            raise
        finally:
            self.now -= 1
        for successor in self.offers.get(run_id, ()):  # as workers.runs.play_run does
            self.kept[successor] = self.keep(successor, after=run_id)

    def send(self, run_id: str, delay_ms: int | None, retries: int) -> None:
        if self.refusing:
            raise ConnectionError("Redis away")
        before = self.ticks
        time.sleep(self.send_s)
        self.ticks_during_sends.append(self.ticks - before)
        self.sent.append((run_id, delay_ms, retries))


@pytest.fixture
def plays() -> Plays:
    return Plays()


def _started(plays: Plays, **options: float) -> tuple[Conversations, dramatiq.Worker]:
    broker = StubBroker()
    broker.add_middleware(_AsyncIO())
    conversations = Conversations(
        play=plays.play,
        send=plays.send,
        limit=int(options.get("limit", 2)),
        time_limit_s=options.get("time_limit_s", 30.0),
        drain_s=options.get("drain_s", 5.0),
        max_retries=3,
        backoff_ms=(100, 250),
    )
    broker.add_middleware(conversations)
    worker = dramatiq.Worker(broker, worker_threads=1)
    worker.start()
    return conversations, worker


@pytest.fixture
def stopped() -> Iterator[list[dramatiq.Worker]]:
    workers: list[dramatiq.Worker] = []
    yield workers
    for worker in workers:
        worker.stop()


def _until(condition, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.01)


def test_a_failed_delivery_is_sent_again_with_a_growing_backoff_until_its_retries_run_out(
    plays: Plays, stopped: list[dramatiq.Worker]
) -> None:
    conversations, worker = _started(plays)
    stopped.append(worker)
    for retries in range(4):  # its deliveries so far, as the message says
        conversations.start(f"fail-{retries}", retries)
    _until(lambda: len(plays.sent) == 3)
    time.sleep(0.1)  # the fourth, past its retries, is not sent: the sweeper's now
    sent = sorted(plays.sent)
    assert [(run, retries) for run, _, retries in sent] == [(f"fail-{n}", n + 1) for n in range(3)]
    delays = [delay for _, delay, _ in sent]
    assert 90 <= delays[0] <= 110 and 180 <= delays[1] <= 220 and 225 <= delays[2] <= 275


def test_a_failed_delivery_is_sent_again_without_holding_up_the_other_runs(
    plays: Plays, stopped: list[dramatiq.Worker]
) -> None:
    """A send is a blocking round trip to the broker (here 0.6 s, as with Redis paused):
    the run beside the failed one goes on meanwhile, and the send still goes."""
    conversations, worker = _started(plays)
    stopped.append(worker)
    plays.send_s = 0.6
    conversations.start("ticking:1.5", 0)
    conversations.start("fail-0", 0)
    _until(lambda: len(plays.sent) == 1)
    assert plays.sent[0][0] == "fail-0" and plays.sent[0][2] == 1
    assert plays.ticks_during_sends[0] >= 20, plays.ticks_during_sends  # 0 on the loop


def test_a_send_that_fails_leaves_the_run_to_the_sweeper_and_frees_its_place(
    plays: Plays, stopped: list[dramatiq.Worker], caplog: pytest.LogCaptureFixture
) -> None:
    """The broker refusing the send again: logged, and the run's place comes back (its
    delivery's unit is released, so the sweeper sends it again)."""
    conversations, worker = _started(plays, limit=2)
    stopped.append(worker)
    plays.refusing = True
    with caplog.at_level("WARNING", logger="spar.worker.conversations"):
        conversations.start("fail-0", 0)
        _until(lambda: conversations.room() == 2 and "could not be sent again" in caplog.text)
    assert "fail-0" in caplog.text


def test_a_delivery_over_its_time_limit_is_cancelled_and_sent_again(
    plays: Plays, stopped: list[dramatiq.Worker]
) -> None:
    conversations, worker = _started(plays, time_limit_s=0.2)
    stopped.append(worker)
    conversations.start("slow:10", 0)
    _until(lambda: len(plays.sent) == 1)
    assert plays.cancelled == ["slow:10"]
    assert plays.sent[0][0] == "slow:10" and plays.sent[0][2] == 1


def test_runs_in_flight_are_bounded_and_a_full_process_waits_for_room(
    plays: Plays, stopped: list[dramatiq.Worker]
) -> None:
    conversations, worker = _started(plays, limit=2)
    stopped.append(worker)
    conversations.start("a:0.4", 0)
    conversations.start("b:0.4", 0)
    waited = time.monotonic()
    conversations.start("c:0", 0)  # blocks this thread until a or b ends
    assert time.monotonic() - waited >= 0.3
    _until(lambda: plays.now == 0)
    assert plays.most == 2 and plays.sent == []


def test_a_stopping_worker_waits_for_its_runs_then_hands_the_rest_back(plays: Plays) -> None:
    conversations, worker = _started(plays, limit=5, drain_s=0.5)
    conversations.start("short:0.2", 0)
    conversations.start("long:30", 0)
    _until(lambda: plays.now == 2)
    stopping = time.monotonic()
    worker.stop()
    took = time.monotonic() - stopping
    # The short run ended within the drain; the long one was cancelled and sent again.
    assert plays.cancelled == ["long:30"]
    assert plays.sent == [("long:30", None, 0)]
    assert took < 10


def test_a_thread_waiting_for_room_as_the_worker_stops_sends_its_run_back(plays: Plays) -> None:
    conversations, worker = _started(plays, limit=1, drain_s=0.2)
    conversations.start("long:30", 0)
    waiting = threading.Thread(target=conversations.start, args=("next", 0))
    waiting.start()
    time.sleep(0.2)
    worker.stop()
    waiting.join(timeout=5)
    assert not waiting.is_alive()
    assert sorted(plays.sent) == [("long:30", None, 0), ("next", None, 0)]


def test_a_duplicate_of_a_run_in_flight_here_is_dropped_at_once(
    plays: Plays, stopped: list[dramatiq.Worker]
) -> None:
    conversations, worker = _started(plays, limit=3)
    stopped.append(worker)
    conversations.start("same:0.3", 0)
    _until(lambda: plays.now == 1)
    conversations.start("same:0.3", 0)  # sent again (by the sweeper) while it plays here
    conversations.start("other:0", 0)
    _until(lambda: plays.now == 0 and "other:0" in plays.played)
    assert plays.played == ["same:0.3", "other:0"] and plays.most == 2


def test_a_runs_message_is_acknowledged_only_once_the_run_is_claimed(
    plays: Plays, stopped: list[dramatiq.Worker]
) -> None:
    """The actor returns (and Dramatiq acknowledges the message) after the claim: a worker
    killed before it must leave the message to be delivered again."""
    conversations, worker = _started(plays, limit=2)
    stopped.append(worker)
    started = time.monotonic()
    conversations.start("claimed-late:1", 0)
    returned = time.monotonic() - started
    assert 0.25 <= returned < 1.0, returned  # after the claim, not after the whole run
    assert plays.now == 1  # still playing


def test_the_room_left_counts_runs_starting_and_in_flight_and_comes_back_as_they_end(
    plays: Plays, stopped: list[dramatiq.Worker]
) -> None:
    """What the ``runs`` consumer may still fetch (shared.queue): a duplicate dropped at
    once gives its place back."""
    conversations, worker = _started(plays, limit=3)
    stopped.append(worker)
    assert conversations.room() == 3
    conversations.start("a:0.3", 0)
    conversations.start("b:0.3", 0)
    assert conversations.room() == 1
    conversations.start("a:0.3", 0)  # a duplicate of a run in flight here
    assert conversations.room() == 1
    _until(lambda: plays.now == 0 and conversations.room() == 3)


def test_a_run_that_came_by_message_starts_its_successor_in_its_own_place(
    plays: Plays, stopped: list[dramatiq.Worker]
) -> None:
    """A run delivered by a message starts the first successor it offers as it ends on its
    process, with no message, in its own place (even with the process full); any other it
    offers, and any its kept successor offers, go to the queue (the caller sends them), so
    that other processes get a share of the batch and no run waits for two messages in a
    row."""
    conversations, worker = _started(plays, limit=2)
    stopped.append(worker)
    plays.offers = {"a:0.2": ["s1:0.3", "s2:0"], "s1:0.3": ["t1:0"], "b:0.6": ["u1:0"]}
    plays.keep = conversations.keep
    conversations.start("b:0.6", 0)
    conversations.start("a:0.2", 0)  # the process is full
    _until(lambda: "u1:0" in plays.played and plays.now == 0 and conversations.room() == 2)
    assert plays.kept == {"s1:0.3": True, "s2:0": False, "t1:0": False, "u1:0": True}
    assert sorted(plays.played) == ["a:0.2", "b:0.6", "s1:0.3", "u1:0"] and plays.most == 2
    assert plays.sent == []


def test_a_stopping_process_keeps_no_successor(plays: Plays) -> None:
    conversations, worker = _started(plays, limit=5, drain_s=2.0)
    plays.offers = {"a:0.5": ["s1:0", "s2:0"]}
    plays.keep = conversations.keep
    conversations.start("a:0.5", 0)
    worker.stop()  # the stop is marked at once, then drains: a ends within it
    assert plays.kept == {"s1:0": False, "s2:0": False}
    assert plays.played == ["a:0.5"] and plays.sent == []
