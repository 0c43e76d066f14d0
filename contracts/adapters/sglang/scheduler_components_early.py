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
"""

from __future__ import annotations

import importlib
import inspect
from types import SimpleNamespace
from typing import Any

from kvledger.contracts.adapters.sglang.common import chunk_size
from kvledger.contracts.adapters.sglang.cpu_import import EARLY_COMPONENTS, TestedRange
from kvledger.contracts.adapters.sglang.scheduler_components import SchedulerSystemAdapter
from kvledger.contracts.adapters.sglang.unified import UnifiedAdapter
from kvledger.contracts.adapters.sglang.unified_early import EarlyUnifiedAdapter, _sglang
from kvledger.contracts.adapters.system import SystemConfig

__all__ = ["EarlyComponentsSchedulerAdapter", "early_components_factory"]


class EarlyComponentsSchedulerAdapter(SchedulerSystemAdapter):
    """SGLang 0.5.13's ``Scheduler`` (components) over its ``UnifiedRadixCache``, driven by request lifecycle."""

    TESTED: TestedRange = EARLY_COMPONENTS
    VIEW: type[UnifiedAdapter] = EarlyUnifiedAdapter
    RECEIPTS = False  # NOTE: 0.5.13's request keeps only the SWA uuid of its lock's receipt, not what it skipped

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
