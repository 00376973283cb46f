"""What the messaging platforms' stub tests share: tenants with a platform's services minted, and a script that
drives Hermes' own adapter of a platform in the Hermes venv (the events it hands the bot kept, then the test's steps),
whose last printed line is the JSON the test reads."""

from __future__ import annotations

import json
import string
import subprocess
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.registry import Registry, mint
from harness.drive import services
from harness.drive.hermes.agent import hermetic_env

TENANTS = ("default", "alpha")


def registry(tmp_path: Path, platforms: Sequence[str], tenants: Sequence[str] = TENANTS, *,
             ports: Sequence[int] = (), attach: bool = True) -> Registry:
    """`tenants` (their provider listeners at `ports`, else 42000 on) with the services of `platforms` minted; unless
    `attach` is false, each tenant's are at a listener of its own, 127.0.0.1:42100 on in the tenants' order (a
    platform at fixed hosts is routed there by its tokens instead)."""
    ports = ports or range(42000, 42000 + len(tenants))
    reg = mint(list(tenants), tmp_path / "work", {n: {"listen": p} for n, p in zip(tenants, ports, strict=True)})
    services.mint(reg, list(platforms))
    if attach:
        for port, t in enumerate(reg, 42100):
            for name in platforms:
                services.attach(reg, name, t.name, {"listen": port}, f"http://127.0.0.1:{port}")
    return reg


#: The steps of a bot that takes one message, replies to it and sends the file `FILE` where it came from.
REPLY = """
    await asyncio.wait_for(arrived.wait(), 60)  # the stub's message, however loaded the machine
    e = got[0]
    sent = await a.send(e.source.chat_id, "reply to " + e.text)
    doc = await a.send_document(e.source.chat_id, FILE)
    await a.disconnect()
    print(json.dumps({"ok": ok, "user": e.source.user_id, "chat": e.source.chat_id, "text": e.text,
                      "sent": sent.success, "doc": doc.success}))
"""

_SCRIPT = string.Template("""\
import asyncio, json, os
from gateway.config import PlatformConfig
from $module import $name$head

async def main():
    a = $name(PlatformConfig(enabled=True, $config))
    got, arrived = [], asyncio.Event()
    async def take(event):
        got.append(event)
        if len(got) == $events:
            arrived.set()
    $take
    ok = await a.connect()
$steps

asyncio.run(main())
""")


def adapter_script(adapter: str, config: str, steps: str = REPLY, *, events: int = 1, handler: bool = False,
                   head: str = "") -> str:
    """A script for the Hermes venv: Hermes' adapter `adapter` (`module:Class`) made with
    `PlatformConfig(enabled=True, <config>)`, the events it hands the bot kept in `got` (`arrived` set at the
    `events`-th), connected (`ok`), then `steps`, which disconnect and print the JSON the test reads. `handler` sets
    the base class's message handler too (an adapter that dispatches only with one set); `head` follows the imports."""
    module, name = adapter.split(":")
    take = "a._message_handler = a.handle_message = take" if handler else "a.handle_message = take"
    return _SCRIPT.substitute(module=module, name=name, head="\n" + textwrap.dedent(head).strip() if head else "",
                              config=config, events=events, take=take,
                              steps=textwrap.indent(textwrap.dedent(steps).strip(), "    "))


def media_file(home: Path, data: bytes) -> Path:
    """`home` made a Hermes home (its `.hermes`) with `data` in its `report.txt`, the file the bot sends; its path."""
    (home / ".hermes").mkdir(parents=True, exist_ok=True)
    path = home / "report.txt"
    path.write_bytes(data)
    return path


@dataclass(frozen=True)
class Ran:
    """A script's run: the JSON of the last line it printed, and its standard error."""

    out: dict[str, Any]
    stderr: str


def run(hermes_python: Path, script: str, home: Path, values: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None, timeout: float = 90) -> Ran:
    """`script` (dedented) in the Hermes venv after the constants `values` (each set to its repr), at `home` (a Hermes
    home of its own) with a hermetic environment plus `env`; it must exit 0."""
    (home / ".hermes").mkdir(parents=True, exist_ok=True)
    code = "".join(f"{k} = {v!r}\n" for k, v in (values or {}).items()) + textwrap.dedent(script)
    done = subprocess.run([str(hermes_python), "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=hermetic_env(home, hermes_python, dict(env or {})), cwd=home)
    assert done.returncode == 0, done.stderr[-3000:]
    return Ran(json.loads(done.stdout.strip().splitlines()[-1]), done.stderr)
