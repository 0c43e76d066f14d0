"""SGLang 0.5.13 to 0.5.16's real scheduler (the first ones assembled from components) behind the ``SystemAdapter``
protocol.

Factory: :func:`early_components_factory` (aliases ``sglang-0.5.13-system`` to ``sglang-0.5.16-system``;
``sglang-system`` picks it when one of them is installed). Written for 0.5.13; what 0.5.16 changes (the running
batch passed to ``get_next_batch_to_run``, ``kv_allocated_len`` moved to a ``ReqKvInfo``) the base class reads.
What runs and what is replaced is what :mod:`~kvledger.contracts.adapters.sglang.scheduler_components`
says for 0.5.23: the same component ``init_*`` methods, the same loop body, the
same fake worker and no-op hooks. This module supplies only where 0.5.13 keeps
things elsewhere:

* the cache is 0.5.13's ``UnifiedRadixCache`` (its nodes, LRU lists and locks
  on the cache itself, ``mem_cache/unified_cache_components``), read through
  the cache adapter of 0.5.11 to 0.5.13
  (:class:`~kvledger.contracts.adapters.sglang.unified_early.EarlyUnifiedAdapter`);
* server args are global (``set_global_server_args_for_scheduler``), the
  scheduler's parallel layout is a ``ParallelState`` (rank 0 of 1), and
  ``get_next_batch_to_run()`` updates the running batch itself;
* a ``Req`` keeps its KV fields itself (``req_pool_idx``, ``kv_committed_len``,
  ``kv_allocated_len``, ``cache_protected_len``, ``mamba_pool_idx``; no
  ``req.kv``);
* a streaming session's memory is a ``SessionSlot`` in the cache's embedded
  ``StreamingSession`` (``cache.session.slots``). Unlike 0.5.23, where the
  session takes its first turn's record at the row allocation and lends that
  same object to every turn, 0.5.13's first turn holds its row itself until
  it finishes (``save_from_req`` moves it to the slot), and a later turn's
  match *copies* the slot's fields into the request (``restore_to_req``; the
  slot keeps naming the row). So a session's record is the slot, or, while a
  turn that restored it waits or runs, that turn's fields: the request
  borrows the session's row (the slot names the same ``req_pool_idx``) and
  the slot's lengths catch up only when the turn ends. A turn that restored the
  slot and then ended without giving it back (aborted while waiting: the
  scheduler pops it from the queue and releases nothing) keeps a stale copy of
  the slot's ``req_pool_idx``; the slot still holds the row, so such a request
  is not read as a second holder.

A holder keeps only the SWA uuid of its lock's receipt: ``IncLockRefResult`` names the tombstones the acquire
passed over (``skip_lock_node_ids``), but the scheduler drops them (0.5.17 keeps them on the request). The adapter
keeps them itself (:class:`_Acquires`): it sees every acquire of the cache, and after each engine step gives a
holder whose lock is new the skip set of that step's acquire on its node and uuid (a session slot that takes its
request's lock over keeps the request's). Mamba's and SWA's lock counts are then replayed as from 0.5.17 on.
"""

from __future__ import annotations

import importlib
import inspect
from types import SimpleNamespace
from typing import Any

from kvledger.contracts.adapters.sglang.common import chunk_size
from kvledger.contracts.adapters.sglang.cpu_import import EARLY_COMPONENTS, TestedRange
from kvledger.contracts.adapters.sglang.scheduler_components import SchedulerSystemAdapter, _lock_node
from kvledger.contracts.adapters.sglang.unified import UnifiedAdapter
from kvledger.contracts.adapters.sglang.unified_early import EarlyUnifiedAdapter, _sglang
from kvledger.contracts.adapters.system import SystemConfig
from kvledger.spec.types import Owner

__all__ = ["EarlyComponentsSchedulerAdapter", "early_components_factory"]


LockKey = tuple[int, int | None]
"""A lock as its holder names it: the locked node's id and the SWA uuid of its receipt."""
Skips = dict[Any, frozenset[int]]
"""What an acquire passed over: component type to node ids (SGLang's ``skip_lock_node_ids``)."""


