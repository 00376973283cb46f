"""The ntfy stub answers Hermes' own ntfy adapter (run in the Hermes venv against it): the bot subscribes to its topic
with its token (its sign-in: a long-lived NDJSON response), receives a message, publishes its reply with its token,
and a file it is asked to attach becomes Hermes' notice (ntfy takes no attachments in Hermes). A request the stub
does not know is ntfy's 404, and kept. Then, in the Hermes venv, how a multiplexed gateway loads a secondary
profile's ntfy settings (the mechanism of F55-F57): the launch profile's environment, not the profile's own."""

from __future__ import annotations

import json
import subprocess
import textwrap
import urllib.request
from pathlib import Path

from harness.core.registry import mint
from harness.drive import services
from harness.drive.hermes.agent import hermetic_env
from harness.drive.platforms.ntfy import NtfyStub, configure
from harness.drive.surface import Where


def _registry(tmp_path: Path):
    reg = mint(["default", "alpha"], tmp_path / "work", {"default": {"listen": 42000}, "alpha": {"listen": 42001}})
    services.mint(reg, ["ntfy"])
    for port, t in enumerate(reg, 42100):
        services.attach(reg, "ntfy", t.name, {"listen": port}, f"http://127.0.0.1:{port}")
    return reg


ADAPTER = """
    import asyncio, json
    from gateway.config import PlatformConfig
    from plugins.platforms.ntfy.adapter import NtfyAdapter

    async def main():
        a = NtfyAdapter(PlatformConfig(enabled=True, extra={"server": URL, "topic": TOPIC, "token": TOKEN}))
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
        doc = await a.send_document(e.source.chat_id, FILE)
        await a.disconnect()
        print(json.dumps({"ok": ok, "user": e.source.user_id, "chat": e.source.chat_id, "text": e.text,
                          "sent": sent.success, "doc": doc.success}))

    asyncio.run(main())
"""


def test_the_ntfy_stub_answers_hermes_adapter(tmp_path, hermes_python):
    a = _registry(tmp_path)["alpha"]
    stub = NtfyStub(a).start()
    topic, key = a.canaries["ntfy_topic"], a.canaries["ntfy_key"]
    stub.deliver(a.canaries["ntfy_user"], topic, "hello", "O")
    home = tmp_path / "home"
    (home / ".hermes").mkdir(parents=True)
    media = home / "report.txt"
    media.write_bytes(f"attachment {a.canaries['ntfy_file']}\n".encode())
    code = (f"URL, TOPIC, TOKEN, FILE = {stub.url!r}, {topic!r}, {key!r}, {str(media)!r}\n"
            + textwrap.dedent(ADAPTER))
    try:
        done = subprocess.run([str(hermes_python), "-c", code], capture_output=True, text=True, timeout=90,
                              env=hermetic_env(home, hermes_python, {}), cwd=home)
    finally:
        stub.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"ok": True, "user": topic, "chat": topic, "text": "hello", "sent": True, "doc": True}
    assert stub.challenges == [key] and stub.unknown == []
    reply, notice = stub.posts_in("any chat")  # every reply goes to the one publish topic
    assert reply["message"] == "reply to hello" and reply["token"] == key and reply["channel_id"] == topic
    assert "Couldn't deliver the file attachment" in notice["message"] and stub.files == []
    assert a.canaries["ntfy_file"] not in notice["message"]
    subscribe = stub.snapshot()[0]
    assert subscribe.path == f"/{topic}/json?poll=false" and not subscribe.wrong_key


def test_a_request_the_ntfy_stub_does_not_know_is_its_404_and_kept(tmp_path):
    stub = NtfyStub(_registry(tmp_path)["alpha"]).start()
    try:
        request = urllib.request.Request(stub.url + "/v1/account", method="GET")
        try:
            urllib.request.urlopen(request, timeout=10)
            raise AssertionError("answered")
        except urllib.error.HTTPError as err:
            status, answer = err.code, json.loads(err.read())
    finally:
        stub.stop()
    assert status == 404 and answer == {"code": 40401, "http": 404, "error": "page not found"}
    assert stub.unknown == ["GET /v1/account"]


def test_a_foreign_token_at_the_ntfy_stub_is_a_wrong_key(tmp_path):
    reg = _registry(tmp_path)
    stub = NtfyStub(reg["alpha"]).start()
    try:
        for key in (reg["default"].canaries["ntfy_key"], reg["alpha"].canaries["ntfy_key"]):  # the near miss last
            request = urllib.request.Request(f"{stub.url}/{reg['alpha'].canaries['ntfy_topic']}", data=b"hi",
                                             headers={"Authorization": f"Bearer {key}"}, method="POST")
            urllib.request.urlopen(request, timeout=10).read()
    finally:
        stub.stop()
    assert [r.wrong_key for r in stub.snapshot()] == [True, False]


