"""The memory manager: requests, the request table, KV and Mamba pools, the radix cache, sessions.

This is the layer a scheduler calls (SGLang's ``ScheduleBatch`` memory paths,
``cache_finished_req`` / ``cache_unfinished_req``, ``alloc_for_extend``,
retract and abort). Every path that acquires something either hands it to an
owner that references it or returns it; every path may meet an allocation
failure (a full pool after eviction, or one injected with ``fail_next``) and
then leaves everything as it was.

Provenance: each operation is an *event* (``events``); pools stamp every slot
they hand out or transfer with the event id, so the leak checker can say which
operation gave a leaked slot its owner (and, with ``debug=True``, the stack).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import torch

from kvledger.impl.allocators import PagedAllocator, TokenAllocator
from kvledger.impl.arguments import check_int, check_tokens
from kvledger.impl.mamba import MambaAlloc, MambaPool
from kvledger.impl.owners import MAX_IDENT, encode
from kvledger.impl.radix import RadixCache
from kvledger.impl.req_to_token import ReqToTokenPool
from kvledger.impl.requests import Request, Status
from kvledger.impl.slots import SlotPool
from kvledger.impl.tree import TreeNode
from kvledger.spec.errors import ComponentDisabled, InvalidArgument, OverAllocation
from kvledger.spec.types import Component, Owner


@dataclass(frozen=True)
class Event:
    """One operation of the memory manager (the provenance of the slots it handed out)."""

    step: int
    op: str
    who: str
    stack: str | None = None


EVENTS_KEEP = 4096
"""The event log's bound: once it holds more than this many events, every this many steps it forgets the events no
slot's provenance names (``MemoryManager.events_keep``, per manager)."""


