"""The messaging platforms of Hermes' gateway: one plug-in module per platform, each declaring one `SERVICE`
(`surface.ServiceSpec` with its `messaging` part: the stub of the platform's server, the bot's canaries, a tenant's
settings, the plants and the coverage probe). `harness.drive.services` finds them beside the other services;
the gateway door's `messaging` phase drives every one a run asks for. docs/architecture.md says how to add one.

Every other adapter a release ships has a row in the platform coverage too: `OUT_OF_SCOPE` says why the audit does
not drive it, each reason read in Hermes 0.19.0's code (docs/platforms.md).
"""

from __future__ import annotations

#: Why no tenant's bot can be audited there, for the gateway's port-binding platforms: a secondary profile that enables
#: one is skipped whole.
_WEBHOOK = ("a webhook platform: a multiplexed gateway lets only the launch profile bind its listener, a secondary "
            "profile that enables it is skipped whole (gateway/run.py, SecondaryPortBindingConfigError), so no tenant "
            "but the launch can have a bot there")

#: The adapters of a release that no plug-in drives, and why (the platform coverage's `out of scope: <reason>`).
OUT_OF_SCOPE: dict[str, str] = {
    "local": "not a platform: the CLI's own session",
    "api_server": "a front door of its own (--scenario api_server), not a bot",
    "webhook": "not a bot of each profile: one listener of the launch profile serves every profile's routes (a "
               "secondary profile that enables it is skipped whole); the `webhooks` phase drives it as a way in (its "
               "front-door coverage row)",
    "line": _WEBHOOK, "sms": _WEBHOOK, "whatsapp_cloud": _WEBHOOK, "bluebubbles": _WEBHOOK,
    "wecom_callback": _WEBHOOK, "msgraph_webhook": _WEBHOOK + "; it has no /p/<profile>/ route at all",
    "google_chat": "needs google-cloud-pubsub, which no Hermes 0.19.0 extra pins (plugins/platforms/google_chat/"
                   "adapter.py, _load_google_modules)",
    "photon": "its Node sidecar is not in the hermes-agent wheel (plugins/platforms/photon/adapter.py, "
              "check_requirements needs sidecar/node_modules)",
    "whatsapp": "its Node bridge is not in the hermes-agent wheel and it needs a paired WhatsApp account "
                "(plugins/platforms/whatsapp/adapter.py, connect)",
    "teams": "it binds 0.0.0.0 with no host setting, against the loopback-only rule, and checks Bot Framework tokens "
             "against keys from login.botframework.com (plugins/platforms/teams/adapter.py)",
    "raft": "it needs the Raft CLI on PATH, which no package registry ships (plugins/platforms/raft/adapter.py, "
            "check_raft_requirements)",
    "relay": "experimental: it dials a connector whose protocol Hermes says may change without notice "
             "(gateway/relay/__init__.py)",
    "matrix": "no plug-in yet: Hermes' matrix extra (mautrix with python-olm) is not in the audited venv, python-olm "
              "has no wheel here and builds from source (2 min 31 s measured); with end-to-end encryption on, a stub "
              "would have to speak Olm/Megolm",
    "dingtalk": "no plug-in yet: its replies go only to https://api.dingtalk.com or oapi.dingtalk.com and its SDK "
                "(Hermes' dingtalk extra, not in the audited venv) reads its endpoint from the process environment",
    "feishu": "no plug-in yet: fixed hosts (open.feishu.cn, open.larksuite.com) and protobuf websocket frames; its SDK "
              "(Hermes' feishu extra) is not in the audited venv",
    "qqbot": "no plug-in yet: fixed hosts (api.sgroup.qq.com, bots.qq.com) and its own gateway websocket protocol",
    "yuanbao": "no plug-in yet: protobuf websocket frames (gateway/platforms/yuanbao_proto.py)",
    "homeassistant": "no plug-in yet: Home Assistant's event websocket and notification service (no allowlist, no "
                     "attachments)",
    "simplex": "no plug-in yet: a stub of simplex-chat's websocket command API",
    "wecom": "no plug-in yet: WeCom's AI-bot websocket frames",
    "weixin": "no plug-in yet: its own long-poll API and an AES-encrypted CDN for attachments; it trusts certifi's "
              "roots only, so its stub must be plain http",
}