#: In the Hermes venv: the gateway's config of a secondary profile as the multiplexed gateway loads it (under the
#: profile's runtime scope, the launch profile's `.env` in the process environment), and whether its adapter is made.
LOAD = """
    import json, os
    from pathlib import Path
    from hermes_cli.env_loader import load_hermes_dotenv
    from gateway.run import _profile_runtime_scope
    from gateway.config import load_gateway_config, Platform
    from gateway.platform_registry import platform_registry
    load_hermes_dotenv(hermes_home=Path(os.environ["HERMES_HOME"]))
    with _profile_runtime_scope(Path(os.environ["HERMES_HOME"]) / "profiles" / "alpha"):
        cfg = load_gateway_config().platforms.get(Platform("ntfy"))
        adapter = platform_registry.create_adapter("ntfy", cfg) if cfg else None
    print(json.dumps({"extra": cfg.extra if cfg else None, "enabled": bool(cfg and cfg.enabled),
                      "adapter": [adapter._server, adapter._topic, adapter._token] if adapter else None}))
"""


def _load(tmp_path: Path, hermes_python: Path, launch: dict[str, str], alpha: dict[str, str],
          alpha_yaml: str = "") -> dict:
    home = tmp_path / "home"
    hermes = home / ".hermes"
    (hermes / "profiles" / "alpha").mkdir(parents=True)
    (hermes / "config.yaml").write_text("gateway:\n  multiplex_profiles: true\n")
    (hermes / ".env").write_text("".join(f"{k}={v}\n" for k, v in launch.items()))
    (hermes / "profiles" / "alpha" / ".env").write_text("".join(f"{k}={v}\n" for k, v in alpha.items()))
    (hermes / "profiles" / "alpha" / "config.yaml").write_text(alpha_yaml)
    done = subprocess.run([str(hermes_python), "-c", textwrap.dedent(LOAD)], capture_output=True, text=True,
                          timeout=120, env=hermetic_env(home, hermes_python, {}), cwd=home)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_secondary_profiles_ntfy_settings_are_the_launch_profiles(tmp_path, hermes_python):
    """F55: alpha's own server, topic and token in its `.env` are not what its bot gets: the launch's are. Its
    adapter then holds the launch's token, so the gateway refuses it as the launch's duplicate (F55's audit)."""
    reg = _registry(tmp_path)
    d, a = (configure(t, Where(f"http://127.0.0.1:{42100 + i}")).env for i, t in enumerate(reg))
    got = _load(tmp_path, hermes_python, d, a)
    assert got["enabled"] and got["adapter"] == [d["NTFY_SERVER_URL"], d["NTFY_TOPIC"], d["NTFY_TOKEN"]]
    assert a["NTFY_TOKEN"] not in json.dumps(got)


def test_without_a_launch_token_a_secondary_subscribes_at_the_launch_server_with_its_own(tmp_path, hermes_python):
    """F56: the launch's `.env` names its server and topic, not a token (a public topic); alpha's config.yaml
    names its own server, topic and token: alpha's bot takes the launch's server and topic, and its own token,
    which it then presents at the launch's server."""
    reg = _registry(tmp_path)
    d, a = (configure(t, Where(f"http://127.0.0.1:{42100 + i}")).env for i, t in enumerate(reg))
    launch = {k: v for k, v in d.items() if k != "NTFY_TOKEN"}
    yaml = (f"platforms:\n  ntfy:\n    enabled: true\n    extra:\n      server: {a['NTFY_SERVER_URL']}\n"
            f"      topic: {a['NTFY_TOPIC']}\n      token: {a['NTFY_TOKEN']}\n")
    got = _load(tmp_path, hermes_python, launch, {}, yaml)
    assert got["adapter"] == [d["NTFY_SERVER_URL"], d["NTFY_TOPIC"], a["NTFY_TOKEN"]]


def test_a_secondary_has_no_ntfy_bot_unless_the_launch_environment_names_a_topic(tmp_path, hermes_python):
    """F57: alpha configures ntfy fully (its `.env` and its config.yaml); the launch profile does not: alpha gets
    no adapter (`check_fn` reads `NTFY_TOPIC` from the process environment only). The near miss: the same alpha
    under a launch that names a topic has one."""
    reg = _registry(tmp_path)
    d, a = (configure(t, Where(f"http://127.0.0.1:{42100 + i}")).env for i, t in enumerate(reg))
    yaml = (f"platforms:\n  ntfy:\n    enabled: true\n    extra:\n      server: {a['NTFY_SERVER_URL']}\n"
            f"      topic: {a['NTFY_TOPIC']}\n")
    got = _load(tmp_path, hermes_python, {}, a, yaml)
    assert got["enabled"] and got["extra"]["topic"] == a["NTFY_TOPIC"] and got["adapter"] is None
    near = _load(tmp_path / "near", hermes_python, {"NTFY_TOPIC": d["NTFY_TOPIC"]}, a, yaml)
    assert near["adapter"] is not None
