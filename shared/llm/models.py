"""What Spar knows of the models it calls, and the request fields that are Spar's.

Spar sends every model the same conversation, but not every model takes the same
parameters.  What differs is decided here, by the model's name, once:

* **OpenAI's reasoning models** (the o-series, ``o1``, ``o3-mini``, ``o4-mini`` …, and
  ``gpt-5`` and later, but not the ``-chat`` variants) refuse ``max_tokens`` and any
  ``temperature`` but 1: they get ``max_completion_tokens`` (which also counts their
  reasoning, so a larger budget) and no temperature.
* **Claude models** are read as ``(major, minor)`` from either naming
  (``claude-3-5-haiku-…``, ``claude-sonnet-4-5``, ``claude-opus-4-20250514``):
  structured outputs (``output_config.format``) from 4.5 on, a forced tool before (its
  only way to a schema); a ``temperature`` up to 4.6 only (later models refuse it, and
  think, so they get the larger budget too).  A name that reads as neither is taken for
  a current model.

A provider's ``request_options`` are merged into each request body on top of these
defaults (a ``null`` removes a default), except the fields that are Spar's own
(:data:`SPAR_FIELDS`): the request is refused when saved if it names one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Fields a request_options object may not set: the conversation, the model, and what
# Spar reads back (one JSON answer, its text, its structured output).
SPAR_FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "stream",
        "response_format",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
    }
)
# Fields inside an object a request_options object may otherwise set.
SPAR_NESTED_FIELDS: Mapping[str, frozenset[str]] = {"output_config": frozenset({"format"})}
SPAR_FIELD_PATHS = (
    *sorted(SPAR_FIELDS),
    *(f"{outer}.{inner}" for outer, inners in SPAR_NESTED_FIELDS.items() for inner in inners),
)
MAX_OPTIONS_BYTES = 16_384  # a request_options object, encoded as JSON

DEFAULT_MAX_TOKENS = 1024
# The output budget of a model that reasons before it answers: reasoning counts in it.
REASONING_MAX_TOKENS = 16_384

_O_SERIES = re.compile(r"^o\d+(-|$)")
_GPT = re.compile(r"^gpt-(\d+)")
_CLAUDE_OLD = re.compile(r"claude-(\d+)(?:[-.](\d))?-[a-z]")  # claude-3-5-sonnet-…
_CLAUDE_NEW = re.compile(r"claude-[a-z]+-(\d+)(?:[-.](\d{1,2})(?!\d))?")  # claude-opus-4-1
_STRUCTURED_FROM = (4, 5)
_SAMPLING_UNTIL = (4, 6)


@dataclass(frozen=True, slots=True)
class ModelTraits:
    """How to ask a model: whether it reasons first (the larger ``max_completion_tokens``
    or ``max_tokens`` budget), takes a ``temperature``, and how it gives a JSON schema's
    answer (``response_format``, ``output_config`` or ``tool``)."""

    reasoning: bool
    sampling: bool
    structured: str


def _base_name(model: str) -> str:
    """``openai/o3-mini`` (a router's name) and ``O3-Mini`` read as ``o3-mini``."""
    return model.rsplit("/", 1)[-1].strip().lower()


def is_openai_reasoning_model(model: str) -> bool:
    name = _base_name(model)
    if _O_SERIES.match(name):
        return True
    gpt = _GPT.match(name)
    return gpt is not None and int(gpt.group(1)) >= 5 and "-chat" not in name


def claude_version(model: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a Claude model's name; ``None`` when it reads as neither
    naming.  A date in the minor's place (``claude-opus-4-20250514``) is minor 0."""
    name = _base_name(model)
    for pattern in (_CLAUDE_OLD, _CLAUDE_NEW):
        found = pattern.search(name)
        if found:
            return int(found.group(1)), int(found.group(2) or 0)
    return None


def traits(provider: str, model: str) -> ModelTraits:
    """What ``model`` of a ``provider`` kind takes (see the module's docstring)."""
    if provider != "anthropic":
        reasoning = is_openai_reasoning_model(model)
        return ModelTraits(reasoning, sampling=not reasoning, structured="response_format")
    version = claude_version(model)
    if version is None:  # not a name Spar can read: taken for a current model
        return ModelTraits(reasoning=True, sampling=False, structured="output_config")
    sampling = version <= _SAMPLING_UNTIL
    return ModelTraits(
        reasoning=not sampling,
        sampling=sampling,
        structured="output_config" if version >= _STRUCTURED_FROM else "tool",
    )


def with_options(body: dict[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` (Spar's defaults) with a provider's ``request_options`` merged in: each
    option replaces the field, a ``None`` removes it."""
    merged = dict(body)
    for name, value in options.items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    return merged


def spar_field_in(options: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The path of the first field of ``options`` that is Spar's own, if any."""
    for name, value in options.items():
        if name in SPAR_FIELDS:
            return (name,)
        nested = SPAR_NESTED_FIELDS.get(name)
        if nested and isinstance(value, Mapping):
            for inner in value:
                if inner in nested:
                    return (name, inner)
    return None