class _Acquires:
    """The skip sets of the locks the holders keep (0.5.13 to 0.5.16 drop them), kept by watching the cache."""

    def __init__(self) -> None:
        self.seen: list[tuple[LockKey, Skips]] = []
        """Every acquire since the last engine step ended, in order."""
        self.kept: dict[Owner, tuple[LockKey, Skips | None]] = {}
        """Each holder's lock and its skip set (``None``: no acquire of it was seen)."""

    def watch(self, cache: Any) -> None:
        """Record every ``inc_lock_ref`` of ``cache`` (the scheduler's, the cache's own and its session layer's)."""
        real = cache.inc_lock_ref

        def inc_lock_ref(node: Any, *args: Any, **kwargs: Any) -> Any:
            result = real(node, *args, **kwargs)
            skipped = getattr(result, "skip_lock_node_ids", None)
            if skipped is not None and hasattr(node, "id"):
                uuid = getattr(result, "swa_uuid_for_lock", None)
                self.seen.append(((node.id, uuid), {ct: frozenset(ids) for ct, ids in skipped.items()}))
            return result

        cache.inc_lock_ref = inc_lock_ref

    def settle(self, before: dict[Owner, LockKey], after: dict[Owner, LockKey]) -> None:
        """After a step: a holder whose lock is new takes the skip set of the step's last acquire of it, or of the
        holder that let that lock go in the step (a session slot taking its request's over); a holder whose lock
        did not move keeps its own; a holder that holds none is forgotten."""
        seen, self.seen = self.seen, []
        gone = {self.kept[o][0]: self.kept[o][1] for o in self.kept if after.get(o) != self.kept[o][0]}
        for owner, key in after.items():
            if before.get(owner) == key and owner in self.kept and self.kept[owner][0] == key:
                continue
            hit = _last_of(seen, key)
            self.kept[owner] = (key, hit if hit is not None else gone.get(key))
        for owner in [o for o in self.kept if o not in after]:
            del self.kept[owner]


def _last_of(seen: list[tuple[LockKey, Skips]], key: LockKey) -> Skips | None:
    """The skip set of the last acquire of lock ``key`` in ``seen`` (``None``: none)."""
    return next((skips for k, skips in reversed(seen) if k == key), None)


def _lock_key(holder: Any, node: Any) -> LockKey:
    """The lock ``holder`` keeps on ``node`` (0.5.13's nodes are objects with an ``id``), as :data:`LockKey`."""
    return (node.id, getattr(holder, "swa_uuid_for_lock", None))


class _Holder:
    """A lock's holder as the receipt readers see it: the holder's own fields, and the skip set kept for it."""

    def __init__(self, holder: Any, skips: Skips) -> None:
        self._holder = holder
        self.skip_lock_node_ids = skips

    def __getattr__(self, name: str) -> Any:
        return getattr(self._holder, name)


