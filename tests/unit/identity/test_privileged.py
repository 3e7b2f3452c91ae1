"""Privileged identities kproxy does not impersonate unless listed (kproxy/identity/impersonate.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kproxy.core.chain import Identity
from kproxy.identity.impersonate import PrivilegedIdentity, check_privileged


@dataclass
class Allow:
    allowed_privileged_groups: tuple[str, ...] = ()
    allowed_privileged_users: tuple[str, ...] = ()


@pytest.mark.parametrize(
    ("user", "groups", "refused"),
    [
        ("alice", ("devs", "system:authenticated"), None),
        ("alice", ("system:masters", "system:authenticated"), ("groups", "system:masters")),
        ("system:node:n1", ("system:nodes",), ("users", "system:node:n1")),
        ("kubelet", ("system:nodes",), ("groups", "system:nodes")),
        ("system:kube-controller-manager", (), ("users", "system:kube-controller-manager")),
        ("system:kube-scheduler", (), ("users", "system:kube-scheduler")),
        ("system:apiserver", (), ("users", "system:apiserver")),
        (
            "system:serviceaccount:kube-system:generic-garbage-collector",
            ("system:serviceaccounts", "system:serviceaccounts:kube-system"),
            ("users", "system:serviceaccount:kube-system:generic-garbage-collector"),
        ),
        ("bob", ("system:serviceaccounts:kube-system",), ("groups", "system:serviceaccounts:kube-system")),
        ("system:serviceaccount:apps:builder", ("system:serviceaccounts", "system:serviceaccounts:apps"), None),
        # Exact names, as the authorizers compare them.
        ("alice", ("System:Masters", "system:masters-like"), None),
        ("system:nodes", ("system:node",), None),
    ],
)
def test_refused_unless_listed(user: str, groups: tuple[str, ...], refused: tuple[str, str] | None) -> None:
    identity = Identity(user=user, groups=groups)
    if refused is None:
        check_privileged(identity, Allow())
        return
    with pytest.raises(PrivilegedIdentity) as err:
        check_privileged(identity, Allow())
    assert (err.value.resource, err.value.name) == refused
    status = err.value.status()
    assert status.code == 403 and status.reason == "Forbidden"
    assert status.message.startswith(f'{refused[0]} "{refused[1]}" is forbidden: kproxy does not act as')
    listed = Allow(
        allowed_privileged_groups=(refused[1],) if refused[0] == "groups" else (),
        allowed_privileged_users=(refused[1],) if refused[0] == "users" else (),
    )
    if identity.user.startswith("system:node:"):
        listed.allowed_privileged_groups = ("system:nodes",)
    if identity.user.startswith("system:serviceaccount:kube-system:"):
        listed.allowed_privileged_groups = ("system:serviceaccounts:kube-system",)
    check_privileged(identity, listed)
