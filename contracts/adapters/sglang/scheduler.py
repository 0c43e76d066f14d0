"""SGLang's real ``Scheduler`` (0.5.9 to 0.5.12) behind the request-level system adapter protocol.

What runs is SGLang's own code: the scheduling step
``get_next_batch_to_run`` → ``run_batch`` → ``process_batch_result``, with the
real ``PrefillAdder``, ``SchedulePolicy("fcfs")``, ``ScheduleBatch``
(``prepare_for_extend`` / ``alloc_for_extend``, ``update_running_batch`` with
``check_decode_mem`` / ``retract_decode`` / ``prepare_for_decode``),
``release_kv_cache`` and the caches' ``cache_finished_req`` /
``cache_unfinished_req``. Requests enter through
``handle_generate_request(TokenizedGenerateReqInput)``, sessions through
``open_session`` / ``close_session``, aborts through ``abort_request``;
retraction is SGLang's own test hook (``TEST_RETRACT`` on for one iteration).
With chunked prefill on (:func:`chunked_scheduler_factory`, the ``sglang-V-system-chunked`` aliases), a
prompt longer than a chunk is admitted as SGLang's ``chunked_req`` and the protocol's ``chunk`` is the
scheduler's next step (the stash of the chunk computed, then the next chunk).
The idle leak check is the engine's own, in strict mode
(``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1``): ``check_memory`` in 0.5.9
and 0.5.10, ``_check_all_pools(get_pool_stats())`` from 0.5.11.

What is replaced: the model worker (:class:`OracleWorker` returns token ids
from an oracle, EOS once :meth:`SchedulerAdapter.finish` asked for it), the
output channels (recorders), and the metrics / logging hooks (no-ops, listed
in :data:`NO_OP_HOOKS`). The ``Scheduler`` is made with ``object.__new__``
and given only what its loop reads; an ``enable_*`` / ``is_*`` / ``use_*``
flag the loop reads and nobody set reads as ``False`` and is logged in
:attr:`SchedulerAdapter.defaulted_flags`, so nothing is assumed silently.

The abstraction (:meth:`SchedulerAdapter.snapshot`) reads SGLang's
structures only:

* ``references``: what each owner's own structures name — a request's
  ``req_to_token`` row entries it owns (``[cache_protected_len,
  kv_allocated_len)``), its row, its ``mamba_pool_idx`` and ping-pong track
  buffer; a tree node's ``value`` / ``mamba_value``; a session slot's row,
  its range ``[cache_protected_len, kv_allocated_len)`` and its Mamba state.
  For paged KV every unit is a page (``slot // page_size``).
* ``ledgers``: per pool, the allocator's free list, and every slot in use
  held by the owner that last named it (a slot stays with its last holder
  until it is freed). A slot whose holder stopped naming it while it was
  never freed is thus still *held* but no longer *referenced*: a leak, with
  the culprit named.
* ``requests`` / ``sessions`` / ``rows``; ``locks`` (the radix cache's
  lock counters and one handle per locked ``last_node`` of a live request or
  session slot, through the cache adapters' own abstraction); ``sizes`` (the
  caches' evictable / protected counters).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from kvledger.contracts.adapters.sglang.common import (
    DOUBLE_FREE_OWNER,
    FULL,
    MAMBA,
    NodeIds,
    NotExpressible,
    chunk_size,
    chunk_steps,
    chunked_capabilities,
    evict_component,
    hybrid_rows,
    lock_handle,
    node_owner,
    not_chunked,
    one_process_run,
    reap_sessions,
    retraction_forced,
    stalled,
    step_until,
    still_prefilling,
    uncached,
)
from kvledger.contracts.adapters.sglang.cpu_import import SCHEDULER, base_release, import_sglang
from kvledger.contracts.adapters.sglang.legacy_cpp import cpp_row_boundary, radix_cache_cpp, reads_one_dump
from kvledger.contracts.adapters.system import (
    IdleVerdict,
    RequestView,
    RowView,
    SessionView,
    StepResult,
    SystemConfig,
    SystemSnapshot,
)
from kvledger.spec.ledger import Ledger
from kvledger.spec.locks import LockState
from kvledger.spec.prefix import PrefixCache
from kvledger.spec.types import Component, HandleId, NodeId, Owner, request, session

log = logging.getLogger(__name__)

EOS = 1
"""The oracle's end-of-sequence token id (``model_config.hf_eos_token_id``)."""
VOCAB = 64

MODULES = (
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.io_struct",
    "sglang.srt.managers.utils",
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.mamba_radix_cache",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.sampling.sampling_params",
    "sglang.srt.server_args",
)

NO_OP_HOOKS = (
    "log_prefill_stats",
    "log_decode_stats",
    "log_decode_stats_every_iteration",
    "log_batch_result_stats",
    "report_prefill_stats",
    "report_decode_stats",
    "record_forward_metrics",
    "maybe_collect_routed_experts",
    "maybe_collect_customized_info",
    "_maybe_update_reasoning_tokens",
    "_publish_kv_events",
    "maybe_send_health_check_signal",
    "_maybe_clear_mm_inputs",
    "_profile_batch_predicate",
    "maybe_sleep_on_idle",
    "update_lora_metrics",
    "update_spec_metrics",
)
"""Scheduler methods replaced by no-ops: metrics, logging, profiling, health checks (none touches memory)."""

FLAG_PREFIXES = ("enable_", "is_", "use_")


def rid_name(rid: int) -> str:
    """SGLang's rid for protocol rid ``rid``; the trailing dot keeps ``abort_request``'s prefix match exact."""
    return f"kvl{rid}."


def sid_name(sid: int) -> str:
    return f"kvs{sid}"


class _CPULaunch:
    """A Triton kernel's ``kernel[grid](*args)`` launch, run on CPU by ``run(*args)``."""

    def __init__(self, run: Callable[..., None]) -> None:
        self.run = run

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return self.run


def _alloc_decode_cpu(
    seq_lens: torch.Tensor, last_loc: torch.Tensor, free_pages: torch.Tensor, out: torch.Tensor, *rest: Any
) -> None:
    """``alloc_decode_kernel`` transcribed: each next slot continues its page, or starts the next free page."""
    page_size = int(rest[1])
    taken = 0
    for i, seq_len in enumerate(int(x) for x in seq_lens.tolist()):
        new = (seq_len + page_size - 1) // page_size - (seq_len - 1 + page_size - 1) // page_size
        if new == 0:
            out[i] = last_loc[i] + 1
        else:
            out[i] = free_pages[taken] * page_size
            taken += new


