"""The ``chunk_prompts_only`` licence: an engine that chunks a prompt only while it prefills it (SGLang) refuses
``chunk`` of a request that has decoded, changing nothing; without the licence a refused chunk is a finding, and
with it a refusal that changed something is one."""

from __future__ import annotations

import pytest

from kvledger.contracts.adapters.reference_system import ReferenceSystemAdapter
from kvledger.contracts.adapters.system import SYSTEM_CAPABILITIES, SYSTEM_LICENCES, StepResult
from kvledger.contracts.machines.suites import SYSTEM_CONFIGS
from kvledger.contracts.machines.system import machine_for_system
from kvledger.spec.errors import InvalidArgument


class PromptsOnly(ReferenceSystemAdapter):
    """The reference, refusing to chunk a request that has decoded (its prompt is prefilled)."""

    capabilities = SYSTEM_CAPABILITIES - (SYSTEM_LICENCES - {"chunk_prompts_only"})
    touch = False
    """Before refusing, the chunk extends the request by a token (the broken variant: a refusal that changed it)."""

    def __init__(self) -> None:
        super().__init__(SYSTEM_CONFIGS["full"])
        self.decoded: set[int] = set()
        self.refused = 0

    def extend(self, rid: int, n: int, ahead: int = 0) -> StepResult:
        result = super().extend(rid, n, ahead)
        self.decoded.add(rid)
        return result

    def chunk(self, rid: int) -> StepResult:
        if rid in self.decoded:
            if self.touch:
                super().extend(rid, 1)
            self.refused += 1
            raise InvalidArgument("chunk", f"request {rid}", (), "its prompt is prefilled: nothing to chunk")
        return super().chunk(rid)


def _chunk_after_decode(make: type[PromptsOnly]) -> object:
    state = machine_for_system(make)()
    state.add_request(prompt=0, suffix=[5, 6, 7], sid=None, budget=64)  # type: ignore[attr-defined]
    state.extend(pick=0, n=1, ahead=0)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    state.chunk(pick=0)  # type: ignore[attr-defined]
    return state


def test_the_reference_declares_no_licence() -> None:
    assert not ReferenceSystemAdapter.capabilities & SYSTEM_LICENCES
    assert "chunk_prompts_only" in SYSTEM_LICENCES <= SYSTEM_CAPABILITIES


def test_a_licensed_refusal_that_changes_nothing_holds() -> None:
    state = _chunk_after_decode(PromptsOnly)
    state.inv_all_laws()  # type: ignore[attr-defined]
    assert state.sys.refused == 1  # type: ignore[attr-defined]
    assert state.refusals == 0  # type: ignore[attr-defined]  # NOTE: no pool pressure: not what the search targets


def test_a_licensed_refusal_of_a_request_short_of_its_prompt_is_a_finding() -> None:
    """The licence covers a request whose prompt is computed; one still short of it could be chunked."""

    class Early(PromptsOnly):
        def chunk(self, rid: int) -> StepResult:
            raise InvalidArgument("chunk", f"request {rid}", (), "refused before its prompt was computed")

    state = machine_for_system(Early)()
    state.add_request(prompt=0, suffix=[5, 6, 7], sid=None, budget=64)  # type: ignore[attr-defined]
    running = [r for r in state.last.requests.values() if r.status == "running"]  # type: ignore[attr-defined]
    assert running and running[0].kv_len >= len(state.prompts[running[0].rid])  # type: ignore[attr-defined]
    state.queued[running[0].rid] = running[0].kv_len + 1  # type: ignore[attr-defined]  # as if queued one longer
    with pytest.raises(InvalidArgument, match="refused before its prompt was computed"):
        state.chunk(pick=0)  # type: ignore[attr-defined]


def test_a_licensed_refusal_that_changed_the_request_is_caught() -> None:
    class Touching(PromptsOnly):
        touch = True

    with pytest.raises(AssertionError, match=r"rejected call leaves state unchanged: chunk of request 1"):
        _chunk_after_decode(Touching)


def test_without_the_licence_a_refused_chunk_is_a_finding() -> None:
    class Unlicensed(PromptsOnly):
        capabilities = PromptsOnly.capabilities - {"chunk_prompts_only"}

    with pytest.raises(InvalidArgument, match="its prompt is prefilled"):
        _chunk_after_decode(Unlicensed)


def test_the_chunk_goes_to_a_request_short_of_its_prompt() -> None:
    """Under the licence the machine asks to chunk a running request still short of what it was queued with, where
    there is one (the others the engine would refuse); without one, any running request."""

    class Recording(PromptsOnly):
        def __init__(self) -> None:
            super().__init__()
            self.chunked: list[int] = []

        def chunk(self, rid: int) -> StepResult:
            self.chunked.append(rid)
            return super().chunk(rid)

    state = machine_for_system(Recording)()
    state.add_request(prompt=0, suffix=[5, 6, 7], sid=None, budget=64)  # type: ignore[attr-defined]
    state.add_request(prompt=1, suffix=[8], sid=None, budget=64)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    running = [r.rid for r in state.last.requests.values() if r.status == "running"]  # type: ignore[attr-defined]
    assert len(running) == 2, running
    short = running[1]
    state.queued[short] = state.last.requests[short].kv_len + 1  # type: ignore[attr-defined]  # as if queued longer
    for pick in range(3):
        state.chunk(pick=pick)  # type: ignore[attr-defined]
        state.queued[short] = state.last.requests[short].kv_len + 1  # type: ignore[attr-defined]
    assert state.sys.chunked == [short] * 3  # type: ignore[attr-defined]
