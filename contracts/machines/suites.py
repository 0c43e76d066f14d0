"""What ``kvledger check`` runs: named suites of conformance machines, one per model kind.

A suite names the laws it checks (for the result table) and builds, for each
model kind, the Hypothesis state machine that drives the implementation and
the spec in lockstep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hypothesis.stateful import RuleBasedStateMachine

from kvledger.contracts.adapters.protocol import CacheConfig
from kvledger.contracts.adapters.reference import ReferenceAdapter
from kvledger.contracts.adapters.reference_system import ReferenceSystemAdapter
from kvledger.contracts.adapters.system import SystemConfig
from kvledger.contracts.machines.cache import RULES as CACHE_RULES
from kvledger.contracts.machines.cache import machine_for_cache
from kvledger.contracts.machines.pool import KINDS, machine_for
from kvledger.contracts.machines.system import RULES as SYSTEM_RULES
from kvledger.contracts.machines.system import machine_for_system

if TYPE_CHECKING:
    from kvledger.impl.faults import Fault


@dataclass(frozen=True)
class Suite:
    """A family of conformance machines."""

    name: str
    description: str
    rules: tuple[str, ...]
    models: dict[str, Callable[[], type[RuleBasedStateMachine]]]


POOL_RULES = (
    "inv_slots_conserved",
    "inv_single_owner",
    "refinement (abstract == spec model)",
    "free stack matches tags",
    "inv_swa_mapping",
    "data integrity",
    "rejected call leaves state unchanged",
    "inv_domain_enforced",
    "inv_dtype_blind",
    "inv_verify_exact",
    "inv_names_culprit",
    "inv_names_holder",
    "inv_names_one_operation",
    "row write commits",
    "alloc evicts before it refuses",
)


def _pool_model(kind: str) -> Callable[[], type[RuleBasedStateMachine]]:
    return lambda: machine_for(KINDS[kind])


CACHE_MODELS: dict[str, CacheConfig] = {
    "full": CacheConfig(),
    "full-paged": CacheConfig(page_size=2),
    "swa": CacheConfig(window=2),
    "mamba": CacheConfig(mamba=True),
    "hybrid": CacheConfig(window=2, mamba=True),
}
"""Model kinds of the radix-cache suite: full attention (token and paged), + SWA, + Mamba, all three."""


def _cache_model(config: CacheConfig) -> Callable[[], type[RuleBasedStateMachine]]:
    return lambda: machine_for_cache(lambda: ReferenceAdapter(config))


SYSTEM_MODELS: dict[str, tuple[int, bool]] = {"full": (1, False), "paged": (2, False), "mamba": (1, True)}
"""Model kinds of the memory-manager suite: (KV page size, Mamba pool with track buffers)."""

SYSTEM_CONFIGS: dict[str, SystemConfig] = {
    name: SystemConfig(page_size=ps, mamba=mamba) for name, (ps, mamba) in SYSTEM_MODELS.items()
}
"""The same model kinds as the ``SystemConfig`` a system adapter is built with."""

ENGINE_SYSTEM_CONFIGS: dict[str, SystemConfig] = {
    **SYSTEM_CONFIGS,
    "swa": SystemConfig(window=4, kv_tokens=96, max_context=32),
    "hybrid": SystemConfig(window=4, mamba=True),
}
"""The model kinds ``kvledger check --suite system --adapter`` offers: the reference's, and two with a sliding
window, which the reference memory manager does not model (an engine that has no window declines them, and they are
reported skipped). ``hybrid`` is full attention + SWA + Mamba at the reference's sizes; ``swa`` (full + SWA) has
twice the KV and longer rows, so that two requests sharing a prefix longer than the window run together: a release
that walks past its window's boundary harms only another holder's segment above it (on SGLang 0.5.17 a dropped SWA
receipt held 3 of 3 seeds at 48 tokens and is caught at these sizes)."""


def _system_model(config: SystemConfig) -> Callable[[], type[RuleBasedStateMachine]]:
    return lambda: machine_for_system(lambda: ReferenceSystemAdapter(config))


SUITES: dict[str, Suite] = {
    "pools": Suite(
        "pools",
        "every pool (token, paged, SWA pair, request rows, Mamba) against the ownership ledger",
        POOL_RULES,
        {kind: _pool_model(kind) for kind in KINDS},
    ),
    "cache": Suite(
        "cache",
        "the radix prefix cache (LRU lists, lock handles, match/insert/evict, Mamba copy-on-write) against the spec",
        CACHE_RULES,
        {name: _cache_model(cfg) for name, cfg in CACHE_MODELS.items()},
    ),
    "system": Suite(
        "system",
        "the memory manager: requests, admission, streaming sessions, allocation failures, the leak checker",
        SYSTEM_RULES,
        {name: _system_model(cfg) for name, cfg in SYSTEM_CONFIGS.items()},
    ),
}


def fault_targets(fault: Fault) -> list[tuple[str, str]]:
    """The (suite, model) pairs where ``fault`` can act: its ``suites``, narrowed to its ``models`` when it names any.

    ``Fault.models`` holds model names (of any of its suites) or ``"suite/model"``.
    """
    pairs = [(s, m) for s in fault.suites if s in SUITES for m in SUITES[s].models]
    if not fault.models:
        return pairs
    return [(s, m) for s, m in pairs if m in fault.models or f"{s}/{m}" in fault.models]


RULE_FAMILIES: dict[str, tuple[str, ...]] = {
    "pool conservation / single ownership": (
        "inv_slots_conserved",
        "inv_single_owner",
        "inv_owners_account",
        "inv_rows_held",
        "inv_released_on_end",
        "free stack matches tags",
        "inv_swa_mapping",
        "leak checker agrees with the ledgers",
        "rejected call leaves state unchanged",
        "foreign insert refused",
        "inv_domain_enforced",
        "inv_dtype_blind",
        "inv_names_culprit",
        "inv_names_holder",
        "inv_names_one_operation",
        "inv_refcount_nonnegative",
        "inv_refcount_counts_holders",
        "inv_free_iff_unheld",
        "inv_sentinel_fixed",
        "sentinel_count_fixed",
        "inv_counters_recount",
    ),
    "LRU detachment": (
        "inv_lru_detached",
        "inv_lru_links_symmetric",
        "inv_lru_members",
        "inv_tree_detached",
        "inv_tree_links_symmetric",
        "inv_tree_acyclic",
        "inv_tree_index",
        "inv_lru_recency",
        "evicts_lru_first",
        "evicts_enough",
        "evicts_no_more",
    ),
    "lock pairing": (
        "inv_lock_ref_counts_handles",
        "inv_lock_ref_nonnegative",
        "inv_handles_match",
        "inv_handles_owned",
        "inv_locked_cached",
        "inv_sizes",
        "inv_lock_covers_prefix",
        "inv_borrowed_under_lock",
    ),
    "data integrity": (
        "inv_content",
        "inv_mamba_content",
        "data integrity",
        "inv_verify_exact",
        "inv_index_names_carriers",
        "inv_keys_match_content",
        "extend commits",
        "extend takes what it asked",
        "row write commits",
        "inv_end_caches",
        "chunk caches its prefix",
    ),
    "sessions and admission": (
        "admission rolls back",
        "admission commits",
        "resume is append-only",
        "resume reuses the session",
        "a turn commits what it computed",
        "inv_committed_within_allocated",
        "admission is a transaction",
        "admission within budget",
        "admission admits what fits",
        "admission reuses the cache",
        "a running request moves",
        "alloc evicts before it refuses",
        "alloc evicts no more than it is short",
        "inv_waiting_blank",
    ),
    "refinement": (
        "refinement (abstract == spec model)",
        "inv_refines_prefix",
        "inv_prefix",
        "results equal the spec's",
    ),
}
"""The README's four rules (and the laws sessions, admission and refinement add) as the law names
that ``kvledger check``'s table and ``--json`` report. Every law of every suite is in exactly one family."""


def family_of(law: str) -> str | None:
    """The rule family ``law`` belongs to (``None`` for a name no suite checks, e.g. a crash)."""
    return next((family for family, laws in RULE_FAMILIES.items() if law in laws), None)