def _patch_page_kernels(allocator: Any) -> None:
    """Run the paged allocator's two Triton kernels on CPU (SGLang's own naive extend; the decode one transcribed)."""
    naive = allocator.alloc_extend_naive

    def extend(prefix_lens: Any, seq_lens: Any, last_loc: Any, free_pages: Any, out: Any, *rest: Any) -> None:
        naive(prefix_lens, seq_lens, last_loc, free_pages, out, int(rest[1]), "cpu")

    allocator.alloc_extend_kernel = _CPULaunch(extend)
    allocator.alloc_decode_kernel = _CPULaunch(_alloc_decode_cpu)


def _sglang() -> tuple[str, SimpleNamespace]:
    """Import the scheduler of the installed SGLang (0.5.9 to 0.5.12) on CPU."""
    os.environ["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] = "1"
    version = import_sglang(SCHEDULER, MODULES)
    import importlib

    names = {m.rsplit(".", 1)[1]: importlib.import_module(m) for m in MODULES}
    names["base"] = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
    names["envs"] = importlib.import_module("sglang.srt.environ").envs
    _patch_page_kernels(names["allocator"])
    one_process_run()
    return version, SimpleNamespace(**names)


class OracleWorker:
    """The model worker: ``forward_batch_generation`` returns the oracle's next token for every request."""

    def __init__(self, adapter: SchedulerAdapter) -> None:
        self.adapter = adapter
        self.calls = 0

    def forward_batch_generation(self, batch: Any, **_: Any) -> Any:
        self.calls += 1
        reqs = self.adapter.sched.cur_batch.reqs
        ids = [self.adapter.next_token(r) for r in reqs]
        return self.adapter.sg.utils.GenerationBatchResult(
            next_token_ids=torch.tensor(ids, dtype=torch.int64), can_run_cuda_graph=False
        )


class Recorder:
    """Stands in for a ZMQ socket to the tokenizer / detokenizer: keeps what the scheduler sends."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_output(self, obj: Any, *_: Any) -> None:
        self.sent.append(obj)

    def send_pyobj(self, obj: Any) -> None:
        self.sent.append(obj)


@dataclass
class _Req:
    """The adapter's record of one protocol request."""

    rid: int
    session: int | None
    prompt: tuple[int, ...]
    sg: Any = None
    status: str = "pending"
    eos: bool = False


@dataclass
class _Holders:
    """Per pool, the owner that last named each slot in use (sticky until the slot is free)."""

    pools: dict[str, dict[int, Owner]] = field(default_factory=dict)

    def update(self, pool: str, free: set[int], refs: Mapping[Owner, set[int]]) -> dict[int, Owner]:
        held = self.pools.setdefault(pool, {})
        for x in list(held):
            if x in free:
                del held[x]
        for owner, xs in sorted(refs.items(), key=lambda kv: str(kv[0])):
            for x in xs:
                if x not in free and (x not in held or not _names(refs, held[x], x)):
                    held[x] = owner
        return held


def _names(refs: Mapping[Owner, set[int]], owner: Owner, x: int) -> bool:
    return x in refs.get(owner, set())


def streaming_layer(tree: Any) -> Any:
    """``tree`` wrapped in the installed release's streaming-session layer, as SGLang's cache registry wraps a cache
    that embeds none under ``--enable-streaming-session`` (``StreamingSession`` from 0.5.11, ``SessionAwareCache`` in
    0.5.10); ``tree`` itself where it embeds one, or where the release has none (0.5.9: its sessions are the
    scheduler's ``Session`` objects)."""
    for module, cls in (
        ("sglang.srt.session.streaming_session", "StreamingSession"),  # 0.5.11+
        ("sglang.srt.mem_cache.session_aware_cache", "SessionAwareCache"),  # 0.5.10
    ):
        try:
            layer = getattr(importlib.import_module(module), cls)
        except ImportError:
            continue
        supports = getattr(tree, "supports_streaming_session", None)
        return tree if supports is not None and supports() else layer(tree)
    return tree


class _NoTree:
    """The tree of a cache that has none (``ChunkCache``): no node holds anything, nothing is locked."""

    def node_values(self) -> Iterator[tuple[NodeId, list[int], list[int] | None]]:
        return iter(())

    def lockable(self, last: Any) -> bool:
        return False


class SchedulerAdapter:
    """SGLang's ``Scheduler`` driven at the request level; see the module docstring."""

    capabilities: frozenset[str] = frozenset()

    def __init__(
        self, config: SystemConfig, chunk_tokens: int | None = None, *, cpp: bool = False, no_cache: bool = False
    ) -> None:
        self.cpp = cpp
        """Whether the tree is SGLang's C++ one (``RadixCacheCpp``, ``SGLANG_EXPERIMENTAL_CPP_RADIX_TREE``)."""
        self.no_cache = no_cache
        """``--disable-radix-cache``: the cache is SGLang's ``ChunkCache`` (what the registry builds whenever a
        chunked-prefill size is set, ``-1`` included), which matches and caches nothing."""
        if cpp and config.mamba:
            raise NotExpressible("SGLang's RadixCacheCpp has no Mamba component")
        if no_cache and cpp:
            raise NotExpressible("SchedulerAdapter: a disabled radix cache has no tree, C++ or other (cpp, no_cache)")
        if config.mamba and config.ping_pong > 0:
            # NOTE: the extra-buffer mode needs the server's Mamba scheduling strategy set consistently with the
            # pool; not yet wired (a lone request then leaves its track buffers counted as leaked).
            raise NotExpressible(
                f"SGLang scheduler adapter: Mamba ping-pong track buffers (ping_pong={config.ping_pong}) are not "
                "driven yet; use ping_pong=0"
            )
        if config.window is not None:
            raise NotExpressible("SGLang scheduler adapter: no sliding-window model (the unified cache is not driven)")
        self.version, self.sg = _sglang()
        self.config = config
        self.ps = config.page_size
        self.chunk_tokens = chunk_tokens
        """SGLang's ``chunked_prefill_size`` (``None``: chunked prefill off, every prompt prefilled in one pass)."""
        self.defaulted_flags: list[str] = []
        self.ids = NodeIds()
        self.reqs: dict[int, _Req] = {}
        self.by_name: dict[str, int] = {}
        self.sessions: dict[int, list[int]] = {}
        self.next_rid = 1
        self.holders = _Holders()
        self.idle_step = False
        self.prefix_lens: dict[int, int] = {}
        self.sched = self._build()
        self.engine_class = f"{type(self.sched).__mro__[1].__module__}.{type(self.sched).__mro__[1].__qualname__}"
        self.name = f"sglang-{self.version}/Scheduler+{self.cache_class}"
        caps = {"retract", "abort", "evict", "idle_check", "sizes", "rows", "caches_on_finish", "prefix_cache"}
        # NOTE: a streaming-session slot (0.5.10+) keeps its first request's lock on the tree until the session
        # closes: the slot's handle is the session's (``SessionView.handle``)
        caps |= {"sessions", "locks"} if self.streaming else {"locks"}
        if no_cache:
            caps.discard("locks")  # NOTE: nothing is locked either
        if config.mamba and base_release(self.version) not in ("0.5.9", "0.5.10"):
            # NOTE: from 0.5.11 a session request that admission rejects keeps the copy-on-write Mamba slot its match
            # took (``get_new_batch_prefill`` frees it only for requests without a session, as 0.5.13 and 0.5.23 do)
            caps.add("reservations")
        self.capabilities = chunked_capabilities(caps, chunk_tokens)
        if no_cache:
            self.capabilities = uncached(self.capabilities)

    # ------------------------------------------------------------ construction

    @property
    def cache_class(self) -> str:
        inner = getattr(self.sched.tree_cache, "inner", self.sched.tree_cache)
        return type(inner).__name__

    def _pools(self) -> tuple[Any, Any]:
        sg, c = self.sg, self.config
        if self.ps > 1:
            alloc = sg.allocator.PagedTokenToKVPoolAllocator(c.kv_tokens, self.ps, torch.int64, "cpu", None, False)
        else:
            alloc = sg.allocator.TokenToKVPoolAllocator(c.kv_tokens, torch.int64, "cpu", None, False)
        if c.mamba:
            rows = hybrid_rows(sg.memory_pool.HybridReqToTokenPool, c.rows, c.mamba_slots, c.max_context + 8)
        else:
            rows = sg.memory_pool.ReqToTokenPool(
                size=c.rows, max_context_len=c.max_context + 8, device="cpu", enable_memory_saver=False
            )
        return rows, alloc

    def _cache(self, rows: Any, alloc: Any) -> Any:
        sg = self.sg
        params = sg.cache_init_params.CacheInitParams(
            disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=alloc, page_size=self.ps
        )
        if self.no_cache:
            tree = importlib.import_module("sglang.srt.mem_cache.chunk_cache").ChunkCache(params)
        elif self.cpp:
            tree = radix_cache_cpp(params)
        elif self.config.mamba:
            if self.ps != 1:
                raise NotExpressible(f"SGLang {self.version} MambaRadixCache: page size 1 only without extra buffer")
            tree = sg.mamba_radix_cache.MambaRadixCache(params)
        else:
            tree = sg.radix_cache.RadixCache(params)
        return streaming_layer(tree)

    def _server_args(self) -> Any:
        sa = self.sg.server_args.ServerArgs(
            model_path="dummy",
            attention_backend="torch_native",
            page_size=self.ps,
            disable_overlap_schedule=True,
            chunked_prefill_size=self.chunk_tokens if self.chunk_tokens is not None else -1,
            schedule_policy="fcfs",
            max_running_requests=self.config.rows,
        )
        sa.pp_max_micro_batch_size = self.config.rows
        sa.disable_radix_cache = self.no_cache
        return sa

    def _build(self) -> Any:
        sg = self.sg
        base = sg.scheduler.Scheduler
        adapter = self

        def __getattr__(obj: Any, name: str) -> Any:
            if name.startswith(FLAG_PREFIXES):
                adapter.defaulted_flags.append(f"scheduler.{name}")
                log.info("SGLang Scheduler flag %s was not set: read as False", name)
                object.__setattr__(obj, name, False)
                return False
            raise AttributeError(f"{type(obj).__name__!s} has no attribute {name!r} (not set by kvledger)")

        cls = type("Scheduler", (base,), {"__getattr__": __getattr__, "__module__": __name__})
        s: Any = object.__new__(cls)
        sa = self._server_args()
        sg.server_args.set_global_server_args_for_scheduler(sa)
        s.server_args = sa
        rows, alloc = self._pools()
        self.row_base = min(int(x) for x in rows.free_slots)
        s.req_to_token_pool, s.token_to_kv_pool_allocator = rows, alloc
        s.tree_cache = self._cache(rows, alloc)
        s.page_size = self.ps
        s.is_hybrid_swa = False
        s.is_hybrid_ssm = self.config.mamba
        s.max_total_num_tokens = alloc.size
        s.model_config = _Flags(
            self.defaulted_flags,
            "model_config",
            vocab_size=VOCAB,
            hf_eos_token_id={EOS},
            context_len=self.config.max_context + 8,
            is_multimodal=False,
            num_key_value_heads=1,
            is_encoder_decoder=False,
            hf_config=SimpleNamespace(),
        )
        s.max_req_input_len = self.config.max_context
        s.max_req_len = self.config.max_context + 1
        s.max_running_requests = self.config.rows
        s.tokenizer = None
        s.spec_algorithm = sg.scheduler.SpeculativeAlgorithm.from_string(None)
        s.disaggregation_mode = sg.scheduler.DisaggregationMode.NULL
        s.dllm_config = None
        s.chunked_prefill_size = self.chunk_tokens
        s.chunked_req = None
        s.is_mixed_chunk = False
        s.schedule_policy = "fcfs"
        s.priority_scheduling_preemption_threshold = sa.priority_scheduling_preemption_threshold
        s.schedule_low_priority_values_first = sa.schedule_low_priority_values_first
        s.abort_on_priority_when_disabled = sa.abort_on_priority_when_disabled
        s.max_prefill_tokens = 64
        s.truncation_align_size = None
        s.pp_size = 1
        s.pp_rank = s.tp_rank = s.attn_cp_rank = 0
        s.tp_size = 1
        s.dp_size = 1
        s.require_mlp_sync = False
        s.stream_interval = 1
        s.forward_sleep_time = None
        s.device = "cpu"
        s.max_queued_requests = None
        s.dllm_manager = SimpleNamespace(any_staging_reqs=lambda: False)  # NOTE: 0.5.11+ asks when idle
        s.is_generation = True
        s.num_generated_tokens = 0
        s.forward_ct_decode = 0
        s.init_running_status()
        s.init_schedule_policy()
        self._init_sessions(s)
        s.grammar_manager = SimpleNamespace(
            has_waiting_grammars=lambda: False,
            process_req_with_grammar=lambda req: False,
            abort_requests=lambda recv: None,
            grammar_queue=[],
            __len__=lambda: 0,
        )
        s.model_worker = s.tp_worker = OracleWorker(self)
        s.send_to_tokenizer = s.send_to_detokenizer = Recorder()
        for hook in NO_OP_HOOKS:
            setattr(s, hook, _no_op)
        s.record_forward_metrics = _null_context
        s.stream_output = self._stream_output
        s.current_scheduler_metrics_enabled = False
        s.return_health_check_ct = 0
        return s

    def _init_sessions(self, s: Any) -> None:
        import importlib

        for module in ("sglang.srt.session.session_controller", "sglang.srt.managers.session_controller"):
            try:
                mod = importlib.import_module(module)
            except ImportError:
                continue
            if hasattr(mod, "SessionController"):
                s.session_controller = mod.SessionController(s.tree_cache)
                self.streaming = True
                return
        self.streaming = False

    def _stream_output(self, reqs: list[Any], *_: Any, **__: Any) -> None:
        return None

    # ------------------------------------------------------------ the engine's step

    def _step(self) -> bool:
        """One iteration of ``event_loop_normal`` (no receive); ``False`` when it found no batch (an idle step)."""
        s = self.sched
        self._reap()
        self._flush()
        queued = {id(x) for x in s.waiting_queue}
        chunked = s.chunked_req
        batch = s.get_next_batch_to_run()
        s.cur_batch = batch
        if batch and batch.forward_mode.is_extend():
            for req in batch.reqs:  # NOTE: what admission matched (the cache or the session), before the prefill
                rid = self.by_name.get(req.rid)
                if rid is None:
                    continue
                if req is chunked and chunked is not None:
                    # NOTE: a chunked request's next chunk: the step began by caching the chunk before it
                    # (``stash_chunked_request``), and the request runs on that, ``cache_protected_len`` tokens (the
                    # tree's whole pages, locked). A session's turn keeps what it resumed
                    if self.reqs[rid].session is None:
                        self.prefix_lens[rid] = self._protected(req)
                    continue
                if id(req) not in queued:
                    continue
                # NOTE: a retracted request admitted again matched again: its latest match counts
                resumed = type(req.last_node).__name__ == "_VirtualNode"  # the session layer's match
                # NOTE: a session request's prefix_len is what it resumed from its session; when the session held
                # nothing yet it matched the radix tree like any request, and resumed nothing.
                in_session = self.reqs[rid].session is not None
                self.prefix_lens[rid] = len(req.prefix_indices) if resumed or not in_session else 0
        if batch:
            result = s.run_batch(batch)
            s.process_batch_result(batch, result)
        self.idle_step = not batch
        s.last_batch = batch
        return bool(batch)

    def _status(self, r: _Req) -> str:
        req = r.sg
        if req is None:
            return "waiting" if r.status == "pending" else r.status
        if req.finished():
            reason = req.finished_reason
            if type(reason).__name__ == "FINISH_ABORT":
                return "aborted"
            return "finished"
        s = self.sched
        if any(x is req for x in s.waiting_queue):
            return "waiting"
        batches = [s.running_batch, s.last_batch, s.cur_batch]
        if s.chunked_req is req or any(b is not None and any(x is req for x in b.reqs) for b in batches):
            return "running"
        return "aborted"  # NOTE: dropped by the engine without a finish reason (abort_request on a queued request)

    def _statuses(self) -> dict[int, str]:
        return {rid: self._status(r) for rid, r in self.reqs.items()}

    def _outcome(self, before: Mapping[int, str], tried: Iterable[int] = ()) -> StepResult:
        self._flush()
        after = self._statuses()
        for rid, st in after.items():
            if self.reqs[rid].sg is not None:
                self.reqs[rid].status = st
        admitted = [r for r, st in before.items() if st == "waiting" and after.get(r) in ("running", "finished")]
        rejected = [r for r in tried if before.get(r) == "waiting" and after.get(r) == "waiting"]
        finished = [r for r, st in after.items() if st in ("finished", "aborted") and before.get(r) not in (st,)]
        retracted = [r for r, st in before.items() if st == "running" and after.get(r) == "waiting"]
        self._observe()
        return StepResult(tuple(admitted), tuple(rejected), tuple(finished), tuple(retracted))

    # ------------------------------------------------------------ the protocol

    def add_request(self, tokens: tuple[int, ...], session: int | None = None) -> int:
        """A request arrives: ``handle_generate_request(TokenizedGenerateReqInput)``; returns its rid.

        A streaming session takes one turn at a time (0.5.11 aborts a second concurrent turn; 0.5.10
        accepts it and then crashes in ``dec_lock_ref`` on the session's virtual node): like a streaming
        client, the adapter sends a session's next turn once its previous turn has ended; until then the
        request waits outside the engine, holding nothing.
        """
        rid = self.next_rid
        self.next_rid += 1
        rec = _Req(rid, session, tuple(tokens))
        self.reqs[rid] = rec
        self.by_name[rid_name(rid)] = rid
        if session is not None and session in self.sessions:
            self.sessions[session].append(rid)
        if not self._turn_in_flight(rec):
            self._submit(rec)
        self._observe()
        return rid

    def _turn_in_flight(self, rec: _Req) -> bool:
        if rec.session is None or not self.streaming:
            return False
        chain = self.sessions.get(rec.session, [])
        earlier = chain[: chain.index(rec.rid)] if rec.rid in chain else chain
        return any(self._status(self.reqs[r]) in ("waiting", "running") for r in earlier)

    def _reap(self) -> None:
        """The session reaper the loop runs as it takes in requests (``process_input_requests``; 0.5.11+)."""
        reap_sessions(getattr(self.sched, "session_controller", None))

    def _open_sessions(self) -> list[int]:
        """The sessions SGLang keeps open: the adapter's, and any whose close it deferred to the end of the turn
        then running (0.5.11+: ``close_on_finish``), until the reaper completes it."""
        ctl = getattr(self.sched, "session_controller", None)
        kept = [_sid_of(name) for name in getattr(ctl, "sessions", {})]
        return sorted(set(self.sessions) | set(kept))

    def _flush(self) -> None:
        """Send each session's next turn whose previous turn has ended."""
        for r in list(self.reqs.values()):
            if r.sg is None and r.status == "pending" and not self._turn_in_flight(r):
                self._submit(r)

    def _submit(self, rec: _Req) -> None:
        sg = self.sg
        name = rid_name(rec.rid)
        history = 0
        session_params = None
        if rec.session is not None:
            chain = self.sessions.get(rec.session, [])
            earlier = [r for r in chain[: chain.index(rec.rid)] if self.reqs[r].sg is not None] if chain else []
            last = self.reqs[earlier[-1]].sg if earlier else None
            if last is not None:
                history = len(last.origin_input_ids) + len(last.output_ids)
            session_params = sg.io_struct.SessionParams(
                id=sid_name(rec.session), rid=rid_name(earlier[-1]) if earlier else None
            )
        budget = max(1, self.config.max_context - history - len(rec.prompt))
        sp = sg.sampling_params.SamplingParams(max_new_tokens=budget)
        sp.normalize(None)
        recv = sg.io_struct.TokenizedGenerateReqInput(
            input_text="",
            input_ids=list(rec.prompt),
            mm_inputs=None,
            sampling_params=sp,
            return_logprob=False,
            logprob_start_len=-1,
            top_logprobs_num=0,
            token_ids_logprob=None,
            stream=False,
            session_params=session_params,
            rid=name,
        )
        self.idle_step = False  # NOTE: a change from outside the loop: the next step may find work
        before = {id(x) for x in self._queued()}
        self.sched.handle_generate_request(recv)
        new = [x for x in self._queued() if id(x) not in before and x.rid == name]
        rec.sg = new[0] if new else None
        rec.status = "waiting" if new else "aborted"

    def _queued(self) -> list[Any]:
        return list(self.sched.waiting_queue)

    def admit(self, budget: int, rid: int | None = None) -> StepResult:
        """One scheduling step with a prefill token budget (``max_prefill_tokens``); SGLang's policy picks."""
        self.sched.max_prefill_tokens = budget
        before = self._statuses()
        self._step()
        return self._outcome(before, [r for r, st in before.items() if st == "waiting"])

    def _mid_prefill(self, r: _Req) -> bool:
        """``r`` is SGLang's chunked request: admitted, with chunks of its prompt still to prefill."""
        return r.sg is not None and self.sched.chunked_req is r.sg

    def _chunk_steps(self) -> int:
        """``chunk_steps`` for every live request known to the engine."""
        live = [r.sg for r in self.reqs.values() if r.sg is not None and self._status(r) in ("waiting", "running")]
        todo = (len(q.origin_input_ids) + len(q.output_ids) - int(q.kv_committed_len) for q in live)
        return chunk_steps(self.chunk_tokens, todo)

    def _steps_until(self, r: _Req, done: Callable[[], bool], what: str, decoding_moves: bool = True) -> StepResult:
        """Engine steps until ``done()``, while request ``r`` moves (each step it changes status, or decodes where
        ``decoding_moves``, resets the count); the steps in which it does not are bounded by the prefills the
        scheduler may run first: one per waiting request and per chunk still to prefill, and two more. Past them a
        request still running is a finding (``a running request moves``,
        :func:`~kvledger.contracts.adapters.sglang.common.stalled`; one waiting is not: it may wait for memory). A
        finish passes ``decoding_moves=False``: a request that decodes on past its EOS is not moving towards its end."""
        before = self._statuses()
        tried = [x for x, st in before.items() if st == "waiting"]

        def slack() -> int:
            return 2 + len(self.sched.waiting_queue) + self._chunk_steps()

        def moves() -> object:
            return self._status(r), len(r.sg.output_ids) if r.sg is not None and decoding_moves else 0

        if not step_until(self._step, done, moves, slack) and self._status(r) == "running":
            raise stalled(what, r.rid, slack())
        return self._outcome(before, tried)

    def extend(self, rid: int, n: int, ahead: int = 0) -> StepResult:
        """Decode steps until request ``rid`` has ``n`` more tokens (every running request moves with it)."""
        r = self.reqs[rid]
        if self._status(r) != "running":
            return self._outcome(self._statuses())
        if self._mid_prefill(r):
            raise still_prefilling(rid, n, int(r.sg.kv_committed_len), len(r.sg.origin_input_ids))
        target = len(r.sg.output_ids) + n
        return self._steps_until(r, lambda: self._status(r) != "running" or len(r.sg.output_ids) >= target, "extend")

    def finish(self, rid: int) -> StepResult:
        """The oracle emits EOS for ``rid`` from now on; step until it has finished."""
        r = self.reqs[rid]
        if self._status(r) not in ("running", "waiting"):
            return self._outcome(self._statuses())
        r.eos = True
        return self._steps_until(
            r, lambda: self._status(r) not in ("running", "waiting"), "finish", decoding_moves=False
        )

    def retract(self, rid: int) -> StepResult:
        """SGLang's ``TEST_RETRACT`` hook on for one decode iteration: ``retract_decode`` picks its victims."""
        r = self.reqs[rid]
        before = self._statuses()
        if self._status(r) != "running":
            return self._outcome(before)
        with retraction_forced(self.sg.scheduler):
            self._step()
        return self._outcome(before)

    def abort(self, rid: int) -> StepResult:
        """``abort_request(AbortReq(rid))``; a running request then ends in the next step, as in SGLang."""
        r = self.reqs[rid]
        before = self._statuses()
        if r.sg is None and r.status == "pending":
            r.status = "aborted"  # NOTE: never sent to the engine (its session's previous turn is in flight)
            return self._outcome(before)
        self.idle_step = False  # NOTE: a change from outside the loop: the next step may find work
        self.sched.abort_request(self.sg.io_struct.AbortReq(rid=rid_name(rid)))
        if self._status(r) == "running":
            self._step()
        return self._outcome(before)

    def open_session(self, sid: int) -> None:
        self.idle_step = False  # NOTE: a change from outside the loop: the next step may find work
        self.sched.open_session(self._open_req(sid))
        self.sessions.setdefault(sid, [])
        self._observe()

    def _open_req(self, sid: int) -> Any:
        extra = {"streaming": True} if self.streaming else {}
        return self.sg.io_struct.OpenSessionReqInput(capacity_of_str_len=1 << 16, session_id=sid_name(sid), **extra)

    def close_session(self, sid: int) -> None:
        self.idle_step = False  # NOTE: a change from outside the loop: the next step may find work
        self.sched.close_session(self.sg.io_struct.CloseSessionReqInput(session_id=sid_name(sid)))
        self.sessions.pop(sid, None)
        self._observe()

    def evict(self, component: Component, n: int) -> int:
        if not (component is FULL or (component is MAMBA and self.config.mamba)):
            return 0  # NOTE: the cache has no such component: nothing of it to evict
        got = evict_component(self.sched.tree_cache, self.sg.base.EvictParams, component, n)
        self.idle_step = False
        self._observe()
        return got

    # ------------------------------------------------------------ the engine's idle check

    def _idle(self) -> bool:
        """SGLang runs its idle check after a step that found no batch: nothing running, and nothing admissible."""
        statuses = self._statuses().values()
        if "running" in statuses:
            return False
        return "waiting" not in statuses or self.idle_step

    def _run_idle_check(self) -> tuple[bool, str]:
        s = self.sched
        check = s.on_idle if hasattr(type(s), "on_idle") else s.self_check_during_idle  # 0.5.11+ / 0.5.9-0.5.10
        try:
            check()
        except (AssertionError, ValueError, RuntimeError) as err:
            return False, str(err)
        return True, ""

    def idle_check(self) -> IdleVerdict | None:
        """SGLang's own idle check (strict: a leak raises), ``None`` while a request is running."""
        if not self._idle():
            return None
        if hasattr(type(self.sched), "on_idle") and not self.sched.is_fully_idle():
            # NOTE: 0.5.11+ on_idle checks only when fully idle, which the loop's next (empty) iteration makes
            # true: the finished requests leave the running and last batches there. With a request waiting that
            # iteration could admit it, outside any ``admit``: the check then gives no verdict instead
            if any(st == "waiting" for st in self._statuses().values()):
                return None
            self._step()
            if not self.sched.is_fully_idle():
                return None
        ok, message = self._run_idle_check()
        return IdleVerdict(ok, None, message)

    def chunk(self, rid: int) -> StepResult:
        """The scheduler's next step while request ``rid`` is chunked: the step caches the chunk it computed
        (``stash_chunked_request`` → ``cache_unfinished_req``) and prefills the next (``add_chunked_req``; waiting
        requests may join it in what is left of the budget). A request not being chunked is refused
        (``SchedulerError``, no step taken): SGLang chunks prompts only, at admission (``chunk_prompts_only``)."""
        if self.chunk_tokens is None:
            raise NotExpressible(f"SGLang {self.version} scheduler adapter: chunked prefill is off (no chunk)")
        r = self.reqs[rid]
        if not self._mid_prefill(r):
            raise not_chunked(rid, self._status(r))
        before = self._statuses()
        self._step()
        return self._outcome(before)

    def inject_failure(self) -> None:
        raise NotExpressible(f"SGLang {self.version} scheduler adapter: no allocation failure injection")

    # ------------------------------------------------------------ the snapshot

    @reads_one_dump
    def snapshot(self) -> SystemSnapshot:
        """SGLang's state in spec terms (reads only; the adapter's own record of last holders moves on)."""
        ledgers = self._observe()
        refs = {pool: {o: frozenset(xs) for o, xs in by.items()} for pool, by in self.refs.items()}
        table = self.sched.req_to_token_pool.req_to_token
        handles = self._handle_ids()
        restored = self._restored()
        requests: dict[int, RequestView] = {}
        rows: dict[int, RowView] = {}
        for rid, r in self.reqs.items():
            st = self._status(r)
            req = r.sg
            if req is None:
                requests[rid] = RequestView(rid, st, r.session, r.prompt, 0, 0, None)
                continue
            live = st in ("waiting", "running")
            row = int(req.req_pool_idx) if live and req.req_pool_idx is not None else None
            if rid in restored and st == "waiting":
                row = None  # NOTE: its session's row, restored for the retry; the session holds it
            tokens = tuple(int(t) for t in list(req.origin_input_ids) + list(req.output_ids))
            kv_len = int(req.kv_committed_len) if row is not None else 0
            requests[rid] = RequestView(
                rid, st, r.session, tokens, kv_len, self.prefix_lens.get(rid, 0), row, handles.get(request(rid))
            )
            if row is not None:
                n = int(req.kv_allocated_len)
                rows[row] = RowView(request(rid), tuple(int(x) for x in table[row, :n].tolist()), self._protected(req))
        sessions: dict[int, SessionView] = {}
        lent = self._lent()
        slots = self._slots()
        for sid in self._open_sessions():
            slot = slots.get(sid_name(sid))
            if slot is None or slot.req_pool_idx is None:
                sessions[sid] = SessionView(sid, 0, 0, None, (), lent.get(sid), handle=handles.get(session(sid)))
                continue
            row = int(slot.req_pool_idx)
            n = int(slot.kv_allocated_len)
            names = tuple(int(x) for x in table[row, :n].tolist())
            kept = handles.get(session(sid))
            if sid in lent:
                sessions[sid] = SessionView(sid, int(slot.kv_committed_len), n, row, (), lent[sid], handle=kept)
                continue
            sessions[sid] = SessionView(sid, int(slot.kv_committed_len), n, row, names, None, handle=kept)
            rows[row] = RowView(session(sid), names, self._protected(slot))
        locks, prefix = self._tree_state()
        return SystemSnapshot(
            ledgers=ledgers,
            references=refs,
            requests=requests,
            sessions=sessions,
            rows=rows,
            locks=locks,
            sizes=self.sizes(),
            page_size=self.ps,
            prefix=prefix,
        )

    # ------------------------------------------------------------ abstraction

    def _slots(self) -> dict[str, Any]:
        """The streaming-session slots of the session layer (0.5.10+), by session id; none in 0.5.9."""
        return dict(getattr(self.sched.tree_cache, "slots", {}) or {})

    def _live(self) -> Iterator[tuple[int, Any]]:
        """The requests SGLang still keeps (waiting or running); a finished ``Req`` is dropped, stale fields and all."""
        for rid, r in self.reqs.items():
            if r.sg is not None and self._status(r) in ("waiting", "running"):
                yield rid, r.sg

    def _restored(self) -> dict[int, tuple[int, str]]:
        """Request -> (session, status) for each live request whose fields are its session slot's own (restored).

        The session layer's match copies the slot's row, lengths and Mamba state into the request and keeps
        them in the slot, so a request the adder then rejects can be restored again: while such a request
        waits it names the session's memory without owning it; once it runs the memory is lent to it.
        """
        out: dict[int, tuple[int, str]] = {}
        slots = self._slots()
        for rid, req in self._live():
            sid = self.reqs[rid].session
            slot = slots.get(sid_name(sid)) if sid is not None else None
            if slot is not None and slot.req_pool_idx is not None and req.req_pool_idx == slot.req_pool_idx:
                out[rid] = (sid, self._status(self.reqs[rid]))  # type: ignore[assignment]
        return out

    def _lent(self) -> dict[int, int]:
        """Session -> the running request its slot's memory is lent to (the slot keeps naming it while lent)."""
        return {sid: rid for rid, (sid, st) in self._restored().items() if st == "running"}

    def _protected(self, req: Any) -> int:
        """How many leading tokens of ``req``'s row the tree holds (the rest of the row is the request's own): SGLang's
        ``cache_protected_len``, which the Python trees keep; on the C++ tree, which never updates it, read from the
        tree itself (:func:`~kvledger.contracts.adapters.sglang.legacy_cpp.cpp_row_boundary`)."""
        kept = int(req.cache_protected_len)
        if not self.cpp or getattr(req, "origin_input_ids", None) is None or req.req_pool_idx is None:
            return kept  # NOTE: a session slot (no tokens of its own) or a request without a row
        row = self.sched.req_to_token_pool.req_to_token[int(req.req_pool_idx), : int(req.kv_allocated_len)]
        return cpp_row_boundary(self._tree_view(locks=False), req, row.tolist(), kept)

    def references(self) -> dict[str, dict[Owner, set[int]]]:
        """Per pool, what each owner's own structures name (pages for paged KV)."""
        s = self.sched
        table = s.req_to_token_pool.req_to_token
        page = self.ps
        refs: dict[str, dict[Owner, set[int]]] = {"kv": {}, "req_to_token": {}}
        if self.config.mamba:
            refs["mamba"] = {}

        def add(pool: str, owner: Owner, xs: Iterable[int], unit: int = 1) -> None:
            got = {int(x) // unit for x in xs}
            if got:
                refs[pool].setdefault(owner, set()).update(got)

        def row_range(row: int, lo: int, hi: int) -> list[int]:
            return [int(x) for x in table[row, lo:hi].tolist()] if hi > lo else []

        def mamba_of(obj: Any) -> list[int]:
            out = []
            if getattr(obj, "mamba_pool_idx", None) is not None:
                out.append(int(obj.mamba_pool_idx))
            buf = getattr(obj, "mamba_ping_pong_track_buffer", None)
            if buf is not None and obj.req_pool_idx is not None:
                out.extend(int(x) for x in torch.as_tensor(buf).flatten().tolist())
            return out

        restored = self._restored()
        lent = self._lent()
        for rid, req in self._live():
            owner = request(rid)
            if rid in restored and rid not in lent.values():
                continue  # NOTE: a waiting request's restored copy of its session's memory: the session's
            if req.req_pool_idx is not None:
                row = int(req.req_pool_idx)
                add("req_to_token", owner, [row])
                add("kv", owner, row_range(row, self._protected(req), int(req.kv_allocated_len)), page)
            if self.config.mamba:
                add("mamba", owner, mamba_of(req))
        for sid_str, slot in self._slots().items():
            sid = _sid_of(sid_str)
            if sid in lent:
                continue
            owner = session(sid)
            if slot.req_pool_idx is not None:
                row = int(slot.req_pool_idx)
                add("req_to_token", owner, [row])
                add("kv", owner, row_range(row, self._protected(slot), int(slot.kv_allocated_len)), page)
            if self.config.mamba:
                add("mamba", owner, mamba_of(slot))
        view = self._tree_view()
        for nid, kv, mamba in view.node_values():
            add("kv", node_owner(nid, FULL), kv, page)
            if self.config.mamba and mamba is not None:
                add("mamba", node_owner(nid, MAMBA), mamba)
        return refs

    def _free(self) -> dict[str, tuple[int, int, list[int]]]:
        """Per pool: (capacity, base, free list as SGLang keeps it)."""
        s = self.sched
        a = s.token_to_kv_pool_allocator
        kv_free = [int(x) for x in torch.cat((a.free_pages, a.release_pages)).tolist()]
        cap = a.num_pages if self.ps > 1 else a.size
        # NOTE: the first row is 0 up to 0.5.10 and 1 from 0.5.11 (row 0 reserved): read from the fresh pool
        out = {
            "kv": (cap, 1, kv_free),
            "req_to_token": (s.req_to_token_pool.size, self.row_base, [int(x) for x in s.req_to_token_pool.free_slots]),
        }
        if self.config.mamba:
            m = s.req_to_token_pool.mamba_pool
            out["mamba"] = (m.size, 1, [int(x) for x in m.free_slots.tolist()])
        return out

    @reads_one_dump
    def _observe(self) -> dict[str, Ledger]:
        """Update who holds each slot in use (its last namer) and return the ledgers."""
        refs = self.references()
        ledgers: dict[str, Ledger] = {}
        for pool, (cap, base, free_list) in self._free().items():
            free = set(free_list)
            held = self.holders.update(pool, free, refs.get(pool, {}))
            by_owner: dict[Owner, set[int]] = {}
            for x, o in held.items():
                by_owner.setdefault(o, set()).add(x)
            seen: set[int] = set()
            for x in free_list:
                if x in seen:  # NOTE: twice on the free list (a double free): a second holder
                    by_owner.setdefault(DOUBLE_FREE_OWNER, set()).add(x)
                seen.add(x)
            ledgers[pool] = Ledger(
                pool, cap, frozenset(seen), {o: frozenset(xs) for o, xs in by_owner.items() if xs}, base
            )
        self.refs = refs
        return ledgers

    def _tree_view(self, locks: bool = True) -> Any:
        """The cache adapters' own abstraction of the radix tree, over the scheduler's tree cache (``locks``: with
        the handles the live requests and session slots hold; without, for a read of the tree alone)."""
        from kvledger.contracts.adapters.sglang import legacy, legacy_cpp

        if self.no_cache:
            return _NoTree()
        if self.cpp:
            cls: type[Any] = legacy_cpp.LegacyCppAdapter
        else:
            cls = legacy.LegacyMambaAdapter if self.config.mamba else legacy.LegacyRadixAdapter
        view = object.__new__(cls)
        view.cache = getattr(self.sched.tree_cache, "inner", self.sched.tree_cache)
        view.ps = self.ps
        view.ids = self.ids
        view.sg = self.sg
        view.locks = self._lock_handles(view) if locks else {}
        return view

    def _lock_handles(self, view: Any) -> dict[HandleId, Any]:
        """One handle per lock a live request or session slot holds on its ``last_node``."""
        from kvledger.contracts.adapters.sglang.legacy import LegacyLock

        out: dict[HandleId, Any] = {}

        def add(hid: int, last: Any) -> None:
            if not view.lockable(last):
                return
            mamba = self.config.mamba and getattr(last, "mamba_value", None) is not None
            out[HandleId(hid)] = LegacyLock(HandleId(hid), last, mamba, None, ())  # type: ignore[arg-type]

        for hid, last in self._lockers().values():
            add(hid, last)
        return out

    def _lockers(self) -> dict[Owner, tuple[int, Any]]:
        """Who holds a lock on the tree, with its handle id and node: running requests and session slots."""
        out: dict[Owner, tuple[int, Any]] = {}
        for rid, req in self._live():
            if self._status(self.reqs[rid]) == "running" and req.last_node is not None:
                out[request(rid)] = (lock_handle(request(rid)), req.last_node)
        for sid_str, slot in self._slots().items():
            if slot.last_node is not None:
                out[session(_sid_of(sid_str))] = (lock_handle(session(_sid_of(sid_str))), slot.last_node)
        return out

    def _handle_ids(self) -> dict[Owner, int]:
        if "locks" not in self.capabilities:
            return {}
        view = self._tree_view()
        return {o: hid for o, (hid, _) in self._lockers().items() if HandleId(hid) in view.locks}

    def _tree_state(self) -> tuple[LockState | None, PrefixCache | None]:
        """The tree's lock state (capability ``locks``) and its content in spec terms (``prefix_cache``), through the
        cache adapters' own abstraction, from one walk of the tree; ``None`` for what the adapter does not show."""
        want_locks, want_prefix = "locks" in self.capabilities, "prefix_cache" in self.capabilities
        if not (want_locks or want_prefix):
            return None, None
        view = self._tree_view()
        full, end, _ = view._base_snapshot()
        states, _, mamba_ref, _ = view.mamba_tree() if self.config.mamba else ({}, {}, {}, {})
        locks: LockState | None = view._locks(end, mamba_ref) if want_locks else None
        prefix = PrefixCache(self.ps, None, self.config.mamba, full, frozenset(), states) if want_prefix else None
        return locks, prefix

    def sizes(self) -> dict[Component, tuple[int, int]]:
        t = getattr(self.sched.tree_cache, "inner", self.sched.tree_cache)
        if self.config.mamba and not self.no_cache:  # NOTE: a ChunkCache keeps no Mamba state and counts none
            return {
                FULL: (int(t.full_evictable_size()), int(t.full_protected_size())),
                MAMBA: (int(t.mamba_evictable_size()), int(t.mamba_protected_size())),
            }
        return {FULL: (int(t.evictable_size()), int(t.protected_size()))}

    def oracle_calls(self) -> int:
        """How many batches the fake model worker ran (prefill and decode)."""
        return int(self.sched.model_worker.calls)

    # ------------------------------------------------------------ oracle

    def next_token(self, req: Any) -> int:
        r = self.reqs.get(self.by_name.get(req.rid, -1))
        if r is not None and r.eos:
            return EOS
        seq = list(req.origin_input_ids) + list(req.output_ids)
        return 2 + (int(seq[-1]) * 7 + len(seq)) % (VOCAB - 2)


class _Flags(SimpleNamespace):
    """A namespace whose unset ``enable_*`` / ``is_*`` / ``use_*`` flags read as ``False``, each logged once."""

    def __init__(self, log_to: list[str], label: str, **fields: Any) -> None:
        super().__init__(**fields)
        object.__setattr__(self, "_log_to", log_to)
        object.__setattr__(self, "_label", label)

    def __getattr__(self, name: str) -> Any:
        if name.startswith(FLAG_PREFIXES):
            self._log_to.append(f"{self._label}.{name}")
            log.info("SGLang %s.%s was not set: read as False", self._label, name)
            object.__setattr__(self, name, False)
            return False
        raise AttributeError(f"{self._label} has no attribute {name!r} (not set by kvledger)")


def _sid_of(name: str) -> int:
    return int(name.removeprefix("kvs"))


def _no_op(*_: Any, **__: Any) -> None:
    return None


class _NullContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: Any) -> None:
        return None


def _null_context(*_: Any, **__: Any) -> _NullContext:
    return _NullContext()


def _no_track_buffers(config: SystemConfig) -> SystemConfig:
    """``config`` as the factories drive it: a Mamba model without the ping-pong track buffers (SGLang's default:
    the extra-buffer mode off); the adapter's ``config`` says so (``ping_pong=0``), and the buffers' laws are not
    checked."""
    return dataclasses.replace(config, ping_pong=0) if config.mamba and config.ping_pong > 0 else config


def scheduler_factory(config: SystemConfig) -> SchedulerAdapter:
    """The installed SGLang's (0.5.9 to 0.5.12) real ``Scheduler`` over the cache ``config`` asks for (a Mamba model
    without track buffers: :func:`_no_track_buffers`)."""
    return SchedulerAdapter(_no_track_buffers(config))


def chunked_scheduler_factory(config: SystemConfig) -> SchedulerAdapter:
    """:func:`scheduler_factory` with SGLang's chunked prefill on (``chunked_prefill_size``: ``CHUNK_PAGES`` pages,
    at least ``MIN_CHUNK`` tokens): a prompt longer than a chunk is admitted with its first chunk and prefilled over
    the next steps (the protocol's ``chunk``), each chunk cached in the tree before the next runs."""
    return SchedulerAdapter(_no_track_buffers(config), chunk_tokens=chunk_size(config))


def scheduler_cpp_factory(config: SystemConfig) -> SchedulerAdapter:
    """:func:`scheduler_factory` on SGLang's C++ radix tree (``RadixCacheCpp``, as
    ``SGLANG_EXPERIMENTAL_CPP_RADIX_TREE=1`` builds it; full attention only), read through its ``debug_print``
    dump (:mod:`~kvledger.contracts.adapters.sglang.legacy_cpp`)."""
    return SchedulerAdapter(config, cpp=True)


def scheduler_nocache_factory(config: SystemConfig) -> SchedulerAdapter:
    """:func:`scheduler_factory` with ``--disable-radix-cache`` (SGLang's ``ChunkCache`` under the session layer)."""
    return SchedulerAdapter(_no_track_buffers(config), no_cache=True)


def chunked_scheduler_nocache_factory(config: SystemConfig) -> SchedulerAdapter:
    """:func:`scheduler_nocache_factory` with chunked prefill on (:func:`chunked_scheduler_factory`)."""
    return SchedulerAdapter(_no_track_buffers(config), chunk_tokens=chunk_size(config), no_cache=True)


def chunked_scheduler_cpp_factory(config: SystemConfig) -> SchedulerAdapter:
    """:func:`chunked_scheduler_factory` on SGLang's C++ radix tree (:func:`scheduler_cpp_factory`)."""
    return SchedulerAdapter(config, chunk_tokens=chunk_size(config), cpp=True)
