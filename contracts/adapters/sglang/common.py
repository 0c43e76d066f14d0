"""What every SGLang adapter shares: node ids, the stand-in KV buffer, ledgers, LRU walks, and the run.

None of this imports SGLang. An adapter observes SGLang's objects through
their public attributes and methods only, and turns them into spec values
with the helpers here:

* :class:`NodeIds` gives each SGLang tree node object a stable
  :class:`~kvledger.spec.types.NodeId` (SGLang's own ``node.id`` counters
  are shared by every tree in the process and by the LRU sentinels) and keeps
  a strong reference to every node ever seen, so an evicted node's LRU
  pointers can still be read: that is how a node left linked after removal
  (B1) becomes visible.
* :class:`KVBuffer` stands in for the KV pool SGLang would write through
  (its allocators run with ``kvcache=None`` on CPU): ``write_kv`` records the
  fingerprint of each token in the slot SGLang handed out, exactly where a
  model would write its KV, so a slot cached for the wrong token or reused
  while cached shows up as a wrong fingerprint.
* :func:`ledger` builds a pool's ownership ledger from SGLang's free list, the
  slots its tree nodes hold and the slots the adapter gave each request; a
  slot that appears twice (twice on the free list, free and cached, cached by
  two nodes) gets two holders, which ``inv_single_owner`` rejects.
* :func:`lru_state` walks an intrusive doubly linked list from its head
  sentinel and reads the pointers of every node seen.
* :func:`alloc_state` / :func:`free_state` take a Mamba state slot from (or
  give it back to) SGLang's Mamba allocator for a request, keeping the
  adapter's record of which request holds it.
* :func:`check` runs the conformance machine and reports the rules an
  adapter cannot express (its missing capabilities) as skipped.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from hypothesis import settings as Settings

from kvledger.contracts.adapters.protocol import CacheAdapter, Unsupported, skipped_rules
from kvledger.contracts.adapters.system import SystemConfig
from kvledger.contracts.machines.cache import RULES, machine_for_cache
from kvledger.contracts.machines.runner import CheckResult, run_machine
from kvledger.spec.errors import KVLedgerError, LawBroken
from kvledger.spec.ledger import Ledger
from kvledger.spec.lru import SENTINEL, LruState
from kvledger.spec.prefix import fingerprint
from kvledger.spec.types import Component, HandleId, NodeId, Owner, OwnerKind, node, request

FULL, SWA, MAMBA = Component.FULL, Component.SWA, Component.MAMBA

DOUBLE_FREE_OWNER = request(-1)
"""The second holder a ledger gives a slot that sits on SGLang's free list twice (a double free)."""


@contextmanager
def retraction_forced(scheduler_module: Any) -> Iterator[None]:
    """SGLang's own ``TEST_RETRACT`` hook, on for the iterations inside: ``retract_decode`` picks its victims."""
    saved = scheduler_module.TEST_RETRACT, scheduler_module.TEST_RETRACT_INTERVAL
    scheduler_module.TEST_RETRACT, scheduler_module.TEST_RETRACT_INTERVAL = True, 1
    try:
        yield
    finally:
        scheduler_module.TEST_RETRACT, scheduler_module.TEST_RETRACT_INTERVAL = saved


CHUNK_PAGES = 2
"""Chunked prefill's chunk, in pages (at least ``MIN_CHUNK`` tokens): small enough that most prompts of a checked
program (up to ``SystemConfig.max_context`` tokens) take several chunks."""
MIN_CHUNK = 4


