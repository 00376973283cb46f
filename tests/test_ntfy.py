"""The ntfy stub answers Hermes' own ntfy adapter (run in the Hermes venv against it): the bot subscribes to its topic
with its token (its sign-in: a long-lived NDJSON response), receives a message, publishes its reply with its token,
and a file it is asked to attach becomes Hermes' notice (ntfy takes no attachments in Hermes). A request the stub
does not know is ntfy's 404, and kept. Then, in the Hermes venv, how a multiplexed gateway loads a secondary
profile's ntfy settings (the mechanism of F55-F57): the launch profile's environment, not the profile's own."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from harness.drive.platforms.ntfy import NtfyStub, configure
from harness.drive.surface import Where
from tests.platform_adapters import adapter_script, media_file, registry, run

ADAPTER = adapter_script("plugins.platforms.ntfy.adapter:NtfyAdapter",
                         'extra={"server": URL, "topic": TOPIC, "token": TOKEN}')


def test_the_ntfy_stub_answers_hermes_adapter(tmp_path, hermes_python):
    a = registry(tmp_path, ["ntfy"])["alpha"]
    stub = NtfyStub(a).start()
    topic, key = a.canaries["ntfy_topic"], a.canaries["ntfy_key"]
    stub.deliver(a.canaries["ntfy_user"], topic, "hello", "O")
    home = tmp_path / "home"
    media = media_file(home, f"attachment {a.canaries['ntfy_file']}\n".encode())
    try:
        got = run(hermes_python, ADAPTER, home, {"URL": stub.url, "TOPIC": topic, "TOKEN": key, "FILE": str(media)}).out
    finally:
        stub.stop()
    assert got == {"ok": True, "user": topic, "chat": topic, "text": "hello", "sent": True, "doc": True}
    assert stub.challenges == [key] and stub.unknown == []
    reply, notice = stub.posts_in("any chat")  # every reply goes to the one publish topic
    assert reply["message"] == "reply to hello" and reply["token"] == key and reply["channel_id"] == topic
    assert "Couldn't deliver the file attachment" in notice["message"] and stub.files == []
    assert a.canaries["ntfy_file"] not in notice["message"]
    subscribe = stub.snapshot()[0]
    assert subscribe.path == f"/{topic}/json?poll=false" and not subscribe.wrong_key


def test_a_request_the_ntfy_stub_does_not_know_is_its_404_and_kept(tmp_path):
    stub = NtfyStub(registry(tmp_path, ["ntfy"])["alpha"]).start()
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
    reg = registry(tmp_path, ["ntfy"])
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
    return run(hermes_python, LOAD, home, timeout=120).out


def test_a_secondary_profiles_ntfy_settings_are_the_launch_profiles(tmp_path, hermes_python):
    """F55: alpha's own server, topic and token in its `.env` are not what its bot gets: the launch's are. Its
    adapter then holds the launch's token, so the gateway refuses it as the launch's duplicate (F55's audit)."""
    reg = registry(tmp_path, ["ntfy"])
    d, a = (configure(t, Where(t.services["ntfy"].upstream)).env for t in reg)
    got = _load(tmp_path, hermes_python, d, a)
    assert got["enabled"] and got["adapter"] == [d["NTFY_SERVER_URL"], d["NTFY_TOPIC"], d["NTFY_TOKEN"]]
    assert a["NTFY_TOKEN"] not in json.dumps(got)


def test_without_a_launch_token_a_secondary_subscribes_at_the_launch_server_with_its_own(tmp_path, hermes_python):
    """F56: the launch's `.env` names its server and topic, not a token (a public topic); alpha's config.yaml
    names its own server, topic and token: alpha's bot takes the launch's server and topic, and its own token,
    which it then presents at the launch's server."""
    reg = registry(tmp_path, ["ntfy"])
    d, a = (configure(t, Where(t.services["ntfy"].upstream)).env for t in reg)
    launch = {k: v for k, v in d.items() if k != "NTFY_TOKEN"}
    yaml = (f"platforms:\n  ntfy:\n    enabled: true\n    extra:\n      server: {a['NTFY_SERVER_URL']}\n"
            f"      topic: {a['NTFY_TOPIC']}\n      token: {a['NTFY_TOKEN']}\n")
    got = _load(tmp_path, hermes_python, launch, {}, yaml)
    assert got["adapter"] == [d["NTFY_SERVER_URL"], d["NTFY_TOPIC"], a["NTFY_TOKEN"]]


def test_a_secondary_has_no_ntfy_bot_unless_the_launch_environment_names_a_topic(tmp_path, hermes_python):
    """F57: alpha configures ntfy fully (its `.env` and its config.yaml); the launch profile does not: alpha gets
    no adapter (`check_fn` reads `NTFY_TOPIC` from the process environment only). The near miss: the same alpha
    under a launch that names a topic has one."""
    reg = registry(tmp_path, ["ntfy"])
    d, a = (configure(t, Where(t.services["ntfy"].upstream)).env for t in reg)
    yaml = (f"platforms:\n  ntfy:\n    enabled: true\n    extra:\n      server: {a['NTFY_SERVER_URL']}\n"
            f"      topic: {a['NTFY_TOPIC']}\n")
    got = _load(tmp_path, hermes_python, {}, a, yaml)
    assert got["enabled"] and got["extra"]["topic"] == a["NTFY_TOPIC"] and got["adapter"] is None
    near = _load(tmp_path / "near", hermes_python, {"NTFY_TOPIC": d["NTFY_TOPIC"]}, a, yaml)
    assert near["adapter"] is not None
