"""What the SGLang adapter tests share: the two arms of a planted-bug test (a capability kept, or set aside)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

Licensed = Callable[[Any, str, bool], Any]
"""``licensed_machine(adapter, cap, licensed)``: the system machine on ``adapter``, its first laws checked."""


@pytest.fixture
def licensed_machine() -> Licensed:
    """The system machine on a fresh ``adapter`` with capability ``cap`` kept (``licensed``) or set aside (the
    same program must then pass every other law, so the law that ``cap`` enables is shown to catch the bug alone)."""
    from kvledger.contracts.machines.system import machine_for_system

    def make(adapter: Any, cap: str, licensed: bool) -> Any:
        assert cap in adapter.capabilities, (cap, sorted(adapter.capabilities))
        if not licensed:
            adapter.capabilities = adapter.capabilities - {cap}
        state = machine_for_system(lambda: adapter)()
        state.inv_all_laws()
        return state

    return make