def chunk_size(config: SystemConfig) -> int:
    """The chunk the chunked adapters prefill in (``chunked_prefill_size``): ``CHUNK_PAGES`` pages, at least
    ``MIN_CHUNK`` tokens."""
    return max(CHUNK_PAGES, -(-MIN_CHUNK // config.page_size)) * config.page_size


class SchedulerError(KVLedgerError):
    """The scheduler refused or could not do what the protocol asked (names the operation and the request)."""


CHUNKED_CAPABILITIES = frozenset({"chunk", "chunk_prompts_only", "caches_on_chunk"})
"""What a scheduler adapter with chunked prefill on declares besides its own capabilities, less ``prefix_cache``: a
step stashes the chunked request's last chunk in the tree before it matches anything, so a request admitted in that
step may reuse pages no snapshot showed cached before it (``admission reuses the cache`` would misread it)."""


def chunked_capabilities(caps: set[str], chunk_tokens: int | None) -> frozenset[str]:
    """``caps``, as a scheduler adapter with chunked prefill on (``chunk_tokens``) declares them."""
    return frozenset(caps) if chunk_tokens is None else (frozenset(caps) - {"prefix_cache"}) | CHUNKED_CAPABILITIES


UNCACHED = frozenset({"prefix_cache", "caches_on_finish", "caches_on_chunk", "reservations"})
"""What a scheduler adapter over a cache that caches nothing (``--disable-radix-cache``) cannot claim: the laws on
cache reuse have nothing to say there; and no licence for a Mamba slot a rejected request keeps (``reservations``:
the copy-on-write slot a match takes), since a match there takes none."""


def uncached(caps: frozenset[str]) -> frozenset[str]:
    """``caps``, as a scheduler adapter declares them with the radix cache disabled (:data:`UNCACHED` left out)."""
    return caps - UNCACHED


def chunk_steps(chunk_tokens: int | None, todo: Iterable[int]) -> int:
    """At most how many steps chunked prefill may take before requests with ``todo`` tokens each still to compute
    have prefilled them: one chunk a step before anything decodes, and one more each for a first chunk cut to a
    step's leftover budget (0 with chunked prefill off)."""
    if not chunk_tokens:
        return 0
    return sum(-(-max(0, t) // chunk_tokens) + 1 for t in todo)


MOST_STEPS = 1000
"""The most engine steps :func:`step_until` runs for one protocol call, progress or not: a guard against a loop
that keeps moving without ever getting there (a request retracted and admitted again forever)."""


def step_until(
    step: Callable[[], object], done: Callable[[], bool], progress: Callable[[], object], slack: Callable[[], int]
) -> bool:
    """Run the engine's loop (``step``) until ``done()``; give up after more than ``slack()`` steps in a row in which
    ``progress()`` did not change, or after :data:`MOST_STEPS`. Returns ``done()``.

    A request decodes only in the steps the scheduler gives to decoding: a step that prefills waiting requests, or
    the next chunk of a chunked one, decodes nothing. So the number of steps a decode of ``n`` tokens takes is not a
    function of ``n``, and a fixed bound reads a busy engine as a stuck one. ``slack`` is read when a run of steps
    without progress begins and again before each step of it, and the largest reading holds: the requests a
    prefill admits leave the queue, but the step it took still counts against what they allowed."""
    seen = progress()
    stalled = allowed = 0
    for _ in range(MOST_STEPS):
        if done():
            return True
        allowed = max(allowed, slack())
        if stalled > allowed:
            return False
        step()
        now = progress()
        if now != seen:
            stalled = allowed = 0
        else:
            stalled += 1
        seen = now
    return done()


ENGINE_MOVES = "a running request moves"
"""The law a scheduler adapter reads where :func:`step_until` gave up on a running request (:func:`stalled`)."""


def stalled(what: str, rid: int, slack: int) -> LawBroken:
    """``a running request moves``: request ``rid``, which ``what`` (an extend, a finish) asked the engine to move,
    is still running after more than ``slack`` engine steps in a row in which it neither decoded (for an extend) nor
    changed status, more than the prefills the scheduler may run first. A finding, not a refusal: the engine may
    have stepped other requests on the way, so the state need not be as it was."""
    return LawBroken(
        f"{ENGINE_MOVES}: {what} of request {rid}: still running after more than {slack} engine steps in a row in "
        "which it did not move (the steps the scheduler may spend elsewhere first: one per waiting request and per "
        "chunk still to prefill, and a few more)"
    )


def not_chunked(rid: int, status: str) -> SchedulerError:
    """The refusal of ``chunk`` for request ``rid``, which is not being chunked (``chunk_prompts_only``)."""
    return SchedulerError(
        f"chunk of request {rid} ({status}): SGLang chunks a prompt only while it prefills it, at admission; this one "
        "is not being chunked"
    )


def still_prefilling(rid: int, n: int, computed: int, prompt: int) -> SchedulerError:
    """The refusal of ``extend`` by ``n`` for request ``rid``, ``computed`` of its ``prompt`` tokens prefilled."""
    return SchedulerError(
        f"extend of request {rid} by {n}: its prompt is still being prefilled in chunks ({computed} of {prompt} "
        "tokens computed); it decodes after"
    )


class NotExpressible(Unsupported, NotImplementedError):
    """The protocol asked for something SGLang's API cannot do (a factory: a model kind it cannot build)."""


class NodeIds:
    """Stable ids for SGLang tree nodes, with a strong reference to every node ever seen (alive or evicted)."""

    def __init__(self) -> None:
        self._ids: dict[int, NodeId] = {}
        self.seen: dict[NodeId, Any] = {}

    def __call__(self, obj: Any) -> NodeId:
        key = id(obj)
        nid = self._ids.get(key)
        if nid is None:
            nid = NodeId(len(self._ids) + 1)
            self._ids[key] = nid
            self.seen[nid] = obj  # NOTE: the strong reference keeps id(obj) unique for this adapter's life
        return nid


class KVBuffer:
    """The fingerprints a model would have written into each KV slot (SGLang runs with ``kvcache=None``)."""

    def __init__(self) -> None:
        self.data: dict[int, int] = {}
        self.tokens: dict[int, int] = {}

    def write(self, slots: Iterable[int], tokens: Iterable[int], start: int) -> None:
        for i, (x, t) in enumerate(zip(slots, tokens, strict=True), start):
            self.data[x] = fingerprint(t, i)
            self.tokens[x] = t

    def content(self, slots: Iterable[int]) -> dict[int, int]:
        return {x: self.data.get(x, 0) for x in slots}


def ledger(
    name: str,
    capacity: int,
    base: int,
    free: Iterable[int],
    nodes: Mapping[Owner, Iterable[int]],
    requests: Mapping[int, Iterable[int]],
) -> Ledger:
    """A pool's ledger from SGLang's free list, its tree nodes' slots and the adapter's request records."""
    free_list = list(free)
    held: dict[Owner, set[int]] = {}
    seen_free: set[int] = set()
    for x in free_list:
        if x in seen_free:
            held.setdefault(DOUBLE_FREE_OWNER, set()).add(x)
        seen_free.add(x)
    for owner, xs in nodes.items():
        held.setdefault(owner, set()).update(xs)
    for r, xs in requests.items():
        held.setdefault(request(r), set()).update(xs)
    return Ledger(name, capacity, frozenset(seen_free), {o: frozenset(xs) for o, xs in held.items() if xs}, base)


def reap_sessions(controller: Any) -> None:
    """One pass of SGLang's session reaper (``maybe_reap``, which the loop runs as it takes in requests, at most once
    a second; 0.5.11+), as a scheduler adapter runs it between steps: a close deferred to a turn that has since ended
    completes here. Nothing where the release has no reaper (or no session controller).

    NOTE: it is told a second has passed, and its clock is then put back, so the engine's own timing is unchanged."""
    reap = getattr(controller, "maybe_reap", None)
    if controller is None or reap is None:
        return
    last = controller._last_reap_time
    reap(time.monotonic() + 2.0)
    controller._last_reap_time = last


def lock_handle(owner: Owner) -> HandleId:
    """The handle id a scheduler adapter gives the tree lock ``owner`` holds: a request's ``2 * rid``, a session's
    ``2 * sid + 1`` (a request and a session never share one)."""
    return HandleId(2 * owner.ident + (1 if owner.kind is OwnerKind.SESSION else 0))


def evict_component(cache: Any, evict_params: Any, component: Component, n: int) -> int:
    """``cache.evict`` of ``n`` units of ``component`` (SGLang's ``EvictParams`` names one field a component:
    ``num_tokens``, ``swa_num_tokens``, ``mamba_num``), and how many of them it reports evicted."""
    field, done = {
        FULL: ("num_tokens", "num_tokens_evicted"),
        SWA: ("swa_num_tokens", "swa_num_tokens_evicted"),
        MAMBA: ("mamba_num", "mamba_num_evicted"),
    }[component]
    got = cache.evict(evict_params(**{"num_tokens": 0, field: n}))
    return int(getattr(got, done))


def alloc_state(pool: Any, req: int, held: dict[int, set[int]]) -> int | None:
    """One slot from a Mamba allocator with SGLang's ``alloc(n)`` / ``free(tensor)`` for ``req`` (``None``: full)."""
    got = pool.alloc(1)
    if got is None:
        return None
    slot = int(got[0])
    held.setdefault(req, set()).add(slot)
    return slot


def free_state(pool: Any, req: int, slot: int, held: dict[int, set[int]]) -> None:
    """Give ``req``'s Mamba state slot back to ``pool`` and forget that ``req`` held it."""
    pool.free(torch.tensor([slot], dtype=torch.int64))
    held.setdefault(req, set()).discard(slot)


def copy_on_write(match: Callable[[Any], object], request: Any, slot_of: Callable[[Any], Any]) -> int | None:
    """The Mamba slot a copy-on-write match gives ``request`` (as admission's match does), ``None`` when none.

    ``match(request)`` runs SGLang's ``match_prefix(..., cow_mamba=True, req=request)``; ``slot_of`` reads
    where this release puts the slot on the request. SGLang asserts "Can not alloc mamba cache" when
    no slot can be had even after evicting: that is a refusal, not a crash.
    """
    try:
        match(request)
    except AssertionError as err:
        if "Can not alloc mamba cache" in str(err):
            return None
        raise
    idx = slot_of(request)
    return None if idx is None else int(torch.as_tensor(idx).reshape(-1)[0])


def hybrid_rows(pool_class: Any, rows: int, mamba_slots: int, max_context: int) -> Any:
    """SGLang's ``HybridReqToTokenPool`` (0.5.9 to 0.5.13) with one tiny Mamba layer, on CPU, no extra buffer.

    From 0.5.10 the constructor also asks which layers are Mamba layers (``mamba_layer_ids``).
    """
    import inspect

    cache_params = SimpleNamespace(
        shape=SimpleNamespace(conv=[(1, 2)], temporal=(1, 1, 2)),
        dtype=SimpleNamespace(conv=torch.float32, temporal=torch.float32),
        layers=[0],
    )
    extra = {"mamba_layer_ids": [0]} if "mamba_layer_ids" in inspect.signature(pool_class).parameters else {}
    return pool_class(
        **extra,
        size=rows,
        mamba_size=mamba_slots,
        mamba_spec_state_size=mamba_slots,
        max_context_len=max_context,
        device="cpu",
        enable_memory_saver=False,
        cache_params=cache_params,
        enable_mamba_extra_buffer=False,
    )


def node_owner(nid: NodeId, comp: Component) -> Owner:
    """The ledger owner that stands for node ``nid`` in ``comp``."""
    return node(nid, comp)


def lru_state(
    comp: Component,
    head: Any,
    tail: Any,
    prev_of: Callable[[Any], Any],
    next_of: Callable[[Any], Any],
    ids: NodeIds,
    skip: Callable[[Any], bool] = lambda n: False,
) -> LruState:
    """The abstract LRU list: the order walked from ``head`` to ``tail``, and the links of every node ever seen.

    ``skip`` names extra sentinels inside the list (walk cursors) that are not
    nodes. A pointer at a sentinel held by a node outside the list becomes
    ``SENTINEL`` (still a link, so ``inv_lru_detached`` rejects it).
    """
    sentinels = {id(head), id(tail)}
    order: list[NodeId] = []
    x = next_of(head)
    steps = 0
    while x is not None and x is not tail and steps <= len(ids.seen) + 2:
        if not skip(x):
            order.append(ids(x))
        x = next_of(x)
        steps += 1
    members = set(order)

    def link(y: Any, member: bool) -> NodeId | None:
        if y is None or skip(y):
            return None
        if id(y) in sentinels:
            return None if member else SENTINEL
        return ids(y)

    links = {}
    for nid, obj in list(ids.seen.items()):
        member = nid in members
        links[nid] = (link(prev_of(obj), member), link(next_of(obj), member))
    return LruState(tuple(order), links, comp)


@dataclass
class Run:
    """One conformance run of an SGLang cache: the result, with what was skipped and why."""

    result: CheckResult
    adapter: str
    version: str
    skipped: list[str]


def check(make: Callable[[], CacheAdapter], settings: Settings, model: str = "", seed: int | None = None) -> Run:
    """Run the cache conformance machine on the caches ``make`` builds; skipped laws are listed, not passed."""
    probe = make()
    skipped = skipped_rules(probe.capabilities)
    result = run_machine("cache", model or probe.config.kind, machine_for_cache(make), list(RULES), settings, seed)
    result.skipped = list(skipped)
    return Run(result, probe.name, probe.version, skipped)


def one_process_run() -> None:
    """Ready an imported SGLang scheduler for one process on CPU: before 0.5.21 (no ranks in the runtime context)
    the tensor-parallel group of rank 0 of 1 (an aborted request asks for its rank to log); and SGLang's log at
    ERROR (the loop logs every test retraction and session open or close at WARNING or INFO: runs stay readable)."""
    ranked = importlib.util.find_spec("sglang.srt.runtime_context") is not None and hasattr(
        importlib.import_module("sglang.srt.runtime_context"), "SpawnRanks"
    )
    ps = importlib.import_module("sglang.srt.distributed.parallel_state")
    if not ranked and getattr(ps, "_TP", None) is None:
        ps._TP = SimpleNamespace(rank_in_group=0, world_size=1)  # type: ignore[attr-defined]
    logging.getLogger("sglang").setLevel(logging.ERROR)


def match_slots(cache: Any, m: Any) -> tuple[int, ...]:
    """The slots of match result ``m``: its ``device_indices`` up to 0.5.21; from 0.5.22 a match carries its
    length only (``device_prefix_len``), and its slots are read off the path to its last node."""
    if hasattr(m, "device_indices"):
        return tuple(int(x) for x in m.device_indices.tolist())
    n = int(m.device_prefix_len)
    return tuple(int(x) for x in cache.path_device_indices(m.last_device_node)[:n].tolist()) if n else ()


def cow_request(**extra: Any) -> tuple[Any, Callable[[Any], Any]]:
    """A request with no Mamba slot yet, for a copy-on-write match (``extra``: more fields the release's match
    reads), and where to read the slot SGLang gave it.

    NOTE: up to 0.5.18 the match reads and fills the request's own ``mamba_pool_idx``, from 0.5.19 its
    ``kv``'s (a ``ReqKvInfo``); the request carries both, SGLang fills one, the other stays None.
    """
    kv = SimpleNamespace(holds_mamba=False, mamba_pool_idx=None, mamba_cow_src_index=None, mamba_needs_clear=True)
    req = SimpleNamespace(kv=kv, mamba_pool_idx=None, mamba_cow_src_index=None, mamba_needs_clear=True, **extra)
    return req, lambda r: r.kv.mamba_pool_idx if r.kv.mamba_pool_idx is not None else r.mamba_pool_idx


def publish_cpu_args() -> None:
    """Publish CPU server args (Mamba's chunk size set, so no model is resolved through Hugging Face) as SGLang's
    own allocator tests do (0.5.22 and later: ``sglang.test.unified_allocator_fixtures.setup_allocator_context``;
    releases before have ``runtime_context`` but not the fixture)."""
    from sglang.srt.runtime_context import publish, reset_context  # type: ignore[import-not-found]
    from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]

    reset_context()
    args = ServerArgs(model_path="dummy", device="cpu")
    args._mamba_cache_chunk_size = 64
    publish(args, role="tokenizer")
