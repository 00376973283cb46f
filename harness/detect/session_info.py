"""What a backend says a session's profile is (`session.create`, `session.resume`): the fields that describe
another profile than the one the session was opened for (`profile_bleed`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from harness.core.registry import Tenant

#: The kinds of a tenant's own working directories: the one it was set up with (`workdir`), and each one a settings
#: write gave it since (`workdir_set`, `workdir_set_2`, ...: a door's settings phase sets the profile's cwd, and in
#: `--scenario all` the doors after it open the profile's sessions there).
_OWN_CWD = re.compile(r"workdir(?:_set(?:_\d+)?)?")


def foreign_fields(tenant: Tenant, info: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The fields of `info` (`model`, `cwd`, `profile_name`) that are not the tenant's own, with what they said:
    its model, its name, and one of its own working directories."""
    cwds = {value for kind, value in tenant.canaries.items() if _OWN_CWD.fullmatch(kind)}
    own = {"model": {tenant.model}, "cwd": cwds, "profile_name": {tenant.name}}
    return [(name, info.get(name)) for name, values in own.items() if info.get(name) not in values]
