"""The auxiliary models for titles and vision: the profile's `auxiliary.title_generation` and `auxiliary.vision`
(`provider: custom`, a `base_url`, a model of the tenant's own, `key_env: TENANCY_AUX_KEY`); every session's
title and the `vision_analyze` tool, asked about a picture in the tenant's terminal cwd. The stub is the
provider's kind, answering every request with the tenant's title canary."""

from __future__ import annotations

import base64
from pathlib import Path

from harness.capture.stubs.provider import StubProvider, ToolStep
from harness.core.registry import Tenant
from harness.drive.surface import Battery, Coverage, ServiceSpec, Setup, Turn, Where, credential_plant

#: A 1x1 PNG: the picture the battery asks `vision_analyze` about (the auxiliary vision model is a stub).
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5E"
                       "rkJggg==")


def image_name(tenant: str) -> str:
    return f"tenancy-{tenant}.png"


def configure(t: Tenant, where: Where) -> Setup:
    task = {"provider": "custom", "base_url": f"{where.url}/v1", "model": t.canaries["aux_model"],
            "key_env": "TENANCY_AUX_KEY"}
    return Setup(config={"auxiliary": {"title_generation": dict(task), "vision": dict(task)}},
                 env={"TENANCY_AUX_KEY": t.canaries["aux_key"]}, workdir_files={image_name(t.name): PNG})


def image_path(t: Tenant) -> str:
    """The picture `vision_analyze` is asked about, in the tenant's terminal cwd."""
    return str(Path(t.canaries["workdir"]) / image_name(t.name))


def _reads(u: Turn) -> list[ToolStep]:
    return [ToolStep("vision_analyze", {"image_url": image_path(u.tenant), "question": "What does it show?"})]


SERVICE = ServiceSpec(
    "aux", "the auxiliary models (titles, vision)", rank=50, make=lambda t, m: StubProvider(t, m, service="aux"),
    credential="aux_key", credential_env="TENANCY_AUX_KEY", identity=("aux_model",), configure=configure,
    coverage=Coverage('source_has("agent.auxiliary_client", "key_env")',
                      "no auxiliary model settings with their own endpoint and key_env"),
    battery=Battery("vision", tools=("vision_analyze",), parallel_safe=frozenset({"vision_analyze"}), reads=_reads,
                    titles=True),
    plants={"aux-key": credential_plant("aux_key", "TENANCY_AUX_KEY")},
)
