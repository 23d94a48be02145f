"""The roles of a tierkv deployment and the one routing rule between them.

``inference`` runs an engine hook; ``kv_cold`` vaults keep attention (and sliding-window) KV blocks;
``ssm_cold`` vaults keep the recurrent state of hybrid models (SSM, linear attention, conv). A layer group
or a stream names its kind; :func:`role_for` is the only place that turns a kind into the role storing it.
"""

from __future__ import annotations

import enum


class Role(str, enum.Enum):
    """A node's role in ``tierkv.toml``; the cold roles are what a vault serves."""

    INFERENCE = "inference"
    KV_COLD = "kv_cold"
    SSM_COLD = "ssm_cold"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: str | Role) -> Role:
        """The role named ``value``; ValueError naming the choices otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown role {value!r}; expected one of {', '.join(ROLE_NAMES)}") from None

    @property
    def cold(self) -> bool:
        """Whether vaults serve this role (``kv_cold`` / ``ssm_cold``)."""
        return self is not Role.INFERENCE


ROLE_NAMES = tuple(r.value for r in Role)
COLD_ROLES = (Role.KV_COLD, Role.SSM_COLD)
COLD_ROLE_NAMES = tuple(r.value for r in COLD_ROLES)

STATE_KINDS = frozenset({"ssm", "conv", "linear", "linear_attention", "mamba", "recurrent"})
"""Kinds of layer state (by lower-case name) that live on ``ssm_cold``; everything else is KV."""


def role_for(kind: object) -> Role:
    """The cold role storing a layer group or stream kind (an enum member, or its name)."""
    name = str(getattr(kind, "name", kind)).lower()
    return Role.SSM_COLD if name in STATE_KINDS else Role.KV_COLD


__all__ = ["COLD_ROLES", "COLD_ROLE_NAMES", "ROLE_NAMES", "STATE_KINDS", "Role", "role_for"]
