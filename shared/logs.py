"""One log format for every Spar process (the API, ``spar dev``, workers, the scheduler),
and the request id that ties a request's log lines to the work it started.

* ``SPAR_LOG_FORMAT=json`` (the default): one JSON object per line, with ``time``,
  ``level``, ``logger``, ``message``, ``pid``, ``request_id`` (when there is one),
  ``exc_info`` and any ``extra`` fields.  ``text`` is a human format (``spar dev`` uses it).
* The request id lives in a context variable: the API sets it per request (from a valid
  ``X-Request-ID`` or a new one), :func:`shared.queue.send` copies it into every message
  it sends, and the worker restores it around the actor
  (``workers.observability.MessageObservability``), so one grep on the id follows a run
  from the API into the worker and its successors.

Nothing here logs request bodies or headers; callers never pass them.
"""

from __future__ import annotations

import contextvars
import logging
import re
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"
FORMATS = ("json", "text")

#: The id of the request (or message) whose work is running in this context.
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "spar_request_id", default=None
)

#: The message option that carries the request id from the sender to the worker.
MESSAGE_OPTION = "request_id"

# A caller's X-Request-ID that Spar keeps (the API documents it as the header's pattern).
REQUEST_ID_PATTERN = r"[A-Za-z0-9._:-]{1,128}"
_VALID_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)

# Attributes every LogRecord has; anything else on a record came in through ``extra=``.
_RECORD_ATTRIBUTES = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys()
    | {"message", "asctime", "request_id", "taskName", "color_message"}  # uvicorn's ANSI copy
)


def new_request_id() -> str:
    return uuid.uuid4().hex


def accept_request_id(raw: str | None) -> str:
    """``raw`` (a caller's ``X-Request-ID``) when it is short and made of safe characters,
    else a new id: a caller's value goes into every log line, so it is never trusted."""
    if raw is not None and _VALID_REQUEST_ID.fullmatch(raw):
        return raw
    return new_request_id()


def current_request_id() -> str | None:
    return request_id.get()


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        rid = getattr(record, "request_id", None) or request_id.get()
        if rid:
            entry["request_id"] = rid
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return msgspec.json.encode(entry, enc_hook=str).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        record.request_id = getattr(record, "request_id", None) or request_id.get() or "-"
        return super().format(record)


def formatter(log_format: str) -> logging.Formatter:
    if log_format not in FORMATS:
        raise ValueError(f"unknown log format {log_format!r} (expected one of {FORMATS})")
    return JsonFormatter() if log_format == "json" else TextFormatter()


class SparHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler Spar installed (by :func:`configure_logging`, or by uvicorn from
    :func:`uvicorn_log_config`), so configuring again replaces it: ``spar dev`` configures
    logging, uvicorn configures it again, then importing the actors does once more, and
    each line must still be written once."""


def configure_logging(level: str, log_format: str = "json") -> None:
    """Log to stderr at ``level`` (``SPAR_LOG_LEVEL``) in ``log_format``
    (``SPAR_LOG_FORMAT``).  Calling it again replaces the handler it installed."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, SparHandler)]:
        root.removeHandler(handler)
    handler = SparHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    root.addHandler(handler)
    root.setLevel(level)


def uvicorn_log_config(level: str, log_format: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for uvicorn, which applies it in each of its worker
    processes: the same format as :func:`configure_logging`, uvicorn's loggers through
    it, and no access log (the API writes its own, with the request id)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"spar": {"()": formatter, "log_format": log_format}},
        "handlers": {
            "stderr": {
                "class": "shared.logs.SparHandler",
                "formatter": "spar",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {
            "uvicorn": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.error": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},
        },
    }
