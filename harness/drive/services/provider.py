"""The tenant's LLM provider (an OpenAI-compatible stub scripted by the battery's plans): the one service every
front door needs, so it is always on (not an `--services` choice). Its profile block is every home's base
(`hermes.tenant_config`: a custom provider whose `key_env` is `TENANT_PROVIDER_KEY`); its canaries are the
tenant's `key` and `model`; every turn drives it. Its plants test the request checks: a route, model or key of
another tenant, a bypass of the proxy, an unowned host."""

from __future__ import annotations

from harness.capture.proxy import FORWARD_DOMAIN
from harness.capture.stubs.provider import StubProvider
from harness.core.registry import PROVIDER
from harness.drive.hermes.agent import PROVIDER_ID, PROVIDER_KEY_ENV
from harness.drive.surface import Battery, Coverage, Plant, PlantContext, ServiceSpec, edit_config, set_env


def _route(c: PlantContext) -> None:
    edit_config(c.target_home, lambda cfg: cfg["providers"][PROVIDER_ID].update(base_url=c.donor_route))


def _model(c: PlantContext) -> None:
    def edit(cfg: dict) -> None:
        cfg["model"]["default"] = c.donor.model
        cfg["providers"][PROVIDER_ID]["default_model"] = c.donor.model

    edit_config(c.target_home, edit)


def _key(c: PlantContext) -> None:
    set_env(c.target_home, PROVIDER_KEY_ENV, c.donor.key)


def _bypass(c: PlantContext) -> None:
    edit_config(c.target_home, lambda cfg: cfg["providers"][PROVIDER_ID].update(base_url=f"{c.target_stub}/v1"))


def _egress(c: PlantContext) -> None:
    url = f"https://unowned-{c.target.name}.{FORWARD_DOMAIN}/v1"
    edit_config(c.target_home, lambda cfg: cfg["providers"][PROVIDER_ID].update(base_url=url))


SERVICE = ServiceSpec(
    PROVIDER, "the tenant's LLM provider (OpenAI-compatible)", rank=0, make=lambda t, m: StubProvider(t, m),
    credential="key", credential_env=PROVIDER_KEY_ENV, identity=("model",), passive=True, optional=False,
    coverage=Coverage("True", ""), battery=Battery(""),
    plants={
        "route": Plant(_route, frozenset({"wrong_key", "wrong_model", "request_leak"}), through_service=False),
        "model": Plant(_model, frozenset({"wrong_model"}), through_service=False),
        "key": Plant(_key, frozenset({"wrong_key", "file_leak"}), through_service=False),
        "bypass": Plant(_bypass, frozenset({"bypass"}), through_service=False),
        "egress": Plant(_egress, frozenset({"egress"}), through_service=False),
    },
)
