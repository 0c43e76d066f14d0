"""vLLM's v1 KV cache manager, driven the way vLLM's own scheduler drives it, observed in spec terms.

The adapter builds vLLM's real ``KVCacheManager`` (with its ``BlockPool``,
``FreeKVCacheBlockQueue``, single-type managers and coordinator where the
release has them) and drives it at the request level:

* ``add_request`` makes a vLLM ``Request`` (with the release's block hasher);
* ``admit(budget)`` runs, for the waiting requests in order, what the
  scheduler runs: ``get_computed_blocks`` then ``allocate_slots`` (a ``None``
  is a refusal: the request stays waiting and the scheduler stops);
* ``extend(rid, n, ahead)`` runs decode steps until ``n`` tokens are
  computed, each an ``allocate_slots`` (or ``append_slots``) followed by the
  tokens being appended; a step that does not fit preempts running requests,
  newest first, as the scheduler does, until it fits or ``rid`` itself is
  preempted. With ``ahead`` (speculative decoding, 0.7 on) each step carries
  up to ``ahead`` draft tokens (``Request.spec_token_ids``) and asks as many
  lookahead slots (``num_lookahead_tokens``, 0.8 on); the verification accepts
  a varying number of them and the rejected ones roll ``num_computed_tokens``
  back, as the scheduler's ``update_from_output`` does;
* ``finish`` / ``abort`` call ``free``; ``retract`` preempts as the scheduler
  does (``free``, then back to waiting with nothing computed).

vLLM folds match + lock + allocate + insert into ``allocate_slots`` and
unlock + free into ``free``; it has no explicit eviction (allocation pops the
queue's head), so the adapter declares no ``evict``.

:meth:`VLLMAdapter.shared_snapshot` is the abstraction function: per block its
holders (the requests whose block tables name it, one per kv-cache group
component), vLLM's ``ref_cnt``, the free queue walked from its head with every
block's links (:class:`kvledger.spec.lru.LruState`), the null block as a
sentinel, the hash index with the hashes blocks carry, and the counters vLLM
keeps beside their recounts. Every release's API shape is read by
introspection of the installed release (``docs/vllm.md`` lists the shapes).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvledger.contracts.adapters.protocol import Unsupported
from kvledger.contracts.adapters.system import RequestView, SharedBlocks, StepResult, SystemConfig, SystemSnapshot
from kvledger.contracts.adapters.vllm.cpu_import import import_vllm
from kvledger.spec.errors import InvalidArgument
from kvledger.spec.lru import SENTINEL, Links, LruState
from kvledger.spec.shared import SharedPool
from kvledger.spec.types import Component, NodeId, Owner, OwnerKind

__all__ = ["RequestState", "SharedSnapshot", "VLLMAdapter", "vllm_factory", "vllm_hybrid_factory", "vllm_mamba_factory"]


@dataclass(frozen=True)
class RequestState:
    """One request the engine knows, in spec terms."""

    rid: int
    status: str  # "waiting" | "running" | "finished" | "aborted"
    tokens: tuple[int, ...]
    kv_len: int  # tokens whose KV is computed
    prefix_len: int  # tokens the last admission found cached


@dataclass(frozen=True)
class SharedSnapshot:
    """The abstraction of an engine with shared blocks: pools, their free queues, counters and requests."""

    pools: Mapping[str, SharedPool]
    queues: Mapping[str, LruState]
    counters: Mapping[str, tuple[int, int]]
    requests: Mapping[int, RequestState]
    problems: tuple[tuple[str, str], ...] = ()
    """Laws the abstraction function itself found broken (a queue walk that loops or leaves the pool)."""


def _vocab_token(rid: int, pos: int) -> int:
    """The token request ``rid`` generates at position ``pos``: a tiny vocabulary, so prefixes repeat."""
    return (rid * 7 + pos * 3) % 5 + 1


def _accepted(rid: int, pos: int, drafts: int) -> int:
    """How many of ``drafts`` draft tokens from position ``pos`` the verification accepts (0 to all, varying)."""
    return (rid * 5 + pos * 3) % (drafts + 1)


def _draft_token(rid: int, pos: int, right: bool) -> int:
    """The draft at position ``pos``: the token the model then samples there, or (rejected) another one."""
    token = _vocab_token(rid, pos)
    return token if right else token % 5 + 1


class VLLMAdapter:
    """vLLM's ``KVCacheManager`` at the request level (see the module docstring)."""

    name = "vllm"
    capabilities = frozenset({"abort", "retract", "targeted_admission"})
    """Of the protocol's capabilities. The shared-block laws (``shared_snapshot``) are checked by
    :mod:`kvledger.contracts.machines.block_machine`; the single-owner ledgers of ``snapshot`` stay empty. An
    instance adds ``speculative`` where the release decodes drafts (``Request.spec_token_ids``, 0.7 on) and the model
    has no Mamba group (vLLM keeps a Mamba request's draft states in ``MambaSpec.num_speculative_blocks``, which the
    adapter does not configure)."""

    def __init__(
        self,
        block_size: int = 4,
        num_blocks: int = 12,
        max_model_len: int = 32,
        window: int | None = None,
        config: SystemConfig | None = None,
        mamba: bool = False,
    ) -> None:
        self.version = import_vllm()
        self.config = config or SystemConfig(page_size=block_size, window=window, kv_tokens=num_blocks * block_size)
        self.refused: list[tuple[int, SharedPool, SharedPool]] = []
        """``(rid, before, after)`` of every refused admission since the last :meth:`take_refused`."""
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        self.window = window
        self.mamba = mamba
        self._m = {
            name: importlib.import_module(f"vllm.v1.core.{name}") for name in ("kv_cache_manager", "kv_cache_utils")
        }
        self._request_mod = importlib.import_module("vllm.v1.request")
        self._sampling = importlib.import_module("vllm.sampling_params")
        kvm = self._m["kv_cache_manager"].KVCacheManager
        self._init_params = set(inspect.signature(kvm.__init__).parameters)
        if window is not None and not self._hybrid_capable():
            raise ValueError(f"vLLM {self.version} has no hybrid (full + sliding window) KV cache manager")
        if mamba and not self._mamba_capable():
            raise Unsupported(
                f"vLLM {self.version} caches no Mamba state (mamba_cache_mode 'align' and a hybrid coordinator are "
                "needed)"
            )
        self.mgr = self._build_manager(kvm)
        self.engine_class = f"{kvm.__module__}.{kvm.__qualname__}"
        alloc = inspect.signature(self.mgr.allocate_slots).parameters
        self._alloc_params = set(alloc)
        if not mamba and hasattr(self._request_mod.Request, "num_tokens_with_spec"):
            self.capabilities = VLLMAdapter.capabilities | {"speculative"}
        self._hasher = self._block_hasher()
        self.requests: dict[int, Any] = {}
        self.status: dict[int, str] = {}
        self.prefix: dict[int, int] = {}
        self.waiting: list[int] = []
        self.running: list[int] = []
        """Running requests in admission order (vLLM's FCFS scheduler preempts from the end)."""
        self._next = 0
        self._written: dict[int, Hashable] = {}
        self._meaning: dict[Hashable, tuple[int, ...]] = {}

    # ------------------------------------------------------------ construction

    def _hybrid_capable(self) -> bool:
        # NOTE: 0.8.x takes a kv_cache_config but asserts a single group; the coordinators (0.9 on) drive several.
        return "kv_cache_config" in self._init_params and _has_module("vllm.v1.core.kv_cache_coordinator")

    def _mamba_capable(self) -> bool:
        """The release caches Mamba states by prefix (``MambaSpec.mamba_cache_mode``, ``'align'``)."""
        if not self._hybrid_capable():
            return False
        iface = importlib.import_module("vllm.v1.kv_cache_interface")
        spec = getattr(iface, "MambaSpec", None)
        return spec is not None and "mamba_cache_mode" in {f.name for f in dataclasses.fields(spec)}

    def _spec(self, cls: Any, **values: Any) -> Any:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def _build_manager(self, kvm: Any) -> Any:
        if "kv_cache_config" not in self._init_params:
            # 0.6.6.post1 / 0.7.x: the pool lives on the manager; the scheduler passes these four.
            return kvm(
                block_size=self.block_size,
                num_gpu_blocks=self.num_blocks,
                max_model_len=self.max_model_len,
                sliding_window=None,
                enable_caching=True,
            )
        import torch

        iface = importlib.import_module("vllm.v1.kv_cache_interface")
        common = {"block_size": self.block_size, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
        groups = [iface.KVCacheGroupSpec(["full"], self._spec(iface.FullAttentionSpec, use_mla=False, **common))]
        if self.window is not None:
            swa = self._spec(iface.SlidingWindowSpec, use_mla=False, sliding_window=self.window, **common)
            groups.append(iface.KVCacheGroupSpec(["swa"], swa))
        if self.mamba:
            # NOTE: one state per block of tokens, cached at block ends ('align'), one block size for every group.
            state = self._spec(
                iface.MambaSpec,
                block_size=self.block_size,
                shapes=((1,),),
                dtypes=(torch.float32,),
                mamba_cache_mode="align",
            )
            groups.append(iface.KVCacheGroupSpec(["mamba"], state))
        # NOTE: the tensors are named `tensors` (a dict by layer) in 0.8.x, `kv_cache_tensors` (a list) later.
        config = self._spec(
            iface.KVCacheConfig, num_blocks=self.num_blocks, kv_cache_tensors=[], tensors={}, kv_cache_groups=groups
        )
        kwargs: dict[str, Any] = {
            "kv_cache_config": config,
            "max_model_len": self.max_model_len,
            "enable_caching": True,
        }
        for name in ("scheduler_block_size", "hash_block_size"):
            if name in self._init_params:
                kwargs[name] = self.block_size
        return kvm(**kwargs)

    def _block_hasher(self) -> Any:
        if "block_hasher" not in inspect.signature(self._request_mod.Request.__init__).parameters:
            return None  # the manager hashes blocks itself
        utils = self._m["kv_cache_utils"]
        try:
            hashing = importlib.import_module("vllm.utils.hashing")
        except ImportError:
            hashing = importlib.import_module("vllm.utils")
        fn = hashing.get_hash_fn_by_name("sha256")  # NOTE: sha256_cbor needs cbor2, stubbed here
        utils.init_none_hash(fn)
        return utils.get_request_block_hasher(self.block_size, fn)

    # ------------------------------------------------------------ the engine's structures

    @property
    def pool(self) -> Any:
        """The block pool object: the coordinator's (0.9 on), the manager's (0.8), or the manager itself (0.6–0.7)."""
        pool = getattr(getattr(self.mgr, "coordinator", self.mgr), "block_pool", None)
        # NOTE: before BlockPool (0.6.6.post1, 0.7.x) the manager's block_pool is the list of blocks.
        return pool if hasattr(pool, "free_block_queue") else self.mgr

    def _blocks(self) -> list[Any]:
        pool = self.pool
        return list(pool.blocks if hasattr(pool, "blocks") else pool.block_pool)

    def _queue(self) -> Any:
        return self.pool.free_block_queue

    def _groups(self) -> list[tuple[Component | None, Mapping[str, list[Any]]]]:
        """``(component, req_to_blocks)`` per kv-cache group; the component is ``None`` with one group."""
        if not hasattr(self.mgr, "coordinator"):
            return [(None, self.mgr.req_to_blocks)]
        managers = self.mgr.coordinator.single_type_managers
        if len(managers) == 1:
            return [(None, managers[0].req_to_blocks)]
        out: list[tuple[Component | None, Mapping[str, list[Any]]]] = []
        for m in managers:
            kind = type(m).__name__
            comp = Component.SWA if "Sliding" in kind else Component.MAMBA if "Mamba" in kind else Component.FULL
            out.append((comp, m.req_to_blocks))
        return out

    def _index_maps(self) -> list[dict[Any, Any]]:
        """The engine's own hash-index dicts, as it keeps them.

        Before 0.34 one dict from key to a block or ``{block_id: block}`` (bare, or as a
        ``BlockHashToBlockMap``'s ``_cache``); from 0.34 the map's ``_cache`` holds one block id per
        key and ``_dup_ids`` every id of a key that several blocks cache (``{block_id: None}``).
        """
        index = self.pool.cached_block_hash_to_block
        own = getattr(index, "_cache", index)
        dups = getattr(index, "_dup_ids", None)
        return [own] if dups is None else [own, dups]

    def _index(self) -> dict[Any, set[int]]:
        """Key to the ids of the blocks the index names under it, read from every shape the index had."""
        out: dict[Any, set[int]] = {}
        for entries in self._index_maps():
            for k, v in entries.items():
                ids = out.setdefault(k, set())
                if isinstance(v, int):
                    ids.add(v)
                elif hasattr(v, "block_id"):
                    ids.add(v.block_id)
                else:
                    ids.update(b if x is None else x.block_id for b, x in v.items())
        return out

    # ------------------------------------------------------------ requests

    def _make_request(self, rid: int, tokens: tuple[int, ...]) -> Any:
        sp_cls = self._sampling.SamplingParams
        sp = sp_cls(max_tokens=self.max_model_len) if "max_tokens" in _params(sp_cls) else sp_cls()
        req_cls = self._request_mod.Request
        params = inspect.signature(req_cls.__init__).parameters
        values: dict[str, Any] = {
            "request_id": str(rid),
            "prompt": None,
            "prompt_token_ids": list(tokens),
            "multi_modal_inputs": None,
            "multi_modal_hashes": None,
            "multi_modal_placeholders": None,
            "multi_modal_kwargs": None,
            "mm_features": None,
            "sampling_params": sp,
            "pooling_params": None,
            "eos_token_id": None,
            "arrival_time": 0.0,
            "block_hasher": self._hasher,
        }
        if "inputs" in params:  # 0.6.6.post1
            values["inputs"] = importlib.import_module("vllm.inputs").token_inputs(prompt_token_ids=list(tokens))
        kwargs = {}
        for name, p in params.items():
            if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if name in values:
                kwargs[name] = values[name]
            elif p.default is p.empty:
                raise TypeError(f"vLLM {self.version} Request needs {name!r}, which the adapter does not know")
        return req_cls(**kwargs)

    def add_request(self, tokens: tuple[int, ...], session: int | None = None) -> int:
        """A new waiting request with prompt ``tokens``; returns its id."""
        if session is not None:
            raise ValueError("add_request: vLLM's KV cache manager has no sessions")
        if not tokens or len(tokens) >= self.max_model_len:
            raise InvalidArgument(
                "add_request",
                "kv",
                (),
                f"a prompt of {len(tokens)} tokens (0 < length < max_model_len {self.max_model_len})",
            )
        rid = self._next
        self._next += 1
        self.requests[rid] = self._make_request(rid, tuple(tokens))
        self.status[rid] = "waiting"
        self.prefix[rid] = 0
        self.waiting.append(rid)
        return rid

    def _computed(self, req: Any) -> tuple[Any, int]:
        """``get_computed_blocks`` as the release's scheduler calls it: ``(blocks, number of computed tokens)``."""
        got = self.mgr.get_computed_blocks(req)
        if isinstance(got, tuple):
            blocks, n = got[0], int(got[1])
        else:  # 0.6.6.post1: a list of blocks
            blocks, n = got, len(got) * self.block_size
        if n == req.num_tokens and not hasattr(blocks, "blocks"):
            # NOTE: 0.6.6.post1's scheduler recomputes the last block of a fully cached prompt itself.
            blocks = list(blocks)[:-1]
            n -= self.block_size
        return blocks, n

    def _allocate(self, req: Any, n_new: int, blocks: Any = None, n_computed: int = 0, lookahead: int = 0) -> Any:
        """``allocate_slots`` in the release's shape; ``lookahead``: the step's draft tokens (already in
        ``req.spec_token_ids``), passed as ``num_lookahead_tokens`` (0.8 on) and ``num_draft_tokens`` (0.9)."""
        extra: dict[str, int] = {}
        if lookahead:
            for name in ("num_lookahead_tokens", "num_draft_tokens"):
                if name in self._alloc_params:
                    extra[name] = lookahead
        if "num_new_computed_tokens" in self._alloc_params:
            return self.mgr.allocate_slots(req, n_new, n_computed, blocks, **extra)
        if "computed_blocks" in self._alloc_params:  # 0.6.6.post1: new requests only
            if blocks is None:
                return self.mgr.append_slots(req, n_new)
            return self.mgr.allocate_slots(req, n_new, list(blocks))
        return self.mgr.allocate_slots(req, n_new, list(blocks) if blocks is not None else None, **extra)

    def _forget_written(self, new_blocks: Any) -> None:
        groups = getattr(new_blocks, "blocks", None)
        for group in groups if groups is not None else [new_blocks or []]:
            for b in group:
                self._written.pop(b.block_id, None)

    def _step_done(self, rid: int, n: int, sampled: int = 1) -> None:
        """A step of request ``rid`` computed ``n`` tokens and sampled ``sampled`` (kept drafts and the token after)."""
        req = self.requests[rid]
        req.num_computed_tokens += n
        for _ in range(sampled):
            req.append_output_token_ids(_vocab_token(rid, req.num_tokens))
        self._learn_meanings()
        self._observe_writes()

    def _sentinels(self) -> frozenset[int]:
        """The null block's id (it stands in for skipped positions), where the release has one."""
        null = getattr(self.pool, "null_block", None)
        return frozenset({null.block_id}) if null is not None else frozenset()

    def _observe_writes(self) -> None:
        """What each holder has computed into its blocks so far, a block it filled in part too.

        Observed after every step, before every ``free`` and at every snapshot, so the content of a block is its
        last writer's even when the block was filled and released between two snapshots. A key on a block whose
        writer filled it only in part names content the block does not hold (``inv_keys_match_content``).
        """
        sentinels = self._sentinels()
        group_of = hasattr(self.mgr, "coordinator")
        for gid, (_, tables) in enumerate(self._groups()):
            for rid_s, table in tables.items():
                req = self.requests.get(int(rid_s))
                if req is None:
                    continue
                computed, tokens = req.num_computed_tokens, None
                for pos, b in enumerate(table):
                    upto = min((pos + 1) * self.block_size, computed)
                    if upto <= pos * self.block_size:
                        break
                    if b.block_id not in sentinels:
                        tokens = tokens if tokens is not None else tuple(req.all_token_ids)
                        self._written[b.block_id] = (tokens[:upto], gid if group_of else None)

    def take_refused(self) -> list[tuple[int, SharedPool, SharedPool]]:
        """The refused admissions since the last call, each with the pool before the attempt and after it."""
        out, self.refused = self.refused, []
        return out

    def admit(self, budget: int, rid: int | None = None) -> StepResult:
        """One prefill step: admit waiting requests in order (or just ``rid``) while they fit ``budget``."""
        self._new_step()
        admitted: list[int] = []
        rejected: list[int] = []
        refused = self.refused
        targets = [rid] if rid is not None and rid in self.waiting else list(self.waiting)
        for rid in targets:
            req = self.requests[rid]
            before = self.pool_state()
            blocks, n_hit = self._computed(req)
            n_new = req.num_tokens - n_hit
            if n_new > budget:
                rejected.append(rid)
                refused.append((rid, before, self.pool_state()))
                break
            new = self._allocate(req, n_new, blocks, n_hit)
            if new is None:
                rejected.append(rid)
                refused.append((rid, before, self.pool_state()))
                break
            self._forget_written(new)
            self.waiting.remove(rid)
            self.running.append(rid)
            budget -= n_new
            self.status[rid] = "running"
            self.prefix[rid] = n_hit
            req.num_computed_tokens = n_hit
            self._step_done(rid, n_new)
            admitted.append(rid)
        return StepResult(admitted=tuple(admitted), rejected=tuple(rejected))

    def extend(self, rid: int, n: int, ahead: int = 0) -> StepResult:
        """Decode steps of running request ``rid`` until ``n`` more tokens are computed; a step that does not fit
        preempts, as vLLM's scheduler does.

        A refused step preempts the newest running request (:meth:`retract`) and is tried again, until it fits
        or ``rid`` itself was preempted. So ``rid`` ends running with ``n`` more tokens computed, finished (its
        context is full), or back to waiting; the preempted requests are in the result's ``retracted``.

        ``ahead`` (with ``speculative``): each step schedules the last token and up to ``ahead`` drafts, with as
        many lookahead slots; ``_accepted`` decides how many drafts the verification keeps (never more than
        ``n`` needs), the rest roll ``num_computed_tokens`` back, and the step appends the kept drafts and the
        token sampled after them.
        """
        if self.status.get(rid) != "running":
            raise ValueError(f"extend: request {rid} is not running")
        if "speculative" not in self.capabilities:
            ahead = 0  # NOTE: a release (or model) without drafts decodes plainly, as the protocol lets it
        preempted: list[int] = []
        done = 0
        while done < n:
            req = self.requests[rid]
            if req.num_tokens >= self.max_model_len:
                return dataclasses.replace(self.finish(rid), retracted=tuple(preempted))
            self._new_step()
            # NOTE: the scheduler keeps a step inside the context: position num_computed + scheduled < max_model_len.
            # With a sliding window a step drafts fewer than half the window: the checked windows are a few blocks,
            # real ones hundreds to thousands of tokens against a handful of drafts, and a step that accepts a
            # window's worth of drafts reaches states no deployment does (0.9.2 then asserts in cache_full_blocks)
            cap = ahead if self.window is None else min(ahead, max(0, self.window // 2 - 1))
            drafts = max(0, min(cap, self.max_model_len - 1 - req.num_tokens))
            base, accepted = req.num_tokens, _accepted(rid, req.num_tokens, drafts)
            scheduled = base + drafts - req.num_computed_tokens
            if drafts:
                req.spec_token_ids = [_draft_token(rid, base + i, i < accepted) for i in range(drafts)]
            try:
                # NOTE: vLLM's Scheduler.schedule (FCFS): on a refused decode allocation it pops the last running
                # request, preempts it and retries; when that was the request being scheduled, it stops.
                new = self._allocate(req, scheduled, lookahead=drafts)
                while new is None:
                    victim = self.running[-1]
                    self.retract(victim)
                    preempted.append(victim)
                    if victim == rid:
                        return StepResult(retracted=tuple(preempted))
                    new = self._allocate(req, scheduled, lookahead=drafts)
            finally:
                if drafts:
                    req.spec_token_ids = []  # NOTE: the scheduler clears them once scheduled (0.34; set anew per step)
            self._forget_written(new)
            kept = min(accepted, n - done - 1)
            # NOTE: the scheduler counts every scheduled token computed, the verification rolls the rejected back
            self._step_done(rid, scheduled - (drafts - kept), kept + 1)
            done += kept + 1
        return StepResult(retracted=tuple(preempted))

    def _new_step(self) -> None:
        """A scheduler step starts: the manager's per-step state is reset, as ``Scheduler.schedule`` does (0.33.0
        on: Mamba's ``cached_blocks_this_step``, states a request cached this step that others may not use yet)."""
        starts = getattr(self.mgr, "new_step_starts", None)
        if starts is not None:
            starts()

    def _free(self, rid: int) -> None:
        req = self.requests[rid]
        self._learn_meanings()  # NOTE: before the release drops the request's hashes (free_block_hashes)
        self._observe_writes()
        self.mgr.free(req)
        if hasattr(self.mgr, "free_block_hashes"):
            self.mgr.free_block_hashes(req)

    def finish(self, rid: int) -> StepResult:
        """The request ends: ``free``."""
        if self.status.get(rid) != "running":
            raise ValueError(f"finish: request {rid} is not running")
        self._free(rid)
        self.running.remove(rid)
        self.status[rid] = "finished"
        return StepResult(finished=(rid,))

    def abort(self, rid: int) -> StepResult:
        """The request is aborted, waiting or running: ``free``."""
        if self.status.get(rid) not in ("waiting", "running"):
            raise ValueError(f"abort: request {rid} is not live")
        self._free(rid)
        if rid in self.waiting:
            self.waiting.remove(rid)
        if rid in self.running:
            self.running.remove(rid)
        self.status[rid] = "aborted"
        return StepResult(finished=(rid,))

    def retract(self, rid: int) -> StepResult:
        """Preempt a running request as vLLM's scheduler does: ``free``, nothing computed, back to the queue's front."""
        if self.status.get(rid) != "running":
            raise ValueError(f"retract: request {rid} is not running")
        req = self.requests[rid]
        self._learn_meanings()
        self._observe_writes()
        self.mgr.free(req)
        req.num_computed_tokens = 0
        self.running.remove(rid)
        self.status[rid] = "waiting"
        self.waiting.insert(0, rid)
        return StepResult(retracted=(rid,))

    # ------------------------------------------------------------ abstraction

    def _learn_meanings(self) -> None:
        """Each block hash a request computed names the token prefix it chains over.

        Learned after every step and before every ``free`` (0.7.x drops a finished request's hashes), so a
        hash the index holds is always known by the time a snapshot reads it.
        """
        for req in self.requests.values():
            hashes = getattr(req, "block_hashes", None)
            if hashes is None:
                hashes = getattr(req, "kv_block_hashes", None)
            if hashes is None:
                hashes = getattr(self.mgr, "req_to_block_hashes", {}).get(req.request_id, [])
            tokens = tuple(req.all_token_ids)
            for i, h in enumerate(hashes):
                self._meaning.setdefault(_hashable(h), tokens[: (i + 1) * self.block_size])

    def _key(self, engine_key: Any, group: int | None = None) -> Hashable:
        utils = self._m["kv_cache_utils"]
        if hasattr(utils, "get_block_hash") and isinstance(engine_key, bytes):
            raw, gid = utils.get_block_hash(engine_key), utils.get_group_id(engine_key)
        elif hasattr(engine_key, "block_hash") and hasattr(engine_key, "group_id"):  # 0.9.x: BlockHashWithGroupId
            raw, gid = engine_key.block_hash, engine_key.group_id
        else:
            raw, gid = engine_key, group
        meaning = self._meaning.get(_hashable(raw))
        return (meaning if meaning is not None else ("unknown hash", _hashable(raw)), gid)

    def pool_state(self) -> SharedPool:
        """The abstraction of the block pool (holders, counts, queue, sentinel, keys, index, content)."""
        self._learn_meanings()
        blocks = self._blocks()
        sentinels = self._sentinels()
        holders: dict[int, list[Owner]] = {}
        content: dict[int, Hashable] = {}
        for comp, tables in self._groups():
            for rid_s, table in tables.items():
                owner = Owner(OwnerKind.REQUEST, int(rid_s), comp)
                for b in table:
                    holders.setdefault(b.block_id, []).append(owner)
        self._observe_writes()
        for b in blocks:
            if b.block_id in self._written:
                content[b.block_id] = self._written[b.block_id]
        keys: dict[int, set[Hashable]] = {}
        extra = getattr(self.pool, "cached_block_hashes_by_block", {})
        for b in blocks:
            own = getattr(b, "block_hash", None)
            carried = ([own] if own is not None else []) + list(extra.get(b.block_id, ()))
            if carried:
                keys[b.block_id] = {self._key(k) for k in carried}
        index: dict[Hashable, set[int]] = {}
        for k, ids in self._index().items():
            index.setdefault(self._key(k), set()).update(ids)
        order, _ = self._walk()
        return SharedPool(
            "kv",
            len(blocks),
            {b: tuple(sorted(o)) for b, o in holders.items()},
            {b.block_id: b.ref_cnt for b in blocks},
            order,
            sentinels,
            {b: frozenset(k) for b, k in keys.items()},
            {k: frozenset(v) for k, v in index.items()},
            content,
        )

    def _walk(self) -> tuple[tuple[int, ...], list[tuple[str, str]]]:
        """The free queue from its head (stopping at a loop or a foreign block), and what went wrong."""
        q = self._queue()
        fake_head = getattr(q, "fake_free_list_head", None)
        fake_tail = getattr(q, "fake_free_list_tail", None)
        node = fake_head.next_free_block if fake_head is not None else q.free_list_head
        order: list[int] = []
        seen: set[int] = set()
        problems: list[tuple[str, str]] = []
        while node is not None and node is not fake_tail:
            if node.block_id in seen:
                problems.append(("inv_lru_links_symmetric", f"the free queue loops back to block {node.block_id}"))
                break
            seen.add(node.block_id)
            order.append(node.block_id)
            node = node.next_free_block
        return tuple(order), problems

    def queue_state(self) -> LruState:
        """The free queue as an intrusive list: its order from the head, and every block's links."""
        q = self._queue()
        fakes = {id(x) for x in (getattr(q, "fake_free_list_head", None), getattr(q, "fake_free_list_tail", None))}
        order, _ = self._walk()
        members = set(order)
        links: dict[NodeId, Links] = {}
        for b in self._blocks():

            def name(x: Any, member: bool = b.block_id in members) -> NodeId | None:
                if x is None:
                    return None
                if id(x) in fakes:
                    return None if member else SENTINEL
                return NodeId(int(x.block_id))

            links[NodeId(b.block_id)] = (name(b.prev_free_block), name(b.next_free_block))
        return LruState(tuple(NodeId(b) for b in order), links)

    def counters(self) -> dict[str, tuple[int, int]]:
        """Counters vLLM keeps, beside a recount of what they count."""
        order, _ = self._walk()
        return {"free_block_queue.num_free_blocks": (self._queue().num_free_blocks, len(order))}

    def snapshot(self) -> SystemSnapshot:
        """The protocol's snapshot: the requests and the shared blocks (single-owner ledgers cannot hold them)."""
        views = {
            rid: RequestView(
                rid, self.status[rid], None, tuple(r.all_token_ids), r.num_computed_tokens, self.prefix[rid], None
            )
            for rid, r in self.requests.items()
        }
        s = self.shared_snapshot()
        shared = SharedBlocks(s.pools, s.queues, s.counters, s.problems)
        return SystemSnapshot({}, {}, views, page_size=self.block_size, shared=shared)

    def chunk(self, rid: int) -> StepResult:
        """Not expressed: vLLM caches full blocks inside ``allocate_slots``."""
        raise NotImplementedError("vLLM adapter: no chunk capability")

    def open_session(self, sid: int) -> None:
        """Not expressed: vLLM's KV cache manager has no sessions."""
        raise NotImplementedError("vLLM adapter: no sessions capability")

    def close_session(self, sid: int) -> None:
        """Not expressed: vLLM's KV cache manager has no sessions."""
        raise NotImplementedError("vLLM adapter: no sessions capability")

    def evict(self, component: Component, n: int) -> int:
        """Not expressed: vLLM evicts only by popping the free queue's head inside an allocation."""
        raise NotImplementedError("vLLM adapter: no evict capability")

    def inject_failure(self) -> None:
        """Not expressed."""
        raise NotImplementedError("vLLM adapter: no inject_failure capability")

    def idle_check(self) -> None:
        """vLLM's KV cache manager has no idle leak check of its own."""
        return None

    def shared_snapshot(self) -> SharedSnapshot:
        """Everything the shared-block laws read."""
        _, problems = self._walk()
        reqs = {
            rid: RequestState(rid, self.status[rid], tuple(r.all_token_ids), r.num_computed_tokens, self.prefix[rid])
            for rid, r in self.requests.items()
        }
        return SharedSnapshot(
            {"kv": self.pool_state()}, {"kv": self.queue_state()}, self.counters(), reqs, tuple(problems)
        )


def _params(cls: Any) -> set[str]:
    try:
        return set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return set()


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def _hashable(x: Any) -> Hashable:
    try:
        hash(x)
    except TypeError:
        return repr(x)
    return x  # type: ignore[no-any-return]


def vllm_factory(config: SystemConfig | None = None) -> VLLMAdapter:
    """The adapter for ``--adapter vllm``: full attention (block size ``config.page_size``, 4 when it is 1)."""
    if getattr(config, "mamba", False):
        raise Unsupported("vLLM's KV cache manager adapter drives attention groups only, not Mamba state")
    if getattr(config, "window", None) is not None:
        raise Unsupported("--adapter vllm drives one full-attention group: a sliding window is --adapter vllm-hybrid")
    page = int(getattr(config, "page_size", 1))
    block = page if page > 1 else 4
    tokens = int(getattr(config, "kv_tokens", 48))
    return VLLMAdapter(block, max(tokens // block, 4), int(getattr(config, "max_context", 24)) + block, None, config)


def vllm_hybrid_factory(config: SystemConfig | None = None) -> VLLMAdapter:
    """The adapter for ``--adapter vllm-hybrid``: full attention plus a sliding window (two kv-cache groups)."""
    if getattr(config, "mamba", False):
        raise Unsupported("vLLM's KV cache manager adapter drives attention groups only, not Mamba state")
    page = int(getattr(config, "page_size", 1))
    block = page if page > 1 else 4
    tokens = int(getattr(config, "kv_tokens", 48))
    window = getattr(config, "window", None) or 2 * block
    # NOTE: both groups draw on one pool, so it gets twice the blocks.
    return VLLMAdapter(
        block, max(2 * tokens // block, 8), int(getattr(config, "max_context", 24)) + block, int(window), config
    )


def vllm_mamba_factory(config: SystemConfig | None = None) -> VLLMAdapter:
    """The adapter for ``--adapter vllm-mamba``: full attention plus Mamba states cached by prefix (two groups)."""
    if getattr(config, "window", None) is not None:
        raise Unsupported("--adapter vllm-mamba drives full attention and Mamba state, no sliding-window group")
    page = int(getattr(config, "page_size", 1))
    block = page if page > 1 else 4
    tokens = int(getattr(config, "kv_tokens", 48))
    # NOTE: both groups draw on one pool, so it gets twice the blocks.
    return VLLMAdapter(
        block, max(2 * tokens // block, 8), int(getattr(config, "max_context", 24)) + block, None, config, mamba=True
    )


def iter_blocks(groups: Any) -> Iterable[Any]:
    """The blocks of a ``KVCacheBlocks`` or a plain list."""
    inner = getattr(groups, "blocks", None)
    if inner is None:
        yield from groups or []
        return
    for g in inner:
        yield from g
