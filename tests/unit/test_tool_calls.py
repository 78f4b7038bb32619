"""Reading an agent's tool calls (protocol ``spar``, OpenAI's), redacting and capping them
(shared.outbound.tool_calls); the calls' one-line form (ToolCall.compact)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from shared.outbound import tool_calls
from shared.outbound.egress import EgressPolicy
from shared.outbound.schemas import CUT, ToolCall

SECRET = "tok-0123456789abcdef"


def test_spar_calls_are_read_with_their_defaults() -> None:
    calls = tool_calls.from_spar(
        [
            {"name": "lookup", "arguments": {"id": 1}, "output": {"ok": True}},
            {"name": "ping", "id": "ignored like other unknown fields"},
            {"name": "log", "arguments": {}, "output": None},
        ]
    )
    assert calls == [
        ToolCall(name="lookup", arguments={"id": 1}, output={"ok": True}),
        ToolCall(name="ping"),
        ToolCall(name="log"),
    ]
    assert tool_calls.from_spar(None) == [] and tool_calls.from_spar([]) == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"name": "x"}, "tool_calls: expected `array`, got `object`"),
        ("lookup", "tool_calls: expected `array`, got `str`"),
        ([{"arguments": {}}], "tool_calls[0]: object missing required field `name`"),
        ([{"name": "a"}, {"name": ""}], "tool_calls[1].name: expected `str` of length >= 1"),
        ([{"name": 7}], "tool_calls[0].name: expected `str`, got `int`"),
        (
            [{"name": "a", "arguments": "{}"}],
            "tool_calls[0].arguments: expected `object`, got `str`",
        ),
        ([None], "tool_calls[0]: expected `object`, got `null`"),
    ],
)
def test_malformed_spar_calls_say_what_is_wrong_and_where(value: Any, message: str) -> None:
    with pytest.raises(tool_calls.MalformedToolCalls) as malformed:
        tool_calls.from_spar(value)
    assert str(malformed.value) == message


def test_openai_calls_have_their_arguments_parsed_or_kept_whole() -> None:
    message = {
        "content": None,
        "tool_calls": [
            {"type": "function", "function": {"name": "a", "arguments": '{"id": 1}'}},
            {"type": "function", "function": {"name": "b", "arguments": "{not json"}},
            {"type": "function", "function": {"name": "c", "arguments": "[1, 2]"}},
            {"type": "function", "function": {"name": "d", "arguments": ""}},
            {"type": "function", "function": {"name": "e"}},
            {"type": "function", "function": {"name": "f", "arguments": {"lenient": True}}},
            {"type": "function", "function": {"name": "g", "arguments": '{"nul": "a\\u0000b"}'}},
        ],
    }
    assert tool_calls.from_openai(message) == [
        ToolCall(name="a", arguments={"id": 1}),
        ToolCall(name="b", arguments={tool_calls.UNPARSED: "{not json"}),
        ToolCall(name="c", arguments={tool_calls.UNPARSED: "[1, 2]"}),
        ToolCall(name="d", arguments={tool_calls.UNPARSED: ""}),
        ToolCall(name="e"),
        ToolCall(name="f", arguments={"lenient": True}),
        ToolCall(name="g", arguments={"nul": "a\ufffdb"}),  # storable
    ]
    assert tool_calls.from_openai({"content": "hi"}) == []
    assert tool_calls.from_openai({"content": "hi", "tool_calls": None}) == []


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ({"name": "a"}, "choices[0].message.tool_calls: expected an array"),
        (
            [{"type": "function"}],
            "choices[0].message.tool_calls[0].function.name: expected a string",
        ),
        (["a"], "choices[0].message.tool_calls[0].function.name: expected a string"),
        (
            [{"function": {"name": "a"}}, {"function": {"name": ""}}],
            "choices[0].message.tool_calls[1].function.name: expected a string",
        ),
    ],
)
def test_malformed_openai_calls_say_where(calls: Any, message: str) -> None:
    with pytest.raises(tool_calls.MalformedToolCalls) as malformed:
        tool_calls.from_openai({"content": None, "tool_calls": calls})
    assert str(malformed.value) == message


def test_redaction_reaches_every_string_and_names_the_credential() -> None:
    policy = EgressPolicy(rules=[], credentials={"API": SECRET, "OTHER": "unused-credential"})
    calls = [
        ToolCall(name="login", arguments={"token": SECRET, SECRET: "as a key"}),
        ToolCall(name="echo", arguments={}, output=[{"said": f"my token is {SECRET}"}, 3]),
        ToolCall(name="clean", arguments={"n": 1}),
    ]
    kept, keys = tool_calls.redacted(calls, policy.redactor().text, policy)
    assert keys == ["API"]
    assert SECRET not in json.dumps(msgspec.to_builtins(kept))
    assert kept[0].arguments == {"token": "[redacted]", "[redacted]": "as a key"}
    assert kept[1].output == [{"said": "my token is [redacted]"}, 3]
    assert kept[2] == calls[2]
    assert tool_calls.redacted(calls[2:], policy.redactor().text, policy) == ([calls[2]], [])


def test_a_turns_calls_are_capped_whole_and_in_order_with_a_marker() -> None:
    small = ToolCall(name="small", arguments={"n": 1})
    big = ToolCall(name="big", arguments={"blob": "x" * 30_000})
    cut = ToolCall(name=CUT, arguments={"calls_cut": 2, "max_bytes": tool_calls.MAX_BYTES})
    assert tool_calls.capped([small, big, big, small]) == [small, big, big, small]  # 60 KB
    # The third big call would pass 64 KiB: it and every call after it are left out.
    assert tool_calls.capped([small, big, big, big, small]) == [small, big, big, cut]
    huge = ToolCall(name="huge", output="y" * tool_calls.MAX_BYTES)
    assert tool_calls.capped([huge, small]) == [cut]
    assert tool_calls.capped([]) == []


def test_the_one_line_form_of_a_call() -> None:
    assert ToolCall(name="a", arguments={"x": [1, "é"]}).compact() == 'a({"x":[1,"é"]})'
    sorted_keys = ToolCall(
        name="a", arguments={"b": 1, "a": {"d": 2, "c": 3}}, output={"z": 0, "y": 1}
    )
    assert sorted_keys.compact() == 'a({"a":{"c":3,"d":2},"b":1}) -> {"y":1,"z":0}'
    assert ToolCall(name="a", output=False).compact() == "a({}) -> false"
    cut = ToolCall(name=CUT, arguments={"calls_cut": 3, "max_bytes": 65536})
    assert cut.compact() == "[3 more tool calls not kept: over 65536 bytes]"
