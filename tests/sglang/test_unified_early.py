"""SGLang 0.5.11 to 0.5.13: the first ``UnifiedRadixCache`` (components on the cache).

0.5.11 and 0.5.12 ship two of the seed bugs in it, and 0.5.13 fixes both:

* B1: ``UnifiedLRUList._remove_node`` leaves a removed node's links, found by
  the general LRU-detachment law (``inv_lru_detached``);
* B5: ``MambaComponent.finalize_match_result``, when the Mamba pool is full,
  locks the matched node, evicts, and unlocks without the acquire's receipt, so
  the SWA release walks past the window to the root. The machine finds it once
  B1's laws are set aside (as an engine author who has filed B1 would): the
  copy-on-write step lowers SWA lock counts that another live lock still
  covers (``inv_lock_ref_counts_handles``), or, where no lock covers them,
  drives one below zero and SGLang's own assertion stops it (an implementation
  crash).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import Phase, settings

from kvledger.contracts.adapters.protocol import ALIASES, CacheAdapter, CacheConfig, load_factory, set_aside
from kvledger.contracts.adapters.sglang.cpu_import import (
    EARLY_UNIFIED,
    base_release,
    installed_release_or_none,
    release_tuple,
)
from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.suites import CACHE_MODELS

INSTALLED = installed_release_or_none()  # NOTE: a post release is judged as the release it patches
pytestmark = pytest.mark.skipif(
    INSTALLED is None or not EARLY_UNIFIED.contains(INSTALLED),
    reason=f"needs {EARLY_UNIFIED.describe()}; installed: {INSTALLED}",
)
register_profiles()
CI = settings.get_profile("ci")
FIND = settings(CI, phases=[Phase.explicit, Phase.generate])  # NOTE: B5 as first met, not shrunk
FIXED = INSTALLED is not None and release_tuple(INSTALLED) >= (0, 5, 13)
"""0.5.13 fixed B1 and B5 in this cache."""
LRU_LAWS = {"inv_lru_detached", "inv_lru_links_symmetric", "inv_lru_members"}
B5_VERDICT = r"inv_lock_ref_counts_handles|release_component_lock\(swa\) on node with lock_ref=0"
"""What B5's SWA over-release breaks: lock pairing, or (no live handle left to count) SGLang's own assert."""


def _make(cfg: CacheConfig, aside: frozenset[str] = frozenset()) -> CacheAdapter:
    from kvledger.contracts.adapters.sglang.unified_early import early_unified_factory

    return set_aside(early_unified_factory(cfg), aside)


def test_aliases_name_the_release_range() -> None:
    for release in ("0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16"):
        assert ALIASES[f"sglang-{release}"].endswith("unified_early:early_unified_factory")
    a = load_factory(f"sglang-{INSTALLED}")(CacheConfig(window=2, mamba=True))
    assert isinstance(a, CacheAdapter) and base_release(a.version) == INSTALLED
    assert {"locks", "lru", "mamba_cow", "content"} <= a.capabilities


@pytest.mark.skipif(not FIXED, reason="0.5.11 and 0.5.12 ship B1 and B5 (test_b1_..., test_b5_...)")
@pytest.mark.parametrize("model", list(CACHE_MODELS))
def test_fixed_release_conforms(model: str) -> None:
    from kvledger.contracts.adapters.sglang.common import check

    cfg = CACHE_MODELS[model]
    run = check(lambda: _make(cfg), CI)
    assert run.result.ok, run.result.violation and run.result.violation.message
    assert run.result.examples >= 50 and run.result.steps > 500
    assert "inv_lock_ref_counts_handles" not in run.skipped and "inv_content" not in run.skipped
    # NOTE: from 0.5.12 full attention evicts by leaves: only SWA and Mamba keep a list the laws can read
    assert ("inv_lru_detached" in run.skipped) == (cfg.window is None and not cfg.mamba)


@pytest.mark.full_shrink  # NOTE: its last step is the eviction only once the program is shrunk all the way
@pytest.mark.skipif(FIXED, reason="B1 was fixed in 0.5.13")
def test_b1_in_the_unified_lru_list_is_caught_by_lru_detachment() -> None:
    from kvledger.contracts.adapters.sglang.common import check

    run = check(lambda: _make(CACHE_MODELS["swa"]), CI)  # NOTE: from 0.5.12 full attention keeps no list
    v = run.result.violation
    assert v is not None and v.rule == "inv_lru_detached", v
    assert "nodes outside it keep links" in v.message
    assert v.steps[-1].startswith("evict("), v.steps


@pytest.mark.skipif(FIXED, reason="B5 was fixed in 0.5.13")
def test_b5_is_found_once_b1_is_set_aside() -> None:
    from kvledger.contracts.adapters.sglang.common import check

    cfg = CACHE_MODELS["hybrid"]
    run = check(lambda: _make(cfg, frozenset({"lru"})), FIND)
    v = run.result.violation
    assert v is not None, "B5 not found"
    assert set(run.skipped) >= LRU_LAWS
    # NOTE: the over-release lowers an SWA lock_ref a live handle still covers (the lock law), or one no handle
    # covers below zero, where SGLang's own assert stops the step (a crash): which one depends on the program
    assert re.search(B5_VERDICT, f"{v.rule}: {v.message}") and "swa" in v.message, v
    assert v.steps[-1].startswith(("mamba_copy_on_write(", "inc_lock_ref_cached(cow=True")), v.steps


def _b5_program(cfg: CacheConfig, aside: frozenset[str] = frozenset()) -> None:
    """The shrunk program (0.5.12's), pasted: a lock on one prompt, a second prompt fills the Mamba pool, then a
    copy-on-write of the locked match, whose evict-to-make-room unlocks without its receipt."""
    from kvledger.contracts.machines.cache import machine_for_cache

    state = machine_for_cache(lambda: _make(cfg, aside))()
    state.inv_all_laws()
    state.insert(borrow=False, prompt=1, suffix=())
    state.inv_all_laws()
    held = state.inc_lock_ref(prompt=1, suffix=())
    state.inv_all_laws()
    state.insert(borrow=False, prompt=0, suffix=())
    state.inv_all_laws()
    state.mamba_copy_on_write(held=held)
    state.inv_all_laws()


def test_b5_program_replays() -> None:
    """B1's laws set aside (B1 breaks them on the way): lock pairing broken before 0.5.13, every law holds after."""
    cfg, aside = CACHE_MODELS["hybrid"], frozenset({"lru"})
    if FIXED:
        _b5_program(cfg, aside)  # 0.5.13 gives the acquire's receipt back
    else:
        with pytest.raises(AssertionError, match=B5_VERDICT):
            _b5_program(cfg, aside)


def test_b5_needs_the_window() -> None:
    """Without SWA the same program keeps every lock law in every release: the over-release is the SWA walk's.

    (Its eviction of a Mamba state shows B1 in 0.5.11 and 0.5.12, so B1's laws are set aside here.)
    """
    _b5_program(CACHE_MODELS["mamba"], frozenset({"lru"}))


def test_observing_reads_a_cache_built_elsewhere() -> None:
    """A scheduler's cache, read through the same abstraction: what one adapter did, the other sees."""
    from kvledger.contracts.adapters.sglang.unified_early import EarlyUnifiedAdapter

    cfg = CACHE_MODELS["hybrid"]
    own = _make(cfg)
    slots = own.alloc_kv(1, 4)
    state = own.alloc_mamba(1)
    assert slots is not None and state is not None
    own.write_kv(slots, (1, 2, 3, 4), 0)
    own.insert(1, (1, 2, 3, 4), slots, state)
    seen = EarlyUnifiedAdapter.observing(own.cache, own.pools, cfg, own.kv)  # type: ignore[attr-defined]
    assert base_release(seen.version) == INSTALLED
    mine, theirs = own.snapshot(), seen.snapshot()
    assert theirs.prefix == mine.prefix and theirs.ledgers == mine.ledgers
    assert theirs.prefix.full and theirs.prefix.mamba_state
