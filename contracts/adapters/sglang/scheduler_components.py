"""SGLang's real scheduler (0.5.17 to 0.5.23; assembled from components) behind the ``SystemAdapter`` protocol.

What differs by release is read from the installed code, not from a version table (the tree core's choice, the
process's ranks, ``get_next_batch_to_run``'s signature, where a request's KV fields live: see ``_kv``, and whether
a session's record is copied or lent: ``_records``); 0.5.13 to 0.5.16's cache and module layout come from
:mod:`~kvledger.contracts.adapters.sglang.scheduler_components_early` (``_import_cache``, ``_modules``,
``_cache_extra``, ``_publish``, ``_future_map``, ``_next_batch``).

What runs for real (SGLang's own code, on CPU):

* requests enter through ``Scheduler.handle_generate_request`` with a
  ``TokenizedGenerateReqInput`` whose ``SamplingParams`` were normalized as
  the tokenizer manager does; sessions through ``open_session`` /
  ``close_session`` (streaming sessions); aborts through ``abort_request``;
* one scheduling step is the event loop's body: ``get_next_batch_to_run``
  (``_get_new_batch_prefill_raw`` with ``PrefillAdder`` and ``SchedulePolicy``,
  ``ScheduleBatch.prepare_for_extend`` → ``alloc_for_extend``,
  ``update_running_batch`` → ``retract_decode`` / ``prepare_for_decode`` →
  ``alloc_for_decode``), ``run_batch`` and ``process_batch_result``
  (``SchedulerBatchResultProcessor``: ``check_finished``, ``release_kv_cache``,
  ``cache_finished_req`` / ``cache_unfinished_req``); with no batch, the
  scheduler's ``on_idle``;
* the components the loop reads are SGLang's own, built by the scheduler's
  own ``init_*`` methods: ``init_running_status`` (queues,
  ``SessionController``), ``init_schedule_policy``,
  ``init_pool_stats_observer``, ``init_invariant_checker``
  (``SchedulerInvariantChecker``), ``init_output_streamer``,
  ``init_batch_result_processor``, ``init_deterministic_inference_config``;
  the DP-attention adapter and ``FutureMap`` too;
* the cache is a ``UnifiedRadixCache`` (FULL, + SWA, + MAMBA) over the pools
  of :mod:`~kvledger.contracts.adapters.sglang.unified_pools`.

What is replaced: the model worker (``forward_batch_generation`` returns the
oracle's token ids: a request asked to finish gets EOS, the others a
non-EOS token; it writes each computed token's fingerprint into a stand-in
KV buffer at the slots the batch allocated), the output sender (a recorder),
the grammar manager (never queues), metrics, profiling, load publishing and
health-check hooks (no-ops; every call is counted in ``hooks``), the
tokenizer (none: token ids come in). The scheduler is built with
``object.__new__`` and the attributes its ``__init__`` would set from server
args; an ``enable_*`` / ``is_*`` / ``use_*`` flag the adapter did not set
reads as False and is logged in ``defaulted``.

Retraction uses SGLang's own test hook (``scheduler.TEST_RETRACT`` for one
iteration: the real ``retract_decode`` picks the victims). The idle check is
the scheduler's own ``on_idle`` with ``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE``
set, so ``SchedulerInvariantChecker`` raises on a leak; its verdict is what
:meth:`SchedulerSystemAdapter.idle_check` returns.

The snapshot reuses the 0.5.23 cache adapter's abstraction
(:meth:`~kvledger.contracts.adapters.sglang.unified.UnifiedAdapter.observing`):
tree holdings per node and component, free lists and size counters; what
each request holds is read from its KV fields (``req_to_token`` row
positions ``[cache_protected_len, kv_allocated_len)``, ``mamba_pool_idx``: in its ``ReqKvInfo`` from 0.5.19),
what each session holds from its record (``tree_cache.session_records()`` from 0.5.22).

The tree's locks (``locks``): its lock counts, and one handle per lock a running request or a
session's slot holds (``req.lock`` / ``slot.lock`` from 0.5.22, ``last_node`` before), covering the pages from the
root to the locked node, on a Mamba model the state at that node unless the holder's receipt says the lock
skipped it, and with a window the SWA segment up to the node the receipt's uuid stamps (``_lock_state``; 0.5.13 to
0.5.16's holders keep only the uuid, and the early adapter keeps what each acquire skipped itself).

Not expressible here (capabilities absent, laws reported skipped):
``targeted_admission`` (the policy picks from the waiting queue),
``speculative`` (no draft worker), ``chunk`` (chunked prefill is off; on in the
``-chunked`` twins, :func:`chunked_system_factory`), ``inject_failure``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import os
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from types import SimpleNamespace
from typing import Any, Protocol

import torch

from kvledger.contracts.adapters.protocol import CacheConfig, Snapshot
from kvledger.contracts.adapters.sglang.common import (
    FULL,
    MAMBA,
    SWA,
    KVBuffer,
    SchedulerError,
    chunk_size,
    chunk_steps,
    chunked_capabilities,
    lock_handle,
    not_chunked,
    one_process_run,
    reap_sessions,
    retraction_forced,
    stalled,
    step_until,
    still_prefilling,
    uncached,
)
from kvledger.contracts.adapters.sglang.cpu_import import COMPONENTS, TestedRange, base_release
from kvledger.contracts.adapters.sglang.legacy_cpp import reads_one_dump
from kvledger.contracts.adapters.sglang.scheduler import _patch_page_kernels
from kvledger.contracts.adapters.sglang.unified import UnifiedAdapter, _sglang, _tokens, new_cache
from kvledger.contracts.adapters.sglang.unified_pools import UnifiedPools
from kvledger.contracts.adapters.system import (
    EARLY_COMPONENT_RELEASES,
    IdleVerdict,
    RequestView,
    RowView,
    SessionView,
    StepResult,
    SystemConfig,
)
from kvledger.contracts.adapters.system import SystemSnapshot as SystemSnap
from kvledger.spec.ledger import Ledger
from kvledger.spec.locks import Coverage, Key, LockSite, LockState, required_coverage
from kvledger.spec.types import Component, HandleId, Owner, OwnerKind, request, session

__all__ = ["SchedulerError", "SchedulerSystemAdapter", "scheduler_system_factory"]

log = logging.getLogger(__name__)

EOS = 2
"""The token the oracle emits for a request asked to finish (the model config's ``hf_eos_token_id``)."""
STRICT = "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"


class TreeView(Protocol):
    """What the scheduler adapter reads the tree through: a cache adapter's abstraction over the scheduler's cache
    (the requests' and sessions' holdings are the scheduler adapter's own, recorded in its pools)."""

    def snapshot(self) -> Snapshot: ...

    def evict(self, component: Component, n: int) -> int: ...


class _NoOp:
    """A metrics / publishing sink: any attribute is a callable returning a falsy sink; calls are counted."""

    def __init__(self, name: str, calls: dict[str, int]) -> None:
        self._name = name
        self._calls = calls

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _NoOp(f"{self._name}.{attr}", self._calls)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._calls[self._name] = self._calls.get(self._name, 0) + 1
        return _NoOp(f"{self._name}()", self._calls)

    def __bool__(self) -> bool:
        return False

    def __enter__(self) -> _NoOp:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __add__(self, other: Any) -> Any:  # NOTE: a counter the sink never had starts from the first increment
        return other

    __radd__ = __add__


class _Flags(SimpleNamespace):
    """A namespace whose unset ``enable_*`` / ``is_*`` / ``use_*`` flags read as False (logged)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("enable_", "is_", "use_")):
            self.__dict__.setdefault("_defaulted", []).append(name)
            return False
        raise AttributeError(f"model_config.{name}")


class _NoGrammar:
    """No constrained decoding: nothing ever waits for a grammar."""

    def __init__(self) -> None:
        self.grammar_queue: list[Any] = []

    def process_req_with_grammar(self, req: Any) -> bool:
        return False

    def has_waiting_grammars(self) -> bool:
        return False

    def clear(self) -> None:
        return None

    def abort_requests(self, recv_req: Any) -> None:
        return None


class _PassThrough:
    """No n-gram embeddings: the batch goes to the forward as it is."""

    def prepare_for_forward(self, batch: Any, *, chunked_req: Any) -> Any:
        return batch


@dataclass
class _Oracle:
    """The fake model: token ids for each request, EOS for those asked to finish, KV fingerprints written."""

    kv: KVBuffer
    finishing: set[str] = field(default_factory=set)
    forwards: int = 0
    prefix: dict[str, int] = field(default_factory=dict)
    """Per request, the prefix its last prefill started from (matched in the cache or resumed from its session)."""

    def token(self, req: Any) -> int:
        if req.rid in self.finishing:
            return EOS
        return 100 + (len(req.origin_input_ids) + len(req.output_ids)) % 50


class _FakeWorker:
    """``forward_batch_generation`` without a model: the oracle's ids; KV fingerprints at ``out_cache_loc``."""

    def __init__(self, oracle: _Oracle, sg: Any) -> None:
        self.oracle = oracle
        self.sg = sg
        self.model_runner = SimpleNamespace(attn_backend=SimpleNamespace(), prefill_aware_swa=False)

    def forward_batch_generation(self, batch: Any, **kwargs: Any) -> Any:
        self.oracle.forwards += 1
        locs = [int(x) for x in batch.out_cache_loc.tolist()] if batch.out_cache_loc is not None else []
        pos = 0
        for i, r in enumerate(batch.reqs):
            seq = list(r.origin_input_ids) + list(r.output_ids)
            if batch.forward_mode.is_extend():
                start = int(batch.prefix_lens[i])
                self.oracle.prefix[r.rid] = start
                toks = seq[start : start + int(batch.extend_lens[i])]
            else:
                start = len(seq) - 1
                toks = seq[-1:]
            n = len(toks)
            self.oracle.kv.write(locs[pos : pos + n], toks, start)
            pos += n
        ids = [self.oracle.token(r) for r in batch.reqs]
        return self.sg.GenerationBatchResult(next_token_ids=torch.tensor(ids, dtype=torch.int64))


def _sched_modules() -> SimpleNamespace:
    import sglang.srt.managers.scheduler as scheduler  # type: ignore[import-not-found]
    from sglang.srt import runtime_context
    from sglang.srt.disaggregation.utils import DisaggregationMode  # type: ignore[import-not-found]
    from sglang.srt.managers import io_struct
    from sglang.srt.managers.scheduler_components.dp_attn import (  # type: ignore[import-not-found]
        SchedulerDPAttnAdapter,
    )
    from sglang.srt.managers.utils import GenerationBatchResult  # type: ignore[import-not-found]
    from sglang.srt.sampling.sampling_params import SamplingParams  # type: ignore[import-not-found]
    from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # type: ignore[import-not-found]

    return SimpleNamespace(
        scheduler=scheduler,
        rc=runtime_context,
        io=io_struct,
        DisaggregationMode=DisaggregationMode,
        DPAttn=SchedulerDPAttnAdapter,
        GenerationBatchResult=GenerationBatchResult,
        SamplingParams=SamplingParams,
        ServerArgs=ServerArgs,
        SpeculativeAlgorithm=SpeculativeAlgorithm,
    )


def _cpu_scheduler_class(base: type) -> type:
    """The real ``Scheduler`` with one addition: unset ``enable_*`` / ``is_*`` / ``use_*`` flags read False (logged)."""

    def __getattr__(self: Any, name: str) -> Any:
        if name.startswith(("enable_", "is_", "use_")):
            self.__dict__.setdefault("defaulted", []).append(name)
            return False
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (not set by the kvledger adapter)")

    return type("CPUScheduler", (base,), {"__getattr__": __getattr__, "__module__": __name__})


class SchedulerSystemAdapter:
    """SGLang's ``Scheduler`` driven by request lifecycle; observed in spec terms."""

    engine_class = "sglang.srt.managers.scheduler.Scheduler"
    TESTED: TestedRange = COMPONENTS
    VIEW: type[UnifiedAdapter] = UnifiedAdapter
    """The cache adapter whose abstraction reads this release's ``UnifiedRadixCache`` (``observing``)."""
    DISABLED = False
    """``--disable-radix-cache``: the scheduler's cache matches and caches nothing."""
    RECEIPTS = True
    """Whether what a lock's acquire skipped is known (:func:`_mamba_skipped`), so its Mamba and SWA counts can be
    replayed: the holder keeps it from 0.5.17 (``skip_lock_node_ids`` to 0.5.19, ``lock_receipt`` in 0.5.20 and
    0.5.21, ``lock.receipt`` from 0.5.22); for 0.5.13 to 0.5.16 the early adapter keeps it (its ``_holder``)."""

    def __init__(self, config: SystemConfig, chunk_tokens: int | None = None) -> None:
        if (config.window is not None or config.mamba) and config.page_size != 1:
            raise SchedulerError(
                f"SGLang scheduler adapter: {config.kind}: SWA and Mamba are wired at page size 1 only "
                "(SWATokenToKVPoolAllocator and MambaComponent without the extra buffer require it)"
            )
        os.environ[STRICT] = "1"
        self.version, self.sg = self._import()
        self.m = self._modules()
        self.config = config
        self.chunk_tokens = chunk_tokens
        """SGLang's ``chunked_prefill_size`` (``None``: chunked prefill off, every prompt prefilled in one pass)."""
        self.name = f"sglang-{self.version}/Scheduler[{config.kind}]"
        caps = {
            "sessions",
            "retract",
            "abort",
            "evict",
            "idle_check",
            "sizes",
            "rows",
            "content",
            "session_tokens",
            "prefix_cache",
            "caches_on_finish",  # NOTE: without Mamba's extra (ping-pong) buffer a finish caches its state too
            "locks",
        }
        if config.mamba:
            # NOTE: a session request that admission rejects keeps the copy-on-write Mamba slot its match took
            # (``_get_new_batch_prefill_raw`` frees it only for requests without a session) and uses it when admitted
            caps.add("reservations")
        self.capabilities = chunked_capabilities(caps, chunk_tokens)
        if self.DISABLED:
            self.capabilities = uncached(self.capabilities) - {"locks"}  # NOTE: a disabled cache locks nothing
        self.cache_config = CacheConfig(
            page_size=config.page_size,
            window=config.window,
            mamba=config.mamba,
            kv_tokens=config.kv_tokens,
            swa_tokens=config.kv_tokens,
            mamba_slots=config.mamba_slots,
        )
        self.kv = KVBuffer()
        self.pools = UnifiedPools(self.cache_config, self.sg)
        self.cache = self._new_cache()
        self.view: TreeView = self._new_view()
        self.oracle = _Oracle(self.kv)
        self.hooks: dict[str, int] = {}
        self.outputs: list[Any] = []
        self.reqs: dict[int, Any] = {}
        # NOTE: the split view of each object read (0.5.16 to 0.5.18), one per object: it keeps its object alive,
        # so an id is never reused while it is here (``self.reqs`` keeps the requests alive anyway)
        self._split: dict[int, SplitKv] = {}
        self.req_session: dict[int, int] = {}
        self.aborted: set[int] = set()
        # NOTE: a session's next turn, held (as a streaming client holds it) until the session's previous turn ends
        self.held: dict[int, tuple[tuple[int, ...], int]] = {}
        self.dropped: set[int] = set()  # NOTE: held turns aborted before they were sent
        self.hold_turns = True  # NOTE: False sends every turn at once, as a client that does not wait would
        self.next_rid = 1
        self.s = self._build()

    # ------------------------------------------------------------ building

    def _build(self) -> Any:
        m, cfg = self.m, self.config
        args = m.ServerArgs(
            model_path="dummy",
            device="cpu",
            attention_backend="torch_native",
            disable_overlap_schedule=True,
            page_size=cfg.page_size,
            pp_max_micro_batch_size=cfg.rows,
            max_running_requests=cfg.rows,
            enable_streaming_session=True,
        )
        args._mamba_cache_chunk_size = 64  # NOTE: read from the model config otherwise (ENGINES.md)
        sched = self._publish(args)
        s: Any = object.__new__(_cpu_scheduler_class(m.scheduler.Scheduler))
        noop = self._noop
        swa, mamba = cfg.window is not None, cfg.mamba
        s.__dict__.update(
            server_args=args,
            forward_ct=0,
            processed_tokens_counter=0,
            cur_batch_for_debug=None,
            is_initializing=False,
            schedule_policy=sched.schedule_policy,
            enable_priority_scheduling=sched.enable_priority_scheduling,
            abort_on_priority_when_disabled=sched.abort_on_priority_when_disabled,
            schedule_low_priority_values_first=sched.schedule_low_priority_values_first,
            priority_scheduling_preemption_threshold=sched.priority_scheduling_preemption_threshold,
            enable_lora=False,
            enable_lora_overlap_loading=False,
            max_loras_per_batch=0,
            enable_overlap=False,
            enable_overlap_mlx=False,
            enable_pdmux=False,
            skip_tokenizer_init=True,
            stream_interval=1,
            spec_algorithm=m.SpeculativeAlgorithm.from_string(None),
            page_size=cfg.page_size,
            enable_hierarchical_cache=False,
            enable_lmcache=False,
            enable_session_radix_cache=False,
            enable_hicache_storage=False,
            enable_unified_cache_external_linker=False,
            enable_decode_hicache=False,
            enable_hisparse=False,
            enable_unified_memory=False,
            attn_dp_enabled=False,
            max_recv_per_poll=100,
            max_new_tokens_limit=None,
            model_config=_Flags(
                vocab_size=1000,
                hf_eos_token_id={EOS},
                context_len=64,
                is_multimodal=False,
                is_generation=True,
                is_encoder_decoder=False,
                self_opened_think_start_ids=None,
                think_end_ids=None,
                think_end_id=None,  # NOTE: 0.5.13's name for it
            ),
            tree_cache=self.cache,
            req_to_token_pool=self.pools.req_pool,
            token_to_kv_pool_allocator=self.pools.allocator,
            is_hybrid_swa=swa,
            is_hybrid_ssm=mamba,
            sliding_window_size=cfg.window,
            full_tokens_per_layer=cfg.kv_tokens if swa else None,
            swa_tokens_per_layer=cfg.kv_tokens if swa else None,
            max_total_num_tokens=cfg.kv_tokens,
            max_prefill_tokens=64,
            max_running_requests=cfg.rows,
            max_queued_requests=None,
            max_req_len=64,
            max_req_input_len=60,
            random_seed=0,
            device="cpu",
            disable_radix_cache=self.DISABLED,
            draft_worker=None,
            decode_offload_manager=None,
            disaggregation_mode=m.DisaggregationMode.NULL,
            chunked_prefill_size=self.chunk_tokens,
            prefill_decode_interval=0,
            _prefill_decode_interval_remaining=0,
            prefill_decode_interval_min_bs=0,
            chunked_req=None,
            _pending_chunked_abort_req=None,
            is_mixed_chunk=False,
            dynamic_chunk_sizer=None,
            metrics_collector=noop("metrics_collector"),
            metrics_reporter=noop("metrics_reporter"),
            scheduler_stage_metrics=noop("scheduler_stage_metrics"),
            kv_events_publisher=noop("kv_events_publisher"),
            load_publisher=noop("load_publisher"),
            load_inquirer=noop("load_inquirer"),
            profiler_manager=noop("profiler_manager"),
            dllm_manager=noop("dllm_manager"),
            hisparse_coordinator=None,
            rust_server=None,
            dllm_config=None,
            is_generation=True,
            scripted_scheduler_hook=None,
            ipc_channels=SimpleNamespace(
                send_to_detokenizer=SimpleNamespace(
                    send_output=lambda *a, **k: self.outputs.append(a), send_pyobj=self.outputs.append
                ),
                send_to_tokenizer=SimpleNamespace(
                    send_output=lambda *a, **k: self.outputs.append(a), send_pyobj=self.outputs.append
                ),
            ),
            grammar_manager=_NoGrammar(),
            tokenizer=None,
            pad_input_ids_func=None,
            transfer_backend=None,
            disagg_metadata_buffers=None,
            _sched_idled=False,
            disagg_decode_prealloc_queue=None,
            disagg_decode_transfer_queue=None,
            disagg_prefill_bootstrap_queue=None,
            disagg_prefill_inflight_queue=None,
            req_to_metadata_buffer_idx_allocator=None,
            require_mlp_sync=False,
            enable_fpm=False,
            forward_stream=None,
            forward_stream_ctx=None,
            schedule_stream=None,
            load_snapshot_writer=None,
            lora_drainer=None,
            min_free_slots_delayer=None,
            mm_receiver=None,
            ngram_embedding_manager=_PassThrough(),
            pp_group=None,
            device_module=torch.get_device_module("cpu"),
            _confidence_budget_prepare=None,
            **self._release_attrs(),
        )
        worker = _FakeWorker(self.oracle, self.m)
        s.tp_worker = s.model_worker = worker
        s.future_map = self._future_map(s)
        # NOTE: metrics, load-publishing and health-check hooks of the scheduler itself: no-ops, counted.
        for hook in ("_record_step_counters", "maybe_send_health_check_signal", "maybe_sleep_on_idle"):
            setattr(s, hook, noop(hook))
        s.publish_load_snapshot = noop("publish_load_snapshot")
        for init in (
            "init_running_status",
            "init_schedule_policy",
            "init_pool_stats_observer",
            "init_invariant_checker",
            "init_output_streamer",
            "init_batch_result_processor",
            "init_deterministic_inference_config",
        ):
            getattr(s, init)()
        self._attach(s, worker)
        return s

    # ------------------------------------------------------------ the cache (what differs by tree)

    def _new_cache(self) -> Any:
        """The scheduler's ``tree_cache``: a ``UnifiedRadixCache`` of the config's components on :attr:`pools`
        (it embeds its streaming-session layer)."""
        cfg = self.config
        ct = self.sg.ComponentType
        comps = (ct.FULL, *([ct.SWA] if cfg.window is not None else []), *([ct.MAMBA] if cfg.mamba else []))
        return new_cache(
            self.sg,
            disable=self.DISABLED,
            req_to_token_pool=self.pools.req_pool,
            token_to_kv_pool_allocator=self.pools.allocator,
            page_size=cfg.page_size,
            sliding_window_size=cfg.window,
            tree_components=comps,
            **self._cache_extra(),
        )

    def _new_view(self) -> TreeView:
        """The cache adapter's abstraction over :attr:`cache` (its ``snapshot`` and ``evict``)."""
        return self.VIEW.observing(self.cache, self.pools, self.cache_config, self.kv, self.TESTED)

    @property
    def _session_layer(self) -> Any:
        """The streaming-session layer (its ``slots`` by session name): embedded in the cache (``cache.session``)."""
        return self.cache.session

    def _protected(self, rid: int | None, kv: Any) -> int:
        """How many leading slots of the row ``kv`` names the tree holds (the rest is the request's or session's own:
        ``rid``'s, or a session record's where ``rid`` is None): ``cache_protected_len``, which SGLang's Python trees
        keep."""
        return int(kv.cache_protected_len)

    # ------------------------------------------------------------ what differs by release (0.5.23 here)

    def _import(self) -> tuple[str, SimpleNamespace]:
        """Import the memory manager of a release in :attr:`TESTED` (:meth:`_import_cache`) and ready it for one
        process on CPU."""
        got = self._import_cache()
        cpu_page_kernels()
        one_process_run()
        return got

    def _import_cache(self) -> tuple[str, SimpleNamespace]:
        """The cache adapter's import of the memory manager."""
        return _sglang(self.TESTED)

    def _modules(self) -> SimpleNamespace:
        return _sched_modules()

    def _cache_extra(self) -> dict[str, Any]:
        """``CacheInitParams`` this release needs beyond the components and pools."""
        return {"tree_core_backend": "python"}

    def _publish(self, args: Any) -> Any:
        """Publish the server args where the release's components read them; the schedule settings."""
        m = self.m
        # NOTE: 0.5.21 on name the process's ranks; one process, rank 0 (before, ``publish`` takes no ranks)
        ranks = {"ranks": m.rc.SpawnRanks(world_rank=0)} if self._ranked() else {}
        m.rc.publish(args, role="scheduler", **ranks)
        return m.rc.get_schedule()

    def _ranked(self) -> bool:
        """Whether this release's runtime context names the process's ranks (0.5.21 on)."""
        return hasattr(getattr(self.m, "rc", None), "SpawnRanks")

    def _release_attrs(self) -> dict[str, Any]:
        """Scheduler attributes only this release's loop reads: before 0.5.21 (no ranks in the runtime context) the
        process's ``ParallelState``, its tensor-parallel group (none: one process) and the weight updater's offload
        tags (read by ``init_dp_attn_adapter``)."""
        if self._ranked():
            return {}
        state = importlib.import_module("sglang.srt.distributed.parallel_state_wrapper").ParallelState
        return {"ps": one_process(state), "tp_group": None, "weight_updater": SimpleNamespace(offload_tags=set())}

    def _future_map(self, s: Any) -> Any:
        """The scheduler's ``FutureMap`` (the components read it; it relays decode input ids)."""
        return s.spec_algorithm.create_future_map(
            "cpu", self.pools.req_pool, needs_cpu_seq_lens=False, needs_confidence_relay=False
        )

    def _attach(self, s: Any, worker: _FakeWorker) -> None:
        """What the scheduler's ``__init__`` builds after its components: the DP-attention adapter (before 0.5.21
        SGLang's own ``init_dp_attn_adapter``, rank 0 of 1: no tensor-parallel group)."""
        if not self._ranked():
            s.init_dp_attn_adapter()
            return
        s.dp_attn_adapter = self.m.DPAttn(
            model_runner=worker.model_runner,
            req_to_token_pool=self.pools.req_pool,
            token_to_kv_pool_allocator=self.pools.allocator,
            tree_cache=self.cache,
            offload_tags=set(),
            model_config=s.model_config,
            enable_overlap=False,
            spec_algorithm=s.spec_algorithm,
            get_require_mlp_sync=lambda: False,
        )

    def _next_batch(self) -> Any:
        """The loop's ``get_next_batch_to_run``: the batch to run (the running batch updated on the scheduler)."""
        s = self.s
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        return plan.batch_to_run

    def _kv(self, req: Any) -> Any:
        """Where a request (or a session's slot) keeps its KV fields (``req_pool_idx``, lengths,
        ``mamba_pool_idx``), as one object with those fields, the same object each time.

        By release: on the ``Req`` itself (to 0.5.15); on the ``Req`` but for ``kv_allocated_len`` (and SWA's
        evicted length), which a ``ReqKvInfo`` at ``req.kv`` holds (0.5.16 to 0.5.18: read through
        :class:`SplitKv`); all in ``req.kv`` (0.5.19 on)."""
        kv = getattr(req, "kv", None)
        if not self._kv_split:
            return req if kv is None else kv
        got = self._split.get(id(req))
        if got is None:
            got = self._split[id(req)] = SplitKv(req)
        return got

    @functools.cached_property
    def _kv_split(self) -> bool:
        """Whether this release's ``ReqKvInfo`` holds only some of a request's KV fields (0.5.16 to 0.5.18)."""
        info = getattr(importlib.import_module("sglang.srt.managers.schedule_batch"), "ReqKvInfo", None)
        fields = {f.name for f in dataclasses.fields(info)} if info is not None else set()
        return bool(fields) and "req_pool_idx" not in fields

    @functools.cached_property
    def _copied_sessions(self) -> bool:
        """Whether a session's slot keeps its own copy of the KV fields, copied to and from its turn (to 0.5.18),
        rather than one ``ReqKvInfo`` lent to the turn (0.5.19 on)."""
        slot = importlib.import_module("sglang.srt.session.streaming_session").SessionSlot
        return "req_pool_idx" in {f.name for f in dataclasses.fields(slot)}

    def _records(self) -> dict[int, Any]:
        """Each session's KV record by session id: the ``ReqKvInfo`` the session owns (lent to its running turn);
        to 0.5.18 the session's slot, or the turn it was copied to while that turn holds its row."""
        if self._copied_sessions:
            return self._copied_records()
        records = getattr(self.cache, "session_records", None)
        if records is None:  # NOTE: before 0.5.22 the cache has no such query: its session's slots hold the records
            return {int(sid): slot.kv for sid, slot in self._session_layer.slots.items()}
        return {int(sid): kv for sid, kv in records().items()}

    def _copied_records(self) -> dict[int, Any]:
        records: dict[int, Any] = {}
        for sid_name, slot in self._session_layer.slots.items():
            sid = int(sid_name)
            borrower = None
            if slot.req_pool_idx is not None:
                borrower = next(
                    (
                        req
                        for rid, req in self.reqs.items()
                        if self.req_session.get(rid) == sid
                        and req.req_pool_idx == slot.req_pool_idx
                        and self._status(rid) in ("waiting", "running")
                    ),
                    None,
                )
            records[sid] = self._kv(slot if borrower is None else borrower)
        return records

    def _noop(self, name: str) -> _NoOp:
        return _NoOp(name, self.hooks)

    @property
    def defaulted(self) -> list[str]:
        """The ``enable_*`` / ``is_*`` / ``use_*`` flags SGLang read that the adapter did not set (read as False)."""
        return sorted(set(self.s.__dict__.get("defaulted", []) + self.s.model_config.__dict__.get("_defaulted", [])))

    # ------------------------------------------------------------ the loop

    def _step(self) -> Any:
        """One iteration of ``event_loop_normal``'s body (without receiving): the batch it ran, or None (idle)."""
        s = self.s
        batch = self._next_batch()
        s.cur_batch_for_debug = batch
        if batch:
            result = s.run_batch(batch)
            s.process_batch_result(batch, result)
        s.last_batch = batch
        self._send_held()
        return batch

    def _in_flight(self, sid: int) -> bool:
        return any(
            self.req_session.get(r) == sid and r in self.reqs and self._status(r) in ("waiting", "running")
            for r in self.req_session
        )

    def _send_held(self) -> None:
        """Send each held turn whose session has no turn in flight any more (oldest first)."""
        for rid in sorted(self.held):
            tokens, sid = self.held[rid]
            if not self._in_flight(sid):
                del self.held[rid]
                self._send(rid, tokens, sid)

    def _statuses(self) -> dict[int, str]:
        return {rid: self._status(rid) for rid in [*self.reqs, *self.held, *self.dropped]}

    def _result(self, before: dict[int, str]) -> StepResult:
        after = self._statuses()
        moved = [(r, before.get(r, "waiting"), a) for r, a in after.items() if before.get(r, "waiting") != a]
        return StepResult(
            admitted=tuple(r for r, b, a in moved if b == "waiting" and a == "running"),
            rejected=tuple(r for r, a in after.items() if a == "waiting" and before.get(r, "waiting") == "waiting"),
            finished=tuple(r for r, b, a in moved if a in ("finished", "aborted")),
            retracted=tuple(r for r, b, a in moved if b == "running" and a == "waiting"),
        )

    def _status(self, rid: int) -> str:
        if rid in self.held:
            return "waiting"
        if rid in self.dropped:
            return "aborted"
        req = self.reqs[rid]
        s = self.s
        if req.finished():
            # NOTE: a finished request still in the last batch is live until SGLang releases its row; once released,
            # its kv names only what it handed to the tree (stale fields, not holds)
            live = _holds(self._kv(req)) and any(req is r for r in self._batch_reqs())
            if not live:
                return "aborted" if type(req.finished_reason).__name__ == "FINISH_ABORT" else "finished"
        if any(req is r for r in s.waiting_queue):
            return "waiting"
        if any(req is r for r in self._batch_reqs()):
            return "running"
        aborted = type(req.finished_reason).__name__ == "FINISH_ABORT" or rid in self.aborted
        return "aborted" if aborted else "finished"

    def _batch_reqs(self) -> list[Any]:
        s = self.s
        out = list(s.running_batch.reqs)
        if s.last_batch is not None:
            out += [r for r in s.last_batch.reqs if not any(r is x for x in out)]
        return out

    # ------------------------------------------------------------ protocol

    def add_request(self, tokens: tuple[int, ...], session: int | None = None) -> int:
        """A request arrives through ``handle_generate_request``; returns its rid.

        A streaming session takes one turn at a time: like a streaming client, the adapter sends
        a session's next turn once its previous turn has ended; until then the turn waits outside
        the engine, holding nothing. (Sent at once, SGLang marks it for abort and can then fail its
        own assertion: see tests/sglang/test_scheduler_components.py.)
        """
        rid = self.next_rid
        self.next_rid += 1
        if session is not None:
            self.req_session[rid] = session
            if self.hold_turns and self._in_flight(session):
                self.held[rid] = (tuple(tokens), session)
                return rid
        self._send(rid, tuple(tokens), session)
        return rid

    def _send(self, rid: int, tokens: tuple[int, ...], session: int | None) -> None:
        m = self.m
        # NOTE: the adder reserves room for each running request's remaining max_new_tokens (times the new-token
        # ratio): the row length keeps that reservation at the scale of the tiny pools.
        sp = m.SamplingParams(max_new_tokens=self.config.max_context)
        sp.normalize(None)
        extra: dict[str, Any] = {}
        if session is not None:
            extra["session_params"] = m.io.SessionParams(id=str(session))
        recv = m.io.TokenizedGenerateReqInput(
            rid=_rid(rid),
            input_text=None,
            input_ids=array("q", tokens),
            input_embeds=None,
            mm_inputs=None,
            token_type_ids=None,
            sampling_params=sp,
            return_logprob=False,
            logprob_start_len=-1,
            top_logprobs_num=0,
            token_ids_logprob=None,
            stream=False,
            **extra,
        )
        self.s.handle_generate_request(recv)
        req = next((r for r in self.s.waiting_queue if r.rid == _rid(rid)), None)
        if req is None:
            raise SchedulerError(f"add_request: SGLang did not queue request {rid} ({self.outputs[-1:]})")
        self.reqs[rid] = req

    def admit(self, budget: int, rid: int | None = None) -> StepResult:
        before = self._statuses()
        self.s.max_prefill_tokens = budget
        try:
            self._step()
        finally:
            self.s.max_prefill_tokens = 64
        return self._result(before)

    def _mid_prefill(self, rid: int) -> bool:
        """Request ``rid`` is SGLang's chunked request: admitted, with chunks of its prompt still to prefill."""
        req = self.reqs.get(rid)
        return req is not None and getattr(self.s, "chunked_req", None) is req

    def _chunk_steps(self) -> int:
        """``chunk_steps`` for every live request sent to the engine."""
        live = [q for rid, q in self.reqs.items() if self._status(rid) in ("waiting", "running")]
        todo = (len(q.origin_input_ids) + len(q.output_ids) - int(self._kv(q).kv_committed_len) for q in live)
        return chunk_steps(self.chunk_tokens, todo)

    def _decode_until(self, rid: int, done: Any, what: str, decoding_moves: bool = True) -> StepResult:
        """Engine steps until ``done()`` or request ``rid`` stops running; the steps in which it does not move (decode,
        where ``decoding_moves``) are bounded by the prefills the scheduler may run first (one per waiting request,
        in the engine's queue or a session's turn the adapter holds back and sends once its previous turn ends, one
        per chunk still to prefill, and three more), past which a request still running is a finding (``a running
        request moves``, :func:`~kvledger.contracts.adapters.sglang.common.stalled`). A finish
        passes ``decoding_moves=False``: a request that decodes on past its EOS is not moving towards its end."""
        before = self._statuses()
        req = self.reqs[rid]
        # NOTE: a request the engine retracted or ended on the way is a step's outcome, not a refusal

        def slack() -> int:
            return 3 + len(self.s.waiting_queue) + len(self.held) + self._chunk_steps()

        if not step_until(
            self._step,
            lambda: done() or self._status(rid) != "running",
            lambda: len(req.output_ids) if decoding_moves else 0,
            slack,
        ):
            raise stalled(what, rid, slack())
        return self._result(before)

    def extend(self, rid: int, n: int, ahead: int = 0) -> StepResult:
        req = self.reqs[rid]
        if self._mid_prefill(rid):
            raise still_prefilling(rid, n, int(self._kv(req).kv_committed_len), len(req.origin_input_ids))
        results = []
        for _ in range(n):
            if self._status(rid) != "running":
                break
            target = len(req.output_ids) + 1
            results.append(
                self._decode_until(rid, lambda t=target: len(req.output_ids) >= t or req.finished(), "extend")
            )
        return _merge(results)

    def finish(self, rid: int) -> StepResult:
        req = self.reqs[rid]
        self.oracle.finishing.add(req.rid)
        try:
            return self._decode_until(rid, lambda: self._status(rid) != "running", "finish", decoding_moves=False)
        finally:
            self.oracle.finishing.discard(req.rid)

    def chunk(self, rid: int) -> StepResult:
        """The scheduler's next step while request ``rid`` is chunked: it caches the chunk before
        (``stash_chunked_request``) and prefills the next; a request not being chunked is refused
        (``chunk_prompts_only``: SGLang chunks a prompt only while it prefills it)."""
        if self.chunk_tokens is None:
            raise SchedulerError(f"chunk of request {rid}: chunked prefill is off in this adapter")
        if not self._mid_prefill(rid):
            raise not_chunked(rid, self._status(rid))
        before = self._statuses()
        self._step()
        return self._result(before)

    def retract(self, rid: int) -> StepResult:
        before = self._statuses()
        with retraction_forced(self.m.scheduler):
            self._step()
        return self._result(before)

    def abort(self, rid: int) -> StepResult:
        before = self._statuses()
        if rid in self.held:
            del self.held[rid]  # NOTE: never sent: the client drops it
            self.dropped.add(rid)
            return self._result(before)
        self.aborted.add(rid)  # NOTE: a request aborted while waiting leaves the queue without a finish reason
        self.s.abort_request(self.m.io.AbortReq(rid=_rid(rid)))
        for _ in range(3):  # NOTE: a running request is finished by the steps after the abort, as in the loop
            if self._status(rid) != "running":
                break
            self._step()
        return self._result(before)

    def open_session(self, sid: int) -> None:
        out = self.s.open_session(
            self.m.io.OpenSessionReqInput(capacity_of_str_len=1024, session_id=str(sid), streaming=True)
        )
        if out is None or not out.success:
            raise SchedulerError(f"open_session {sid}: SGLang refused it")

    def close_session(self, sid: int) -> None:
        self.s.close_session(self.m.io.CloseSessionReqInput(session_id=str(sid)))
        self._reap()

    def _reap(self) -> None:
        reap_sessions(self.s.session_controller)

    def evict(self, component: Component, n: int) -> int:
        comps = {FULL, *([SWA] if self.config.window is not None else []), *([MAMBA] if self.config.mamba else [])}
        if component not in comps:
            return 0
        return self.view.evict(component, n)

    def inject_failure(self) -> None:
        raise SchedulerError("inject_failure: not expressible through SGLang's scheduler")

    def idle_check(self) -> IdleVerdict | None:
        s = self.s
        if not s.is_fully_idle() and self._only_ended_work():
            self._step()  # NOTE: the loop's next iteration: it drops the ended requests and finds nothing to run
        if not s.is_fully_idle():
            return None
        try:
            s.on_idle()
        except (AssertionError, ValueError, RuntimeError) as err:
            return IdleVerdict(False, None, str(err))
        return IdleVerdict(True, None, "")

    def _only_ended_work(self) -> bool:
        """Nothing waits and every request still in a batch has ended and given its row back."""
        s = self.s
        if s.waiting_queue or getattr(s, "chunked_req", None) is not None:
            return False
        return all(r.finished() and not _holds(self._kv(r)) for r in self._batch_reqs())

    # ------------------------------------------------------------ abstraction

    def _live(self, records: dict[int, Any]) -> dict[int, Any]:
        """The KV record of each request that holds a row of its own (a session's record is the session's)."""
        named = {id(kv) for kv in records.values()}
        kvs = {rid: self._kv(req) for rid, req in self.reqs.items()}
        live = {rid: kv for rid, kv in kvs.items() if _holds(kv) and id(kv) not in named}
        if not self._copied_sessions:
            return live
        slots = self._session_layer.slots

        def stale_copy(rid: int, kv: Any) -> bool:
            """An ended turn's copy of its session's row (the slot holds the row now)."""
            sid = self.req_session.get(rid)
            slot = None if sid is None else slots.get(str(sid))
            ended = self._status(rid) not in ("waiting", "running")
            return ended and slot is not None and slot.req_pool_idx == kv.req_pool_idx

        return {rid: kv for rid, kv in live.items() if not stale_copy(rid, kv)}

    def _row(self, kv: Any) -> list[int]:
        row = self.pools.req_pool.req_to_token[kv.req_pool_idx]
        return [int(x) for x in row[: kv.kv_allocated_len].tolist()]

    def _units(self, slots: Iterable[int]) -> set[int]:
        ps = self.config.page_size
        return {x // ps for x in slots} if ps > 1 else set(slots)

    def _mamba(self, kv: Any) -> set[int]:
        if kv.mamba_pool_idx is None:
            return set()
        return {int(x) for x in kv.mamba_pool_idx.reshape(-1).tolist()}

    @reads_one_dump
    def snapshot(self) -> SystemSnap:
        records = self._records()
        live = self._live(records)
        opened = [int(sid) for sid in self.s.session_controller.sessions]
        pools = self.pools
        pools.req_kv = {rid: set(self._row(kv)[self._protected(rid, kv) :]) for rid, kv in live.items()}
        lent_records = {id(kv) for kv in records.values()}  # NOTE: a session's record, lent to its running turn
        pools.req_mamba = {
            rid: self._mamba(kv)
            for rid, kv in ((rid, self._kv(req)) for rid, req in self.reqs.items())
            if self._mamba(kv) and id(kv) not in lent_records and self._status(rid) in ("waiting", "running")
        }  # NOTE: an ended request's kv keeps naming the state it handed to the tree (a stale field, not a hold)
        held = self._lock_holders() if "locks" in self.capabilities else {}
        self._prime_locks(held)
        tree = self.view.snapshot()
        handles = {o: int(hid) for o, (hid, _) in held.items()}
        ledgers = dict(tree.ledgers)
        sess_kv = {
            session(sid): self._units(self._row(kv)[self._protected(None, kv) :])
            for sid, kv in records.items()
            if _holds(kv)
        }
        sess_mamba = {session(sid): self._mamba(kv) for sid, kv in records.items()}
        ledgers["kv"] = _with(ledgers["kv"], sess_kv)
        if "mamba" in ledgers:
            ledgers["mamba"] = _with(ledgers["mamba"], sess_mamba)
        if "swa" in ledgers:
            ledgers["swa"] = _with(ledgers["swa"], {o: pools.swa_of(xs) for o, xs in sess_kv.items()})
        rows_pool = pools.req_pool
        row_holders: dict[Owner, set[int]] = {request(rid): {int(kv.req_pool_idx)} for rid, kv in live.items()}
        row_holders.update({session(sid): {int(kv.req_pool_idx)} for sid, kv in records.items() if _holds(kv)})
        free_rows = [int(x) for x in rows_pool.free_slots]
        ledgers["req_to_token"] = Ledger(
            "req_to_token",
            rows_pool.size,
            frozenset(free_rows),
            {o: frozenset(xs) for o, xs in row_holders.items()},
            int(rows_pool.req_to_token.shape[0]) - int(rows_pool.size),  # NOTE: row 0 is padding in 0.5.23
        )
        references = {name: dict(lg.held) for name, lg in ledgers.items()}
        rows: dict[int, RowView] = {}
        for rid, kv in live.items():
            rows[int(kv.req_pool_idx)] = RowView(request(rid), tuple(self._row(kv)), self._protected(rid, kv))
        for sid, kv in records.items():
            if _holds(kv) and int(kv.req_pool_idx) not in rows:
                rows[int(kv.req_pool_idx)] = RowView(session(sid), tuple(self._row(kv)), self._protected(None, kv))
        requests = {
            rid: RequestView(rid, self._status(rid), self.req_session.get(rid), (), 0, 0, None)
            for rid in [*self.held, *self.dropped]
        }
        for rid, req in self.reqs.items():
            status = self._status(rid)
            kv = self._kv(req)
            seq = tuple(int(t) for t in list(req.origin_input_ids) + list(req.output_ids))
            requests[rid] = RequestView(
                rid,
                status,
                self.req_session.get(rid),
                seq[: kv.kv_committed_len] if status == "running" else seq if status == "waiting" else (),
                kv.kv_committed_len if status == "running" else 0,
                self.oracle.prefix.get(req.rid, 0),
                None if kv.req_pool_idx is None or status != "running" else int(kv.req_pool_idx),
                handles.get(request(rid)),
            )
        lent = {id(self._kv(req)): rid for rid, req in self.reqs.items() if self._status(rid) == "running"}
        sessions = {
            sid: SessionView(
                sid,
                kv.kv_committed_len,
                kv.kv_allocated_len,
                None if kv.req_pool_idx is None else int(kv.req_pool_idx),
                tuple(self._row(kv)) if _holds(kv) and id(kv) not in lent else (),
                lent.get(id(kv)),
                () if id(kv) in lent else self._committed(sid, kv),
                handles.get(session(sid)),
            )
            for sid, kv in records.items()
        }
        for sid in opened:  # NOTE: an open session holds no record until its first request
            sessions.setdefault(sid, SessionView(sid, 0, 0, None, handle=handles.get(session(sid))))
        slots = [x for view in rows.values() for x in view.slots]
        return SystemSnap(
            ledgers=ledgers,
            references={k: {o: frozenset(v) for o, v in refs.items()} for k, refs in references.items()},
            requests=requests,
            sessions=sessions,
            rows=rows,
            locks=self._lock_state(tree, held) if "locks" in self.capabilities else None,
            sizes=dict(tree.sizes),
            content={**tree.content, **self.kv.content(slots)},
            page_size=self.config.page_size,
            prefix=tree.prefix,
        )

    # ------------------------------------------------------------ locks

    def _lock_holders(self) -> dict[Owner, tuple[HandleId, Any]]:
        """Who holds a lock on the tree, with its handle id and the node it locked (capability ``locks``): each
        running request (from its admission to its release) and each session's slot (from its first turn to the
        session's close; the slot's lock is the session's handle).

        By release: an explicit ``TreeLock`` on the request and on the slot (``lock``, ``None`` while it holds none;
        0.5.22 on); before, the node the lock was taken on, ``last_node`` (a session's later turns name the slot's
        stand-in node, which locks nothing). A lock on the root locks nothing and is no handle."""
        out: dict[Owner, tuple[HandleId, Any]] = {}
        for rid, req in self.reqs.items():
            node = _lock_node(req) if self._status(rid) == "running" else None
            if node is not None and self._lockable(node):
                out[request(rid)] = (lock_handle(request(rid)), node)
        for name, slot in self._session_layer.slots.items():
            node = _lock_node(slot)
            if node is not None and self._lockable(node):
                out[session(int(name))] = (lock_handle(session(int(name))), node)
        return out

    def _node(self, node: Any) -> Any:
        """The tree node a lock names: a node id from 0.5.17 (the Python tree core's ``node_by_id``), else the node;
        ``None`` for an id the tree no longer has (a locked node evicted: its handle covers nothing cached, and the
        row that still names its KV breaks ``inv_rows_held``)."""
        if not isinstance(node, int):
            return node
        try:
            return self.cache.tree_core.node_by_id(node)
        except KeyError:
            return None

    def _root(self) -> Any:
        view = self.view
        assert isinstance(view, UnifiedAdapter)  # NOTE: a cache with a tree (a disabled one claims no locks)
        return view._root()

    def _lockable(self, node: Any) -> bool:
        return self._node(node) is not self._root()

    def _prime_locks(self, held: dict[Owner, tuple[HandleId, Any]]) -> None:
        """Tell the tree view which handles to cover, where its snapshot computes their coverage (the C++ tree)."""

    def _lock_state(self, tree: Snapshot, held: dict[Owner, tuple[HandleId, Any]]) -> LockState:
        """The tree's lock counts, and each holder's handle, replayed from the receipt its holder keeps where it
        keeps one (:attr:`RECEIPTS`, 0.5.17 on): the full-attention pages from the root to its node; on a Mamba
        model the Mamba state at that node unless the acquire skipped it (SGLang counts a lock there on a tombstone
        too; a release that gave the state up early records it in the receipt); with a window, the SWA segment from
        the node up to the one its receipt's uuid stamps (:meth:`_swa_sites`). Without :attr:`RECEIPTS` Mamba's and
        SWA's counts are left to the cache suite, whose handles carry SGLang's receipt."""
        mamba = self.config.mamba and self.RECEIPTS
        swa = self.config.window is not None and self.RECEIPTS
        lock_ref = {
            site: n
            for site, n in tree.locks.lock_ref.items()
            if site[1] is FULL or (mamba and site[1] is MAMBA) or (swa and site[1] is SWA)
        }
        handles = {hid: self._locked_pages(owner, node, mamba, swa) for owner, (hid, node) in held.items()}
        return LockState(handles, lock_ref, frozenset())

    def _locked_pages(self, owner: Owner, node: Any, mamba: bool = False, swa: bool = False) -> Coverage:
        """What the lock ``owner`` holds on ``node`` counts: every full-attention page from the root down to it (a
        node that left the tree keeps its path as far as its parents go); with ``mamba``, the Mamba state at the
        node unless the holder's receipt says the acquire skipped it or the window's early release took it; with
        ``swa``, the SWA segment (:meth:`_swa_sites`)."""
        root, n = self._root(), self._node(node)
        chain: list[Any] = []
        while n is not None and n is not root:
            chain.append(n)
            n = n.parent
        parts = [_tokens(x) for x in chain]
        key = tuple(t for part in reversed(parts) for t in part)
        pages = required_coverage(key, None, False, self.config.page_size)
        if not chain or not (mamba or swa):
            return pages
        holder, ct = self._holder(owner), self.sg.ComponentType
        receipt = _swa_receipt(holder, ct.SWA) if swa else None
        out = set(pages)
        released = receipt is not None and receipt.released
        if mamba and not released and not _mamba_skipped(holder, chain[0].id, ct.MAMBA):
            out.add((key, MAMBA))
        if receipt is not None and not released:
            out |= _swa_sites(chain, [len(p) for p in parts], key, receipt, ct.SWA)
        return frozenset(out)

    def _holder(self, owner: Owner) -> Any:
        """The object that keeps ``owner``'s lock: its request, or its session's slot."""
        if owner.kind is OwnerKind.REQUEST:
            return self.reqs[owner.ident]
        return self._session_layer.slots[str(owner.ident)]

    def _committed(self, sid: int, kv: Any) -> tuple[int, ...]:
        """The tokens session ``sid`` committed (its record ``kv``): the first ``kv_committed_len`` of the sequence
        of the turn SGLang's own ``Session`` keeps as its last finished one (``req_nodes``, set by ``finish_req``;
        0.5.23 cuts its prompt at ``committed_origin_len``, as the next turn's ``_share_token_arrays`` extends that
        array in place); ``()`` before a turn finished into it."""
        sess = self.s.session_controller.get(str(sid))
        nodes = list(sess.req_nodes.values()) if sess is not None else []
        if not nodes:
            return ()
        last = nodes[-1].req
        prompt = list(last.origin_input_ids)
        cut = getattr(sess, "committed_origin_len", None)  # NOTE: 0.5.13 copies the arrays: it keeps no such length
        seq = [*(prompt if cut is None else prompt[:cut]), *list(last.output_ids)]
        return tuple(int(t) for t in seq[: kv.kv_committed_len])


class SplitKv:
    """A request's (or a session slot's) KV fields where 0.5.16 to 0.5.18 split them: ``kv_allocated_len`` (and
    SWA's evicted length) in the ``ReqKvInfo`` at ``owner.kv`` (``None`` until a row is allocated: nothing
    allocated), the rest on ``owner`` itself."""

    IN_INFO = ("kv_allocated_len", "swa_evicted_seqlen")

    def __init__(self, owner: Any) -> None:
        self.owner = owner

    def __getattr__(self, name: str) -> Any:
        if name in self.IN_INFO:
            info = self.owner.kv
            return 0 if info is None else getattr(info, name)
        return getattr(self.owner, name)


def one_process(parallel_state: Any) -> Any:
    """SGLang's ``ParallelState`` of one process: every group of size 1, every rank and the GPU id 0. Read from its
    fields (0.5.16 adds ``dcp_size``)."""
    fields = [f.name for f in dataclasses.fields(parallel_state)]
    return parallel_state(**{k: 1 if k.endswith("_size") else 0 for k in fields})


def cpu_page_kernels() -> None:
    """Before 0.5.22 the paged allocator launches two Triton kernels (0.5.22 on has a CPU path): run them on CPU as
    the mixin-era adapter does (SGLang's own ``alloc_extend_naive``; ``alloc_decode_kernel`` transcribed)."""
    paged = importlib.import_module("sglang.srt.mem_cache.allocator.paged")
    if not hasattr(paged, "alloc_decode_naive"):
        _patch_page_kernels(paged)


_NO_LOCK_FIELD = object()


def _lock_node(holder: Any) -> Any:
    """The node a request or session slot holds its tree lock on (``None``: none, or the slot's stand-in node)."""
    lock = getattr(holder, "lock", _NO_LOCK_FIELD)
    node = holder.last_node if lock is _NO_LOCK_FIELD else getattr(lock, "node", None)
    return None if node is None or type(node).__name__ == "_VirtualNode" else node


def _receipt(holder: Any) -> tuple[Any, bool]:
    """The receipt of the tree lock ``holder`` keeps (``None``: it holds none) and whether the window's early release
    gave up its SWA part: ``lock.receipt`` and ``lock.swa_released`` from 0.5.22; before, ``lock_receipt`` (0.5.20,
    0.5.21) or, to 0.5.19, the request itself, and its ``swa_prefix_lock_released``."""
    lock = getattr(holder, "lock", _NO_LOCK_FIELD)
    if lock is _NO_LOCK_FIELD:
        return getattr(holder, "lock_receipt", holder), bool(getattr(holder, "swa_prefix_lock_released", False))
    return getattr(lock, "receipt", None), bool(getattr(lock, "swa_released", False))


def _mamba_skipped(holder: Any, anchor: int, mamba: Any) -> bool:
    """Whether the tree lock ``holder`` keeps left the Mamba component (``mamba``) at its ``anchor`` node id
    unlocked, read from the receipt it keeps: ``lock.receipt`` (0.5.22 on) or ``lock_receipt`` (0.5.20, 0.5.21),
    whose ``skipped_lock_components`` name what the acquire skipped or a release gave up early; up to 0.5.19 the
    holder's own ``skip_lock_node_ids`` (the nodes that were tombstones at the acquire)."""
    receipt, _ = _receipt(holder)
    if receipt is None:
        return True  # NOTE: no lock held (a holder without one is no handle)
    if mamba in getattr(receipt, "skipped_lock_components", ()):
        return True
    return anchor in getattr(receipt, "skip_lock_node_ids", {}).get(mamba, ())


@dataclass(frozen=True)
class SwaReceipt:
    """What a holder's receipt says of its SWA lock: the uuid stamped on the segment's last node (``None``: the
    segment reached the root), the node ids the acquire passed over as tombstones (0.5.17 to 0.5.19 only: from
    0.5.20 the segment counts tombstones too), and whether the window's early release gave it up (SGLang's
    ``swa_prefix_lock_released`` to 0.5.21, ``lock.swa_released`` from 0.5.22; off unless
    ``SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW``: the release takes the node's Mamba lock with it, a
    component of lower eviction priority)."""

    uuid: int | None
    skipped: frozenset[int]
    released: bool


def _swa_receipt(holder: Any, swa: Any) -> SwaReceipt | None:
    """The SWA part of the receipt ``holder`` keeps (``lock.receipt``, ``lock_receipt`` or, to 0.5.19, the request
    itself: ``swa_uuid_for_lock`` and ``skip_lock_node_ids``); ``None`` when it holds no lock or the acquire skipped
    SWA whole (``skipped_lock_components``)."""
    receipt, released = _receipt(holder)
    if receipt is None or swa in getattr(receipt, "skipped_lock_components", ()):
        return None
    uuids = getattr(receipt, "component_lock_uuids", None)
    uuid = uuids.get(swa) if uuids is not None else getattr(receipt, "swa_uuid_for_lock", None)
    skipped = getattr(receipt, "skip_lock_node_ids", None)
    return SwaReceipt(uuid, frozenset(skipped.get(swa, ()) if skipped is not None else ()), released)


def _swa_sites(chain: list[Any], lengths: list[int], key: Key, receipt: SwaReceipt, swa: Any) -> set[LockSite]:
    """The SWA sites of a lock's segment, as SGLang's release walks it: from the anchor (``chain[0]``; ``chain``
    runs up to the root's child, ``lengths`` its nodes' token counts, ``key`` the anchor's whole key) up to and
    including the node whose SWA ``uuid`` the receipt names, or to the root without one. To 0.5.19 a node the
    acquire passed over is no site: one its receipt names, or one still without a value (split from one it
    passed over: a split copies the count, not the id)."""
    sites: set[LockSite] = set()
    end = len(key)
    for node, length in zip(chain, lengths, strict=True):
        data = node.component_data[swa]
        passed = bool(receipt.skipped) and (node.id in receipt.skipped or data.value is None)
        if not passed:
            sites |= {(key[:i], SWA) for i in range(end - length + 1, end + 1)}
        if receipt.uuid is not None and data.metadata.get("uuid") == receipt.uuid:
            break
        end -= length
    return sites


def _holds(kv: Any) -> bool:
    """Whether a KV record (a request's or a session's) holds a ``req_to_token`` row."""
    return kv.req_pool_idx is not None


def _rid(rid: int) -> str:
    """SGLang's rid for ``rid``. NOTE: ``abort_request`` matches rids by prefix (``startswith``): fixed width."""
    return f"{rid:08d}"


def _with(lg: Ledger, extra: dict[Owner, set[int]]) -> Ledger:
    """``lg`` with ``extra`` owners' holdings added (sessions: the cache adapter's ledger knows nodes and requests)."""
    held = {o: set(xs) for o, xs in lg.held.items()}
    for o, xs in extra.items():
        if xs:
            held.setdefault(o, set()).update(xs)
    return Ledger(lg.name, lg.capacity, lg.free, {o: frozenset(xs) for o, xs in held.items() if xs}, lg.base)


def _merge(results: list[StepResult]) -> StepResult:
    def cat(attr: str) -> tuple[int, ...]:
        return tuple(dict.fromkeys(x for r in results for x in getattr(r, attr)))

    return StepResult(cat("admitted"), cat("rejected"), cat("finished"), cat("retracted"))


def early_layout(alias: str) -> bool:
    """Whether the installed SGLang has 0.5.13 to 0.5.16's layout (``scheduler_components_early``); ``alias`` names
    the adapter in the error when SGLang is not installed."""
    try:
        return base_release(version("sglang")) in EARLY_COMPONENT_RELEASES
    except PackageNotFoundError as err:
        raise SchedulerError(f"{alias}: SGLang is not installed (.ci/sglang_env builds a venv with it)") from err


def scheduler_system_factory(config: SystemConfig) -> SchedulerSystemAdapter:
    """SGLang's real scheduler (0.5.17 to 0.5.23) over a ``UnifiedRadixCache`` of the kind ``config`` names."""
    return SchedulerSystemAdapter(config)


def chunked_system_factory(config: SystemConfig) -> SchedulerSystemAdapter:
    """:func:`scheduler_system_factory` with SGLang's chunked prefill on (``chunk_size`` of the 0.5.9 to 0.5.12
    adapter's :func:`~kvledger.contracts.adapters.sglang.scheduler.chunked_scheduler_factory`)."""
    return SchedulerSystemAdapter(config, chunk_tokens=chunk_size(config))
