"""`detect.session_info`: a session described with another profile's model, name or working directory is a
`profile_bleed`; the profile's own, including a working directory a settings write gave it, is not."""

from __future__ import annotations

from harness.core.registry import Tenant
from harness.detect.session_info import foreign_fields


def _tenant(name: str, tag: str, **canaries: str) -> Tenant:
    return Tenant(name=name, key=f"sk-tenancy-{name}-{tag}", model=f"model-{name}-{tag}", route={},
                  canaries={"workdir": f"/w/work-{name}-{tag}", **canaries})


ALPHA = _tenant("alpha", "a1b2c3d4e5f6", workdir_set="/w/work-set-alpha-0123456789ab",
                workdir_set_2="/w/work-set-alpha-ba9876543210")
DEFAULT = _tenant("default", "f6e5d4c3b2a1")


def _info(cwd: str, model: str = ALPHA.model, name: str = "alpha") -> dict[str, str]:
    return {"model": model, "cwd": cwd, "profile_name": name}


def test_the_profiles_own_working_directories_are_its_own():
    """The near miss: after a settings phase set alpha's cwd (`workdir_set`, `workdir_set_2` in a later door of
    `--scenario all`), its sessions open there; that is alpha's own setting, not another profile's."""
    for kind in ("workdir", "workdir_set", "workdir_set_2"):
        assert foreign_fields(ALPHA, _info(ALPHA.canaries[kind])) == [], kind


def test_another_profiles_model_name_or_directory_is_foreign():
    assert foreign_fields(ALPHA, _info(DEFAULT.canaries["workdir"])) == [("cwd", DEFAULT.canaries["workdir"])]
    assert foreign_fields(ALPHA, _info(ALPHA.canaries["workdir"], DEFAULT.model, "default")) == [
        ("model", DEFAULT.model), ("profile_name", "default")]
    # another tenant's settings directory, and one of alpha's with one character changed, are not alpha's own
    other = _tenant("beta", "0f0f0f0f0f0f", workdir_set="/w/work-set-beta-0123456789ab")
    near = ALPHA.canaries["workdir_set"][:-1] + "c"
    assert foreign_fields(ALPHA, _info(other.canaries["workdir_set"])) == [("cwd", other.canaries["workdir_set"])]
    assert foreign_fields(ALPHA, _info(near)) == [("cwd", near)]
    # a canary kind that only starts like a working directory is not one
    odd = _tenant("alpha", "a1b2c3d4e5f6", workdir_settings="/w/elsewhere-0123456789")
    assert foreign_fields(odd, _info("/w/elsewhere-0123456789")) == [("cwd", "/w/elsewhere-0123456789")]
    assert foreign_fields(ALPHA, {}) == [("model", None), ("cwd", None), ("profile_name", None)]
