"""Hermes itself, as the audit runs it: the agent and its sandbox (`agent`), the JSON-RPC its one-process backends
speak (`rpc`), the releases it installs from their locks (`install`, `locks/`), what a release offers (`features`)
patched copies of an install (`patched`) and the twin, an install with a fix series applied, cached (`twin`)."""
