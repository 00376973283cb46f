"""The Mattermost stub answers Hermes' own Mattermost adapter (run in the Hermes venv against it): the bot
authenticates with its token, receives a direct message over the websocket and posts its reply."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

from harness.core.registry import mint
from harness.drive import services
from harness.drive.hermes import hermetic_env
from harness.drive.services.mattermost import MattermostStub, bot_id


def _registry(tmp_path: Path):
    reg = mint(["default", "alpha"], tmp_path / "work", {"default": {"listen": 42000}, "alpha": {"listen": 42001}})
    services.mint(reg, ["mattermost"])
    for port, t in enumerate(reg, 42100):
        services.attach(reg, "mattermost", t.name, {"listen": port}, f"http://127.0.0.1:{port}")
    return reg


ADAPTER = """
    import asyncio, json
    from gateway.config import PlatformConfig
    from plugins.platforms.mattermost.adapter import MattermostAdapter

    async def main():
        a = MattermostAdapter(PlatformConfig(enabled=True, token=TOKEN, extra={"url": URL}))
        got = []
        arrived = asyncio.Event()
        async def take(event):
            got.append(event)
            arrived.set()
        a.handle_message = take
        ok = await a.connect()
        await asyncio.wait_for(arrived.wait(), 60)  # the stub's message, however loaded the machine
        e = got[0]
        sent = await a.send(e.source.chat_id, "reply to " + e.text)
        await a.disconnect()
        print(json.dumps({"ok": ok, "user": e.source.user_id, "chat": e.source.chat_id, "text": e.text,
                          "sent": sent.success}))

    asyncio.run(main())
"""


def test_the_mattermost_stub_answers_hermes_adapter(tmp_path, hermes_python):
    a = _registry(tmp_path)["alpha"]
    stub = MattermostStub(a).start()
    user, channel = a.canaries["mattermost_user"], a.canaries["mattermost_channel"]
    stub.deliver(user, channel, "hello")
    home = tmp_path / "home"
    (home / ".hermes").mkdir(parents=True)
    code = f"TOKEN, URL = {a.canaries['mattermost_key']!r}, {stub.url!r}\n" + textwrap.dedent(ADAPTER)
    try:
        done = subprocess.run([str(hermes_python), "-c", code], capture_output=True, text=True, timeout=60,
                              env=hermetic_env(home, hermes_python, {}), cwd=home)
    finally:
        stub.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"ok": True, "user": user, "chat": channel, "text": "hello", "sent": True}
    assert stub.challenges == [a.canaries["mattermost_key"]]
    [post] = stub.posts_in(channel)
    assert post["message"] == "reply to hello" and post["token"] == a.canaries["mattermost_key"]
    assert bot_id("alpha") in post["id"] and not any(r.wrong_key for r in stub.snapshot())
