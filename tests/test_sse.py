"""SSE reassembly (`harness.detect.flows.sse_streams`): every string at one JSON path across the `data:` events,
concatenated; checked against a plain reference walk on random event streams."""

from __future__ import annotations

import json
import random
from typing import Any

from harness.detect.decode import MAX_SSE_DEPTH, sse_streams

KEYS = ["id", "choices", "delta", "content", "tool_calls", "arguments", "x.y", "0"]


def reference(data: bytes) -> dict[str, str]:
    """The definition, written for clarity: path -> the strings at it, in order, when more than one."""
    found: dict[str, list[str]] = {}

    def walk(node: Any, path: str, depth: int) -> None:
        if isinstance(node, str):
            found.setdefault(path, []).append(node)
        elif depth and isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else key, depth - 1)
        elif depth and isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]", depth - 1)

    for line in data.splitlines():
        if line.startswith(b"data:"):
            try:
                walk(json.loads(line[5:]), "", MAX_SSE_DEPTH)
            except ValueError:
                continue
    return {path: "".join(parts) for path, parts in found.items() if len(parts) > 1}


def random_node(rng: random.Random, depth: int) -> Any:
    roll = rng.random()
    if depth <= 0 or roll < 0.35:
        return rng.choice(["ab", "c", "", "é\u2028", 7, 1.5, None, True, "q" * rng.randrange(5)])
    if roll < 0.7:
        return {rng.choice(KEYS): random_node(rng, depth - 1) for _ in range(rng.randrange(4))}
    return [random_node(rng, depth - 1) for _ in range(rng.randrange(4))]


def stream(events: list[Any], extra: list[bytes] = ()) -> bytes:
    lines = [b"data: " + json.dumps(e).encode() for e in events] + list(extra)
    return b"\n\n".join(lines) + b"\n\ndata: [DONE]\n\n"


def test_random_streams_reassemble_as_the_reference_does():
    rng = random.Random(20261203)
    for _ in range(400):
        events = [random_node(rng, rng.randrange(1, 6)) for _ in range(rng.randrange(1, 12))]
        data = stream(events, [b"event: ping", b": comment", b"data: {broken"])
        assert sse_streams(data) == reference(data), events


def test_paths_name_keys_and_indexes_and_single_strings_are_left_out():
    events = [{"choices": [{"delta": {"content": "sk-ten"}}], "id": "a"},
              {"choices": [{"delta": {"content": "ant-1"}}], "model": "m"},
              "top", "level"]
    assert sse_streams(stream(events)) == {"choices[0].delta.content": "sk-tenant-1", "": "toplevel"}


def test_strings_deeper_than_the_limit_are_not_collected():
    def nested(depth: int, text: str) -> Any:
        return text if depth == 0 else {"a": nested(depth - 1, text)}

    deep = stream([nested(MAX_SSE_DEPTH, "x"), nested(MAX_SSE_DEPTH, "y")])
    too_deep = stream([nested(MAX_SSE_DEPTH + 1, "x"), nested(MAX_SSE_DEPTH + 1, "y")])
    assert list(sse_streams(deep).values()) == ["xy"]
    assert sse_streams(too_deep) == {}
