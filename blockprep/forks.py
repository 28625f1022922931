"""Fork safety: what a child process re-creates after ``os.fork``, whatever threads were doing.

A forked child has one thread, and inherits every lock in the state it was in at the fork: a lock
another thread held stays held forever. Objects holding locks register here (:func:`register`);
in the child, each one's ``_after_fork()`` runs before anything else: it makes new locks and,
where a lock was held (a step half done at the fork), forgets what its buffers hold so that its
next step rewrites them. The hook also sets torch's intra-op threads to 1 in the child: torch's
OpenMP pool does not survive a fork, and the child's first parallel operation (verify mode's
rebuilds) would wait for it forever.

Contract: ``_after_fork()`` runs in the child only, single-threaded, and must not raise.
Imports nothing from blockprep.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

import torch


class ForkSafe(Protocol):
    """An object that re-creates its locks in a forked child."""

    def _after_fork(self) -> None: ...


_OWNERS: weakref.WeakSet[ForkSafe] = weakref.WeakSet()


def register(owner: ForkSafe) -> None:
    """Have ``owner._after_fork()`` run in every child forked while ``owner`` lives."""
    _OWNERS.add(owner)


def _in_child() -> None:
    torch.set_num_threads(1)
    for owner in list(_OWNERS):
        owner._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_in_child)
