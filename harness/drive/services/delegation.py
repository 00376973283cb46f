"""The subagents' model: a `delegation:` block with its own `base_url`, `model` and
`api_key: ${TENANCY_DELEGATION_KEY}`, as a user who gives subagents a cheaper model configures it. Every tenant
but the second has one (the second's subagents use its own provider, so both shapes are driven). The stub is
the provider's kind; Hermes' own `delegate_task` (the battery's `delegate` group) drives it."""

from __future__ import annotations

from harness.capture.stubs.provider import StubProvider
from harness.core.registry import Tenant
from harness.drive.surface import Battery, Coverage, Plant, PlantContext, ServiceSpec, Setup, Where, edit_config


def configure(t: Tenant, where: Where) -> Setup:
    return Setup(config={"delegation": {"base_url": f"{where.url}/v1", "model": t.canaries["delegation_model"],
                                        "api_key": "${TENANCY_DELEGATION_KEY}"}},
                 env={"TENANCY_DELEGATION_KEY": t.canaries["delegation_key"]})


def _model(c: PlantContext) -> None:
    """The donor's model for the target's subagents (`delegation.model`): they run on the target's provider."""
    edit_config(c.target_home, lambda cfg: cfg.setdefault("delegation", {}).update(model=c.donor.model))


SERVICE = ServiceSpec(
    "delegation", "the subagents' model (a delegation block)", rank=60,
    make=lambda t, m: StubProvider(t, m, service="delegation"), credential="delegation_key",
    credential_env="TENANCY_DELEGATION_KEY", identity=("delegation_model",), but_second=True, configure=configure,
    coverage=Coverage('source_has("tools.delegate_tool", "configured_base_url")',
                      "no delegation block with a base_url of its own"),
    battery=Battery("delegate"),
    plants={"delegate-model": Plant(_model, frozenset({"wrong_model"}), through_service=False)},
)