class EarlyComponentsSchedulerAdapter(SchedulerSystemAdapter):
    """SGLang 0.5.13's ``Scheduler`` (components) over its ``UnifiedRadixCache``, driven by request lifecycle."""

    TESTED: TestedRange = EARLY_COMPONENTS
    VIEW: type[UnifiedAdapter] = EarlyUnifiedAdapter
    RECEIPTS = True  # NOTE: replayed from the acquires the adapter watched (``_Acquires``): holders keep no skip set
    _acquires: _Acquires | None = None
    """The acquires watched; ``None`` on a cache that locks nothing (the radix cache disabled: a ``ChunkCache``)."""

    def _new_cache(self) -> Any:
        cache = super()._new_cache()
        if hasattr(cache, "inc_lock_ref") and hasattr(cache, "root_node"):
            self._acquires = _Acquires()
            self._acquires.watch(cache)
        return cache

    def _lock_keys(self) -> dict[Owner, LockKey]:
        """Each holder's lock: its node's id and its receipt's SWA uuid."""
        out: dict[Owner, LockKey] = {}
        for owner, (_, node) in self._lock_holders().items():
            out[owner] = _lock_key(super()._holder(owner), self._node(node))
        return out

    def _step(self) -> Any:
        acquires = self._acquires
        if acquires is None or "locks" not in self.capabilities:
            return super()._step()
        before = self._lock_keys()
        batch = super()._step()
        acquires.settle(before, self._lock_keys())
        return batch

    def _holder(self, owner: Owner) -> Any:
        """The holder with the skip set its acquire left; where no acquire of its lock was seen (a lock taken
        outside an engine step), the tombstones its segment has now (those it holds cannot become one)."""
        holder = super()._holder(owner)
        node = self._node(_lock_node(holder))
        acquires = self._acquires
        if acquires is None:
            return _Holder(holder, self._tombstones(node))
        key = _lock_key(holder, node)
        kept = acquires.kept.get(owner)
        if kept is None or kept[0] != key:  # NOTE: a lock taken since the last step (outside one)
            kept = acquires.kept[owner] = (key, _last_of(acquires.seen, key))
        return _Holder(holder, kept[1] if kept[1] is not None else self._tombstones(node))

    def _tombstones(self, node: Any) -> Skips:
        """The nodes from ``node`` up to the root whose SWA or Mamba value is gone (Mamba: ``node``'s own only)."""
        ct = self.sg.ComponentType
        out: dict[Any, set[int]] = {}
        mamba = node.component_data.get(ct.MAMBA)
        if mamba is not None and mamba.value is None:
            out[ct.MAMBA] = {node.id}
        root, n = self._root(), node
        while n is not None and n is not root:
            swa = n.component_data.get(ct.SWA)
            if swa is not None and swa.value is None:
                out.setdefault(ct.SWA, set()).add(n.id)
            n = n.parent
        return {c: frozenset(ids) for c, ids in out.items()}

    def _import_cache(self) -> tuple[str, SimpleNamespace]:
        return _sglang(self.TESTED)  # NOTE: the early cache adapter's import

    def _modules(self) -> SimpleNamespace:
        def mod(name: str) -> Any:
            return importlib.import_module(f"sglang.srt.{name}")

        return SimpleNamespace(
            scheduler=mod("managers.scheduler"),
            io=mod("managers.io_struct"),
            server_args=mod("server_args"),
            DisaggregationMode=mod("disaggregation.utils").DisaggregationMode,
            DPAttn=mod("managers.scheduler_components.dp_attn").SchedulerDPAttnAdapter,
            GenerationBatchResult=mod("managers.utils").GenerationBatchResult,
            SamplingParams=mod("sampling.sampling_params").SamplingParams,
            ServerArgs=mod("server_args").ServerArgs,
            SpeculativeAlgorithm=mod("speculative.spec_info").SpeculativeAlgorithm,
        )

    def _cache_extra(self) -> dict[str, Any]:
        return {}  # NOTE: no tree core before 0.5.17

    def _publish(self, args: Any) -> Any:
        # NOTE: 0.5.13's components read the global server args (pp_max_micro_batch_size, the Mamba chunk size)
        self.m.server_args.set_global_server_args_for_scheduler(args)
        return args  # NOTE: the schedule settings are the server args' own fields

    def _future_map(self, s: Any) -> Any:
        return s.spec_algorithm.create_future_map("cpu", self.pools.req_pool, needs_cpu_seq_lens=False)

    def _next_batch(self) -> Any:
        s = self.s
        if "running_batch" in inspect.signature(s.get_next_batch_to_run).parameters:
            return super()._next_batch()  # NOTE: 0.5.16 on: the running batch goes in, a plan comes out
        batch = s.get_next_batch_to_run()
        s.cur_batch = batch
        return batch


def early_components_factory(config: SystemConfig) -> EarlyComponentsSchedulerAdapter:
    """SGLang 0.5.13 to 0.5.16's real scheduler over a ``UnifiedRadixCache`` of the kind ``config`` names."""
    return EarlyComponentsSchedulerAdapter(config)


def early_chunked_factory(config: SystemConfig) -> EarlyComponentsSchedulerAdapter:
    """:func:`early_components_factory` with SGLang's chunked prefill on (``chunk_size``)."""
    return EarlyComponentsSchedulerAdapter(config, chunk_tokens=chunk_size(config))
