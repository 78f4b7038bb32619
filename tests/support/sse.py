"""Reading Server-Sent Events in tests."""

from __future__ import annotations

from typing import Any

import msgspec


def parse_sse(text: str) -> list[tuple[str, Any]]:
    """(event, decoded JSON data) for each event of a Server-Sent Events body."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[len("event:") :].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:") :].lstrip())
        if data:
            events.append((name, msgspec.json.decode("\n".join(data))))
    return events
