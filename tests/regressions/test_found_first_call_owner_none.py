"""Found while judging a survivor of issue 19's mutation sample (new family, seed 46: ``_pop_ids`` comparing an owner
with the memo's tag bytes instead of its owner): a pool's memo of the last owner it saw started as ``None``, with
the free tag as that owner's code. So the first call a fresh pool got, naming
``None`` as its owner, passed for the memo's owner: an ``alloc`` handed slots to ``None`` (tagged free while held)
and a ``free`` of a free slot was accepted (the free count went past the pool). The memo now starts from a value
no caller can pass, and the pool machine makes each junk-owner call also as a fresh pool's first call
(``bad_owner``): ``kvledger check --suite pools --model mamba`` found this in 12 examples (2 steps).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvledger.contracts.machines.suites import SUITES
from kvledger.impl.allocators import PagedAllocator, TokenAllocator
from kvledger.impl.mamba import MambaPool
from kvledger.spec.errors import InvalidArgument
from kvledger.spec.types import request

FIRST_CALLS: dict[str, Callable[[], object]] = {
    "token free": lambda: TokenAllocator(8).free(torch.tensor([3]), None),  # type: ignore[arg-type]
    "token pool free": lambda: TokenAllocator(8).pool.free(torch.tensor([3]), None),  # type: ignore[arg-type]
    "token alloc": lambda: TokenAllocator(8).alloc(1, None),  # type: ignore[arg-type]
    "paged alloc": lambda: PagedAllocator(4, 2).alloc(2, None),  # type: ignore[arg-type]
    "mamba alloc": lambda: MambaPool(6, ping_pong_size=1).alloc(1, None),  # type: ignore[arg-type]
    "code_of": lambda: TokenAllocator(8).pool.code_of(None, "alloc"),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("call", list(FIRST_CALLS))
def test_a_fresh_pools_first_call_naming_owner_none_is_refused(call: str) -> None:
    with pytest.raises(InvalidArgument, match="owner must be an Owner, got None"):
        FIRST_CALLS[call]()


def test_the_pool_stays_whole() -> None:
    kv = TokenAllocator(8)
    with pytest.raises(InvalidArgument):
        kv.free(torch.tensor([3]), None)  # type: ignore[arg-type]
    assert kv.available_size() == 8
    ids = kv.alloc(2, request(1))
    assert kv.available_size() == 6 and len(set(ids.tolist())) == 2


def test_the_shrunk_program() -> None:
    """The pool machine's counterexample, as ``kvledger check`` printed it."""
    state = SUITES["pools"].models["mamba"]()()
    state.runs(run_min=512)
    chunk = state.held_at_start(owners=[request(1)], n=1)
    state.bad_owner(chunk=chunk.values[0] if hasattr(chunk, "values") else chunk, how="alloc", owner=None)
    state.teardown()
