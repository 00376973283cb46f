"""Discord per tenant, for the gateway's Discord adapter (`plugins/platforms/discord`, discord.py 2.7.1 from Hermes'
`messaging` extra): `DISCORD_BOT_TOKEN`, `DISCORD_ALLOWED_USERS` (its user, its lead), `DISCORD_ALLOWED_ROLES` (its
role), `DISCORD_ALLOWED_CHANNELS` (its channel, its lead channel), `DISCORD_HOME_CHANNEL`, and what keeps the adapter
to the calls the stub answers (`DISCORD_COMMAND_SYNC_POLICY=off`, `DISCORD_AUTO_THREAD=false`) in each `.env`.

discord.py's hosts are fixed (`discord.com/api/v10`, `wss://gateway.discord.gg`): every tenant's bot reaches both
through the proxy's regular listener (`FixedHost`: registry services `discord` and `discord_gateway`, each
`{host: ..., by: [discord_key]}`). A REST request is the tenant's whose `Authorization: Bot` token it carries. The
gateway's upgrade carries none (discord.py asks no gateway URL before its first connection): the proxy hands it to
the first tenant's stub and claims the connection by its first message with a token, IDENTIFY, which every stub
reads too: the session is then served, and its sign-in recorded, by the stub whose tenant's token it is
(`DiscordStub.online`). READY's `resume_gateway_url` is the tenant's own host (`issued_host`): a resumed session is
the tenant's by its host. A request without a token is answered 401 in Discord's error shape, an unknown route 404
`{"message": "404: Not Found", "code": 0}`; both are kept (`ChatStub.unknown`) for the `messaging` phase to report.
docs/platforms.md says what the stub answers and sends.
"""

from __future__ import annotations

from harness.core.registry import TAG_MARKER, Tenant
from harness.drive.platforms.base import MESSAGING_EXTRA, lead, media_text
from harness.drive.platforms.discord.stub import DiscordStub, snowflake
from harness.drive.surface import (
    Battery,
    Coverage,
    FixedHost,
    Messaging,
    Plant,
    PlantContext,
    ServiceSpec,
    Setup,
    Unset,
    Where,
    set_env,
)

HOSTS = {"discord": "discord.com", "discord_gateway": "gateway.discord.gg"}
#: A file in every profile's home holding its `discord_file` canary: what its agent attaches to a reply (`MEDIA:`).
MEDIA_FILE = "tenancy-discord-media.txt"


def snowflake_canary(kind: str, tag: str) -> str:
    """A Discord id that is a canary: 19 digits, `1`, a digit of its kind, then the 48 random bits of the tenant's
    tag (`registry.new_tag`) in 17 digits: a valid snowflake (below 2**63), unique per tenant and kind."""
    return f"1{kind}{int(tag.removeprefix(TAG_MARKER), 16):017d}"


def configure(t: Tenant, where: Where) -> Setup:
    return Setup(env={"DISCORD_BOT_TOKEN": t.canaries["discord_key"],
                      "DISCORD_ALLOWED_USERS": f"{t.canaries['discord_user']},{snowflake(lead(t, 'discord_user'))}",
                      "DISCORD_ALLOWED_ROLES": snowflake(lead(t, "discord_user", "role")),
                      "DISCORD_ALLOWED_CHANNELS": f"{t.canaries['discord_channel']},"
                                                  f"{snowflake(lead(t, 'discord_user', 'leadchannel'))}",
                      "DISCORD_HOME_CHANNEL": t.canaries["discord_channel"],
                      "DISCORD_COMMAND_SYNC_POLICY": "off", "DISCORD_AUTO_THREAD": "false"},
                 files={MEDIA_FILE: media_text(t.canaries["discord_file"])})


def _token(c: PlantContext) -> None:
    """The donor's bot token in the target's `DISCORD_BOT_TOKEN`. Discord knows a bot by its token alone, and so does
    the proxy (the hosts are shared): a bot signed in with it is the donor's bot. Hermes refuses a second bot with a
    token another profile already uses, before it connects (`gateway/run.py`), so the target's bot never signs in at
    its own stub: a failed step, the run `inconclusive`, never `clean`."""
    set_env(c.target_home, "DISCORD_BOT_TOKEN", c.donor.canaries["discord_key"])


def _media(c: PlantContext) -> None:
    """The donor's `discord_file` canary in the target's own media file: the target's own attachment then carries it
    to Discord with the target's token, a `request_leak` at the service."""
    (c.target_home / MEDIA_FILE).write_bytes(media_text(c.donor.canaries["discord_file"]))


SERVICE = ServiceSpec(
    "discord", "Discord (REST and the gateway websocket at fixed hosts): a messaging platform, a bot per profile",
    rank=75, make=lambda t, m: DiscordStub(t, m), credential="discord_key", credential_env="DISCORD_BOT_TOKEN",
    identity=("discord_user", "discord_channel"), data=("discord_post", "discord_file"), passive=True,
    shapes={"discord_user": lambda tag, _: snowflake_canary("1", tag),
            "discord_channel": lambda tag, _: snowflake_canary("2", tag)},
    fixed=FixedHost(HOSTS["discord"], ("discord_key",), also=(HOSTS["discord_gateway"],)),
    configure=configure, by_default=False, doors=("gateway",),
    packages=("discord-py", "pynacl", "davey", "audioop-lts", *MESSAGING_EXTRA),  # Hermes' `messaging` extra
    messaging=Messaging("discord_user", "discord_channel", "discord_post", "discord_file", MEDIA_FILE, "discord"),
    coverage=Coverage('has("discord") and source_has("plugins.platforms.discord.adapter", "DISCORD_ALLOWED_USERS")',
                      "no Discord platform adapter, or not its SDK (Hermes' `messaging` extra: discord.py)"),
    unsettable=(Unset("allowed_users", env=("DISCORD_ALLOWED_USERS",), relaxes=frozenset({"answered", "strangers"})),
                Unset("allowed_roles", env=("DISCORD_ALLOWED_ROLES",)),
                Unset("allowed_channels", env=("DISCORD_ALLOWED_CHANNELS",),
                      relaxes=frozenset({"answered", "strangers"})),
                Unset("home_channel", env=("DISCORD_HOME_CHANNEL",), relaxes=frozenset({"home"})),
                Unset("token", env=("DISCORD_BOT_TOKEN",), relaxes=frozenset({"sign-in", "answered", "home"}))),
    battery=Battery("discord"),  # no tools: the gateway door's `messaging` phase drives it
    plants={"discord-token": Plant(_token, frozenset({"shortfall"})),
            "discord-media": Plant(_media, frozenset({"request_leak"}), alone=True)},
)