class MemoryManager:
    """Pools, cache, requests and sessions of one engine instance (token or paged KV; Mamba optional)."""

    def __init__(self, cache: RadixCache, rows: ReqToTokenPool, *, debug: bool = False) -> None:
        if not isinstance(cache, RadixCache) or not isinstance(rows, ReqToTokenPool):
            got = f"{type(cache).__name__}, {type(rows).__name__}"
            raise InvalidArgument(
                "create", "req_to_token", (), f"expected a RadixCache and a ReqToTokenPool, got {got}"
            )
        if rows.device != cache.device:
            raise InvalidArgument("create", "req_to_token", (), f"rows on {rows.device}, the cache on {cache.device}")
        if not isinstance(cache.kv, TokenAllocator | PagedAllocator):
            raise InvalidArgument("create", "kv", (), "the memory manager takes a token or paged KV allocator")
        if cache.driven or rows.driven:
            raise InvalidArgument(
                "create", "req_to_token", (), "the cache or the request table is another memory manager's already"
            )
        cache.driven = rows.driven = True
        self.cache = cache
        self.kv: TokenAllocator | PagedAllocator = cache.kv
        self.rows = rows
        self.mamba: MambaPool | None = cache.mamba
        self.page = self.kv.page_size if isinstance(self.kv, PagedAllocator) else 1
        self.debug = debug
        self.requests: dict[int, Request] = {}
        self.events: dict[int, Event] = {0: Event(0, "init", "-")}  # only events some slot still points at
        self.events_keep = EVENTS_KEEP  # NOTE: past this many, every this many steps, the log forgets dead events
        self._step = 0
        self.fail_next = 0  # allocation failures to inject (each failing alloc counts one)
        self._next_rid = 1
        from kvledger.impl.session import Sessions  # NOTE: sessions need the manager; import here

        self.sessions = Sessions(self)

    # ------------------------------------------------------------ provenance and pools

    def pools(self) -> dict[str, SlotPool]:
        """Every pool by ledger name."""
        out = {"kv": self.kv.pool, "req_to_token": self.rows.pool}
        if self.mamba is not None:
            out["mamba"] = self.mamba.pool
        return out

    def event(self, op: str, who: str) -> int:
        """Log an operation and stamp the pools with it; returns its id."""
        self._step += 1
        step = self._step
        stack = "".join(traceback.format_stack(limit=8)[:-1]) if self.debug else None
        self.events[step] = Event(step, op, who, stack)
        for p in self.pools().values():
            p.stamp = step
        keep = self.events_keep
        if len(self.events) > keep and step % keep == 0:
            self._prune_events()
        return step

    def _prune_events(self) -> None:
        """Forget events no slot's provenance points at (keeps the log bounded on long runs)."""
        live = {self._step}
        for p in self.pools().values():
            live.update(torch.unique(p.origin).tolist())
        self.events = {k: v for k, v in self.events.items() if k in live}

    def _tensor(self, xs: list[int] | tuple[int, ...]) -> torch.Tensor:
        return torch.tensor(list(xs), dtype=torch.int64, device=self.kv.device)

    def round_up(self, n: int) -> int:
        """``n`` tokens rounded up to whole KV pages (a count: an int in ``[0, 2**63)``, else ``InvalidArgument``)."""
        if type(n) is not int or not 0 <= n < 1 << 63:
            n = check_int("round_up", "kv", "n", n, 0, 1 << 63)
        return -(-n // self.page) * self.page

    def _make_room(self, comp: Component, short: int, what: str) -> None:
        """Evict ``short`` of ``comp`` from the cache; all or nothing: fail before evicting if it cannot."""
        if short <= 0:
            return
        room = self.cache.evictable_size(comp)
        if short > room:
            pool = "kv" if comp is Component.FULL else comp.value
            raise OverAllocation("alloc", pool, (), f"{what}: {short} short, {room} evictable")
        self.cache.evict(comp, short)

    def alloc_kv(self, owner: Owner, n: int) -> torch.Tensor:
        """``n`` token slots (whole pages) for ``owner``, evicting from the cache if short; all or nothing.

        ``n == 0`` gives an empty tensor (a fully cached request allocates nothing; no failure is injected
        there); a negative or non-int ``n`` or a malformed owner raises ``InvalidArgument`` before anything.
        """
        if type(n) is not int or n <= 0:
            n = check_int("alloc", "kv", "size", n)
        encode(owner, "alloc", "kv")
        if n == 0:
            return self.kv.alloc(0, owner)
        if self.fail_next > 0:
            self.fail_next -= 1
            raise OverAllocation("alloc", "kv", (), f"injected allocation failure ({n} tokens for {owner})")
        self._make_room(Component.FULL, n - self.kv.available_size(), f"{n} tokens for {owner}")
        return self.kv.alloc(n, owner)

    def alloc_mamba(self, owner: Owner) -> MambaAlloc:
        """A Mamba state and its track buffers for ``owner``, evicting cached states if short."""
        if self.mamba is None:
            raise ComponentDisabled("alloc_mamba", (), "the memory manager has no Mamba pool")
        encode(owner, "alloc_mamba", "mamba")
        if self.fail_next > 0:
            self.fail_next -= 1
            raise OverAllocation("alloc", "mamba", (), f"injected allocation failure (state for {owner})")
        self._make_room(
            Component.MAMBA, 1 + self.mamba.ping_pong_size - self.mamba.available_size(), f"state for {owner}"
        )
        return self.mamba.alloc_request_state(owner)

    def free_mamba(self, owner: Owner, m: MambaAlloc) -> None:
        """Return a request's (or session's) Mamba state and track buffers. A refusal names the operation ``free``
        of pool ``mamba``, as the pool's own do (not a MambaAlloc, slots outside the pool, not ``owner``'s)."""
        if self.mamba is None:
            raise ComponentDisabled("free_mamba", (), "the memory manager has no Mamba pool")
        if not isinstance(m, MambaAlloc):
            raise InvalidArgument("free", "mamba", (), f"free_mamba: expected a MambaAlloc, got {type(m).__name__}")
        self._free_mamba_slots(owner, m.slots())

    # ------------------------------------------------------------ requests

    def add_request(self, tokens: tuple[int, ...], session: int | None = None) -> Request:
        """A new waiting request (owns nothing yet): ``tokens`` a non-empty sequence of token ids (ints >= 0),
        ``session`` the id of an open session or ``None``."""
        tokens = check_tokens("add_request", "req_to_token", tokens, empty=False)
        if len(tokens) > self.rows.max_context_len:
            raise InvalidArgument("add_request", "req_to_token", (), f"{len(tokens)} tokens > max context")
        if session is not None:
            check_int("add_request", "session", "session id", session, 0, MAX_IDENT + 1)
            if session not in self.sessions.slots:
                raise InvalidArgument("add_request", "session", (), f"session {session} is not open")
        req = Request(self._next_rid, tokens, session)
        self._next_rid += 1
        self.requests[req.rid] = req
        return req

    def running(self) -> list[Request]:
        return [r for r in self.requests.values() if r.status is Status.RUNNING]

    def write_kv(self, req: Request, start: int, end: int) -> None:
        """Compute (fingerprint) the KV of ``req``'s tokens ``[start, end)`` into its row's slots.

        ``req``: this manager's request holding a row; ``0 <= start <= end <= alloc_len`` and ``end`` within its tokens.
        """
        self.own("write_kv", req)
        start = check_int("write_kv", "kv", "start", start)
        end = check_int("write_kv", "kv", "end", end)
        if end > start and (req.row is None or end > min(req.alloc_len, len(req.tokens))):
            raise InvalidArgument(
                "write_kv", "kv", (), f"request {req.rid}: positions [{start}, {end}) past its slots or tokens"
            )
        if end > start:
            assert req.row is not None
            slots = self.rows.table[req.row, start:end]
            pos = torch.arange(start, end, dtype=torch.int64, device=self.kv.device)
            self.kv.write_fingerprint(slots, self._tensor(req.tokens[start:end]), pos)

    def extend(self, req: Request, new_tokens: tuple[int, ...], ahead: int = 0) -> None:
        """Decode/extend: append ``new_tokens`` (their KV computed) and keep ``ahead`` extra slots allocated.

        ``ahead`` models speculative decoding's over-allocation: the row holds slots
        past ``kv_len`` that the next step may or may not use (an int >= 0). All or nothing.
        """
        self.own("extend", req)
        new_tokens = check_tokens("extend", "req_to_token", new_tokens)
        ahead = check_int("extend", "req_to_token", "ahead", ahead)
        if req.status is not Status.RUNNING or req.row is None:
            raise InvalidArgument("extend", "req_to_token", (), f"request {req.rid} is not running")
        end = req.kv_len + len(new_tokens)
        if end + ahead > self.rows.max_context_len:
            raise InvalidArgument("extend", "req_to_token", [req.row], f"{end + ahead} tokens > max context")
        target = self.round_up(end + ahead)
        self.event("extend", f"req {req.rid}")
        if target > req.alloc_len:
            got = self.alloc_kv(req.owner, target - req.alloc_len)
            self.rows.write(req.row, req.alloc_len, got, req.owner)
            req.alloc_len = target
        req.tokens = req.tokens[: req.kv_len] + tuple(new_tokens)
        self.write_kv(req, req.kv_len, end)
        req.kv_len = end

    def _path_slots(self, n: TreeNode) -> torch.Tensor:
        parts, most = [], self.cache.node_count()
        while n.parent is not None:
            parts.append(n.value)
            n = n.parent
            if len(parts) > most:
                raise self.cache.revisit("chunk", n)
        return torch.cat([self.cache.root.value, *reversed(parts)])

    def _release_owned(self, req: Request, start: int) -> None:
        """Free ``req``'s slots in row positions ``[start, alloc_len)`` (whole pages)."""
        if req.alloc_len > start:
            assert req.row is not None
            self.kv.free(self.rows.table[req.row, start : req.alloc_len].clone(), req.owner)
        req.alloc_len = min(req.alloc_len, start)

    def _cache_into_tree(self, req: Request, state: int | None) -> tuple[TreeNode, bool]:
        """Insert ``req``'s page-aligned computed prefix (and ``state`` at its end) into the tree.

        New pages' slots pass to the tree; duplicates are freed. Returns the node
        ending at the prefix and whether the tree took ``state``.
        """
        assert req.row is not None
        aligned = req.kv_len - req.kv_len % self.cache.page_size
        key = self._tensor(req.tokens[:aligned])
        res = self.cache.insert(key, self.rows.table[req.row, :aligned].clone(), req.owner, mamba_slot=state)
        if res.dup_indices.numel():
            self.kv.free(res.dup_indices, req.owner)
        return res.last_node, state is not None and res.dup_mamba is None

    def finish(self, req: Request) -> None:
        """The request ended: cache its prefix (or save it to its session) and release everything else."""
        self.own("finish", req)
        self._require_running(req, "finish")
        self.event("finish", f"req {req.rid}")
        if req.session is not None:
            self.sessions.save(req)
        else:
            assert req.row is not None
            aligned = req.kv_len - req.kv_len % self.cache.page_size
            m = req.mamba
            state = m.state if m is not None and aligned == req.kv_len and aligned > 0 else None
            _, taken = self._cache_into_tree(req, state)
            self._release_owned(req, max(req.own_from, aligned))
            self._drop_lock(req)
            if m is not None:
                rest = m.track if taken else m.slots()
                if rest:
                    self._free_mamba_slots(req.owner, rest)
                req.mamba = None
            self.rows.free(req.row, req.owner)
            req.row = None
        req.status = Status.FINISHED

    def _free_mamba_slots(self, owner: Owner, slots: tuple[int, ...]) -> None:
        assert self.mamba is not None
        self.mamba.free(self._tensor(slots), owner)

    def chunk(self, req: Request) -> None:
        """Chunked prefill (``cache_unfinished_req``): cache the computed prefix, keep running on it."""
        self.own("chunk", req)
        self._require_running(req, "chunk")
        self.event("chunk", f"req {req.rid}")
        if req.session is not None:
            return  # a session request keeps its own KV until it finishes
        aligned = req.kv_len - req.kv_len % self.cache.page_size
        if aligned <= req.prefix_len:
            return
        node, _ = self._cache_into_tree(req, None)
        assert req.row is not None
        self.rows.write(req.row, 0, self._path_slots(node), req.owner)
        handle = self.cache.inc_lock_ref(node)
        self._drop_lock(req)
        req.handle, req.prefix_len, req.own_from = handle, aligned, aligned

    def retract(self, req: Request) -> None:
        """Preempt a running request: it returns everything and waits again, holding nothing."""
        self.own("retract", req)
        self._require_running(req, "retract")
        self.event("retract", f"req {req.rid}")
        self._release_all(req)
        req.status = Status.WAITING  # it keeps its tokens and will be matched again

    def abort(self, req: Request) -> None:
        """Abort a waiting or running request: whatever it holds is returned and it is gone.

        A request that already ended (finished or aborted) is refused: ``InvalidArgument``, nothing changes.
        """
        self.own("abort", req)
        if req.status in (Status.FINISHED, Status.ABORTED):
            raise InvalidArgument("abort", "req_to_token", (), f"request {req.rid} is {req.status.value} already")
        self.event("abort", f"req {req.rid}")
        self._release_all(req)
        req.status = Status.ABORTED

    def _release_all(self, req: Request) -> None:
        if req.session is not None and req.session in self.sessions.slots:
            slot = self.sessions.slots[req.session]
            if slot.lent_to == req.rid:
                # NOTE: the turn's memory is returned, not saved: the session holds nothing, so it may not
                # claim committed KV either (spec.session.inv_committed_within_allocated).
                slot.lent_to, slot.tokens, slot.committed_len = None, (), 0
        if req.row is not None:
            self._release_owned(req, req.own_from)
            self.rows.free(req.row, req.owner)
            req.row = None
        self._drop_lock(req)
        if req.mamba is not None:
            self.free_mamba(req.owner, req.mamba)
            req.mamba = None
        req.prefix_len = req.own_from = req.kv_len = req.alloc_len = 0

    def _drop_lock(self, req: Request) -> None:
        if req.handle is not None:
            self.cache.dec_lock_ref(req.handle)
            req.handle = None

    def own(self, op: str, req: Request) -> Request:
        """``req`` if it is one of this manager's requests; ``InvalidArgument`` naming ``op`` otherwise (not a
        ``Request``, or another manager's: its id may name one of ours, which must not be touched)."""
        if type(req) is not Request and not isinstance(req, Request):
            raise InvalidArgument(op, "req_to_token", (), f"expected a Request, got {type(req).__name__} {req!r:.40}")
        rid = req.rid
        if type(rid) is not int or self.requests.get(rid) is not req:
            raise InvalidArgument(op, "req_to_token", (), f"request {rid!r:.40} is not one of this manager's requests")
        return req

    def _require_running(self, req: Request, op: str) -> None:
        if req.status is not Status.RUNNING:
            raise InvalidArgument(op, "req_to_token", (), f"request {req.rid} is {req.status.value}, not running")
