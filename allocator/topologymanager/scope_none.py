"""Scope used with policy `none`: no hints, but Allocate still runs for every container."""

from __future__ import annotations

from collections.abc import Sequence

from .pod import Pod
from .policy_none import NonePolicy
from .scope import SCOPE_NONE, HintProvider, Scope, ScopeAdmission


class NoneScope(Scope):
    name = SCOPE_NONE

    def __init__(self, providers: Sequence[HintProvider] = ()):
        super().__init__(NonePolicy(), providers)

    def admit(self, pod: Pod) -> ScopeAdmission:
        return self._admit_policy_none(pod)
