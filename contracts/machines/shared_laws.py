"""The shared-block laws (``spec.shared`` and ``spec.lru``) checked on an engine's snapshot, engine-neutral.

Any adapter whose blocks several requests may hold at once (a reference
count per block, one free queue of free and evictable blocks, a hash index)
reports a :class:`kvledger.contracts.adapters.vllm.adapter.SharedSnapshot`-shaped
object: ``pools`` (name -> :class:`~kvledger.spec.shared.SharedPool`),
``queues`` (name -> :class:`~kvledger.spec.lru.LruState`), ``counters``
(name -> (kept, recounted)) and ``problems`` the abstraction function met.
:func:`check_shared_laws` returns every broken law with a detail naming the
blocks; :func:`check_refused` is the transaction law of a refused admission.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from kvledger.spec import lru as U
from kvledger.spec import shared as S
from kvledger.spec.lru import LruState
from kvledger.spec.shared import SharedPool

__all__ = ["SHARED_RULES", "Violation", "check_refused", "check_shared_laws", "check_transition"]

Violation = tuple[str, str]
"""``(law, detail)``."""

SHARED_RULES: tuple[str, ...] = (
    "inv_refcount_nonnegative",
    "inv_refcount_counts_holders",
    "inv_free_iff_unheld",
    "inv_sentinel_fixed",
    "sentinel_count_fixed",
    "inv_index_names_carriers",
    "inv_keys_match_content",
    "inv_counters_recount",
    "inv_lru_detached",
    "inv_lru_links_symmetric",
    "admission is a transaction",
)


class SharedView(Protocol):
    """What :func:`check_shared_laws` reads."""

    @property
    def pools(self) -> Mapping[str, SharedPool]: ...
    @property
    def queues(self) -> Mapping[str, LruState]: ...
    @property
    def counters(self) -> Mapping[str, tuple[int, int]]: ...
    @property
    def problems(self) -> tuple[Violation, ...]: ...


def _pool_laws(name: str, s: SharedPool) -> list[Violation]:
    out: list[Violation] = []
    if not S.inv_refcount_nonnegative(s):
        neg = {b: c for b, c in s.counts.items() if c < 0}
        out.append(("inv_refcount_nonnegative", f"pool {name!r}: negative counts {neg}"))
    if not S.inv_refcount_counts_holders(s):
        shown = {
            b: f"count {c}, {h} holder(s) {[str(o) for o in S.holders_of(s, b)]}"
            for b, (c, h) in S.refcount_mismatches(s).items()
        }
        out.append(("inv_refcount_counts_holders", f"pool {name!r}: {shown}"))
    if not S.inv_free_iff_unheld(s):
        queued, unheld = frozenset(s.queue), S.unheld(s)
        dup = sorted({b for b in s.queue if s.queue.count(b) > 1})
        out.append(
            (
                "inv_free_iff_unheld",
                f"pool {name!r}: queued but held {sorted(queued - unheld)}, unheld but not queued "
                f"{sorted(unheld - queued)}, queued twice {dup}",
            )
        )
    if not S.inv_sentinel_fixed(s):
        out.append(("inv_sentinel_fixed", f"pool {name!r}: sentinel(s) {sorted(s.sentinels)} queued, keyed or indexed"))
    if not S.inv_index_names_carriers(s):
        out.append(("inv_index_names_carriers", f"pool {name!r}: {S.index_mismatches(s)[:4]}"))
    if not S.inv_keys_match_content(s):
        bad = sorted(b for b, k in s.keys.items() if k and b in s.content and s.content[b] not in k)
        out.append(("inv_keys_match_content", f"pool {name!r}: blocks {bad} carry keys of other content"))
    return out


def check_shared_laws(snap: SharedView) -> list[Violation]:
    """Every shared-block law broken in ``snap``, with the blocks that break it."""
    out: list[Violation] = list(snap.problems)
    for name, pool in snap.pools.items():
        out.extend(_pool_laws(name, pool))
        queue = snap.queues.get(name)
        if queue is None:
            continue
        if not U.inv_lru_detached(queue):
            stray = {n: ln for n, ln in queue.links.items() if n not in queue.order and ln != U.DETACHED}
            misplaced = {n: f"links {ln}, place gives {w}" for n, (ln, w) in U.misplaced_members(queue).items()}
            out.append(
                (
                    "inv_lru_detached",
                    f"queue {name!r}: blocks out of the queue holding links {stray}, queued blocks linked other "
                    f"than their place {misplaced}",
                )
            )
        if not U.inv_lru_links_symmetric(queue):
            out.append(("inv_lru_links_symmetric", f"queue {name!r}: links are not symmetric"))
    if not S.inv_counters_recount(snap.counters):
        off = {k: v for k, v in snap.counters.items() if v[0] != v[1]}
        out.append(("inv_counters_recount", f"(kept, recounted): {off}"))
    return out


def check_transition(before: SharedView, after: SharedView) -> list[Violation]:
    """Laws between two consecutive snapshots (a sentinel's count never moves)."""
    out: list[Violation] = []
    for name, pool in after.pools.items():
        old = before.pools.get(name)
        if old is not None and not S.sentinel_count_fixed(old, pool):
            moved = {b: (old.counts.get(b, 0), pool.counts.get(b, 0)) for b in pool.sentinels}
            out.append(("sentinel_count_fixed", f"pool {name!r}: sentinel counts moved {moved}"))
    return out


def check_refused(rid: int, before: SharedPool, after: SharedPool) -> list[Violation]:
    """A refused admission of request ``rid`` left the pool exactly as it found it."""
    if S.pool_unchanged(before, after):
        return []
    return [
        (
            "admission is a transaction",
            f"refusing request {rid} changed: {'; '.join(S.pool_differences(before, after))}",
        )
    ]
