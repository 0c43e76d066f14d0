"""B1's observable symptom: with the fault on, evicted radix nodes form reference cycles that only gc frees.

The workload is the same both ways; the count is printed (``pytest -s``) and
recorded in the docs' measured results.
"""

from __future__ import annotations

import gc
import random

import torch

from kvledger.impl import faults
from kvledger.impl.allocators import SWATokenAllocator
from kvledger.impl.radix import RadixCache
from kvledger.impl.tree import TreeNode
from kvledger.spec.types import Component, request


def cycles_after_workload(steps: int = 300, seed: int = 0) -> int:
    """Run inserts and SWA/full evictions on a hybrid-style cache; count TreeNodes only the cycle collector frees."""
    rng = random.Random(seed)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        kv = SWATokenAllocator(64, 64)
        cache = RadixCache(kv, swa_window=2)
        owner = request(1)
        for _ in range(steps):
            toks = [rng.randint(1, 3) for _ in range(rng.randint(1, 6))]
            if kv.available_size() < len(toks):
                cache.evict(Component.FULL, len(toks))
            if kv.available_size() < len(toks):
                continue
            slots = kv.alloc(len(toks), owner)
            res = cache.insert(torch.tensor(toks), slots, owner)
            if res.dup_indices.numel():
                kv.free(res.dup_indices, owner)
            if rng.random() < 0.3:
                cache.evict(Component.SWA, rng.randint(1, 4))
            if rng.random() < 0.3:
                cache.evict(Component.FULL, rng.randint(1, 8))
        gc.collect()  # the cache is alive: only nodes it dropped can be found here
        return sum(isinstance(x, TreeNode) for x in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_b1_leaves_reference_cycles_and_the_fix_leaves_none() -> None:
    clean = cycles_after_workload()
    with faults.injected("B1"):
        buggy = cycles_after_workload()
    print(f"\nTreeNodes freed only by the cycle collector: B1 off {clean}, B1 on {buggy}")
    assert clean == 0
    assert buggy > 0
