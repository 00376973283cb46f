"""The auxiliary models for titles and vision: the profile's `auxiliary.title_generation` and `auxiliary.vision`
(`provider: custom`, a `base_url`, a model of the tenant's own, `key_env: TENANCY_AUX_KEY`); every session's
title and the `vision_analyze` tool, asked about a picture in the tenant's terminal cwd. The stub is the
provider's kind, answering every request with the tenant's title canary (and what it derives from the request).

Hermes takes these settings in more than one form, and the run's second tenant is given the other ones, so that
each form's code runs with values that differ from the launch profile's: its vision model comes from the process
environment at run time (`AUXILIARY_VISION_MODEL`, which Hermes reads when `auxiliary.vision.model` is unset; every
profile's `.env` sets it to its own model), and its titles are left to the session's own runtime (no
`auxiliary.title_generation`: Hermes hands the title generator the live session's provider, model and key)."""

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


#: The variable Hermes reads the vision model from when the config names none (its run-time form).
VISION_MODEL_ENV = "AUXILIARY_VISION_MODEL"


def configure(t: Tenant, where: Where) -> Setup:
    task = {"provider": "custom", "base_url": f"{where.url}/v1", "model": t.canaries["aux_model"],
            "key_env": "TENANCY_AUX_KEY"}
    env = {"TENANCY_AUX_KEY": t.canaries["aux_key"], VISION_MODEL_ENV: t.canaries["aux_model"]}
    tasks = {"title_generation": dict(task), "vision": dict(task)}
    if where.second:  # the run-time forms: the vision model from the environment, titles on the session's runtime
        tasks = {"vision": {k: v for k, v in task.items() if k != "model"}}
    return Setup(config={"auxiliary": tasks}, env=env, workdir_files={image_name(t.name): PNG})


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
