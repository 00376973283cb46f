"""The messaging platforms of Hermes' gateway: one plug-in module per platform, each declaring one `SERVICE`
(`surface.ServiceSpec` with its `messaging` part: the stub of the platform's server, the bot's canaries, a tenant's
settings, the plants and the coverage probe). `harness.drive.services` finds them beside the other services;
the gateway door's `messaging` phase drives every one a run asks for. docs/architecture.md says how to add one.
"""
