"""Log lines: one JSON object per line carrying the request id, in the API's context and in
a worker's, async actors included, and passed on with every message Spar sends."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from shared.logs import (
    MESSAGE_OPTION,
    JsonFormatter,
    TextFormatter,
    accept_request_id,
    configure_logging,
    request_id,
)
from shared.queue import get_broker, send
from shared.settings import Settings
from workers.observability import observe_messages


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """Everything logged under ``spar`` and ``test`` while the test runs, as JSON lines."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    loggers = [logging.getLogger("spar"), logging.getLogger("test")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    yield stream
    for logger, level in zip(loggers, levels, strict=True):
        logger.removeHandler(handler)
        logger.setLevel(level)


def parsed(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_json_line_carries_the_request_id_of_its_context(lines: io.StringIO) -> None:
    token = request_id.set("req-123")
    try:
        logging.getLogger("test").info("run %s started", "r1", extra={"run_id": "r1"})
    finally:
        request_id.reset(token)
    logging.getLogger("test").warning("outside any request")

    first, second = parsed(lines)
    assert first["message"] == "run r1 started"
    assert first["request_id"] == "req-123"
    assert first["run_id"] == "r1"
    assert first["level"] == "INFO"
    assert first["logger"] == "test"
    assert first["time"].endswith("+00:00")
    assert "request_id" not in second


def test_an_exception_is_one_json_line_with_its_traceback(lines: io.StringIO) -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("test").exception("failed")
    (entry,) = parsed(lines)
    assert "ValueError: boom" in entry["exc_info"]


def test_the_text_format_shows_the_request_id() -> None:
    record = logging.LogRecord("spar.api", logging.INFO, __file__, 1, "hello", (), None)
    token = request_id.set("abc")
    try:
        assert TextFormatter().format(record).endswith("INFO spar.api [abc]: hello")
    finally:
        request_id.reset(token)


@pytest.mark.parametrize(
    "given", ["a" * 129, "", "has space", "semi;colon", "new\nline", "ünicode", None]
)
def test_an_unsafe_or_missing_request_id_is_replaced_by_a_new_one(given: str | None) -> None:
    accepted = accept_request_id(given)
    assert accepted != given
    assert len(accepted) == 32 and all(c in "0123456789abcdef" for c in accepted)
    assert accept_request_id(given) != accepted  # a new one each time


@pytest.mark.parametrize("given", ["a" * 128, "0b9d2c3e-1f4a-4c8e-9a57-2d1e4f6b7a80", "req_1.2:3"])
def test_a_safe_request_id_is_kept(given: str) -> None:
    assert accept_request_id(given) == given


def test_configuring_twice_leaves_one_handler_in_the_chosen_format() -> None:
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    try:
        configure_logging("INFO", "text")
        configure_logging("DEBUG", "json")
        added = [h for h in root.handlers if h not in before]
        assert len(added) == 1
        assert isinstance(added[0].formatter, JsonFormatter)
        assert root.level == logging.DEBUG
        with pytest.raises(ValueError, match="unknown log format"):
            configure_logging("INFO", "xml")
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
        root.setLevel(level)


def test_a_sent_message_carries_the_senders_request_id_or_a_new_one() -> None:
    broker = StubBroker()
    broker.declare_queue("runs")
    token = request_id.set("from-the-api")
    try:
        send(broker, ("runs", "run_scenario"), "r1")
    finally:
        request_id.reset(token)
    send(broker, ("runs", "run_scenario"), "r2")
    first, second = (dramatiq.Message.decode(broker.queues["runs"].get_nowait()) for _ in range(2))
    assert first.options[MESSAGE_OPTION] == "from-the-api"
    assert second.options[MESSAGE_OPTION] not in {None, "from-the-api"}


def test_an_async_actor_logs_and_sends_under_the_request_id_of_its_message(
    lines: io.StringIO,
) -> None:
    """A worker's broker (``get_broker``, uncached, with the worker's middleware): the worker
    restores the id around the actor, on the event loop thread too, and the message the
    actor sends passes it on."""
    broker = observe_messages(get_broker.__wrapped__(Settings()))
    seen: dict[tuple[str, str], str | None] = {}

    @dramatiq.actor(broker=broker, queue_name="runs", actor_name="first", max_retries=0)
    async def first(run_id: str) -> None:
        seen["first", run_id] = request_id.get()
        logging.getLogger("test").info("playing %s", run_id)
        send(broker, ("runs", "second"), run_id)

    @dramatiq.actor(broker=broker, queue_name="runs", actor_name="second", max_retries=0)
    async def second(run_id: str) -> None:
        seen["second", run_id] = request_id.get()

    token = request_id.set("trace-me")
    try:
        send(broker, ("runs", "first"), "r1")
    finally:
        request_id.reset(token)
    send(broker, ("runs", "second"), "r2")  # sent outside any request: an id of its own

    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=50)
    worker.start()
    try:
        broker.join("runs", timeout=10_000)
        worker.join()
    finally:
        worker.stop()

    assert seen["first", "r1"] == seen["second", "r1"] == "trace-me"
    assert seen["second", "r2"] not in {None, "trace-me"}
    assert request_id.get() is None  # nothing leaked into this thread
    entries = parsed(lines)
    playing = [e for e in entries if e["message"] == "playing r1"]
    assert [e["request_id"] for e in playing] == ["trace-me"]
    done = [e for e in entries if e.get("actor") and e["request_id"] == "trace-me"]
    assert {(e["actor"], e["outcome"]) for e in done} == {
        ("first", "succeeded"),
        ("second", "succeeded"),
    }
    assert all(isinstance(e["duration_ms"], float) for e in done)


def test_a_worker_module_configuring_logging_under_uvicorn_adds_no_second_handler() -> None:
    """``spar dev``: uvicorn applies :func:`uvicorn_log_config`, then importing the actors
    (``workers.broker``) calls :func:`configure_logging`; one handler must be left, or
    every line is written twice."""
    import logging.config

    from shared.logs import uvicorn_log_config

    root = logging.getLogger()
    kept, level = root.handlers[:], root.level
    try:
        logging.config.dictConfig(uvicorn_log_config("INFO", "text"))
        configure_logging("INFO", "text")
        writers = [h for h in root.handlers if getattr(h, "stream", None) is sys.stderr]
        assert len(writers) == 1, root.handlers
    finally:
        root.handlers[:] = kept
        root.setLevel(level)
