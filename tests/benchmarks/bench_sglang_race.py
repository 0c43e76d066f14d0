"""Race kvledger's radix cache against SGLang's and vLLM's on a suite of workloads (a benchmark, not a test).

    python tests/benchmarks/bench_sglang_race.py [--workload NAME[,NAME]] [--pages 1,16] [--rounds 3]
                                                 [--requests 2000] [--variants SUBSTR[,SUBSTR]] [--small]

Every workload is generated from its seed (tokens, prefixes, cut points, turn
and branch lengths: nothing is tuned by hand), so every implementation sees
the same requests. Per request, as a scheduler does: ``match_prefix`` -> lock
the match -> evict if the pool is short -> allocate the new tokens ->
``insert`` -> release the lock. Then ``match_prefix`` alone over every
request (the ``match calls/s`` column). Contracts are off for the timings
unless the variant says "contracts on". Each workload's loop starts after a
``gc.collect()``: the previous workload's tree (Python objects with cycles,
in kvledger and SGLang's Python core) is collected before the clock starts,
never charged to the next workload.

Workloads (``--workload``, default all):

``prefix-exact`` / ``prefix-batched``
    32 shared prefixes of 2,048 tokens, requests of 512..2,048 tokens taking
    their prefix up to a random cut point and random tokens after it.
    ``exact`` evicts exactly the shortfall; ``batched`` evicts the shortfall
    plus a free watermark (``pool // 64`` tokens of slack), as a scheduler
    that keeps some memory free does. Every other workload is batched.
``few-long-cut`` / ``few-long-whole``
    4 prefixes of 8,192 tokens, cut at a random point / taken whole, then
    64..1,024 random tokens.
``many-short-cut`` / ``many-short-whole``
    512 prefixes of 32..256 tokens, cut at a random point / taken whole,
    then 64..1,024 random tokens.
``chat``
    multi-turn chat: sessions of up to 12 turns, taken in a random
    interleaving; each turn's request is the previous turn's whole sequence
    (its prompt and its 32..384-token answer) plus a new 16..256-token message.
``long-context``
    requests of 8k..32k tokens (a tenth of ``--requests``): 6 documents of
    32,768 tokens cut at a random point, then 64..1,024 random tokens.
``fanout``
    agentic fan-out: one 16,384-token prefix; each request branches from it
    with 32..512 random tokens, or (half of them) extends an earlier branch's
    whole sequence, as an agent's next step does.

The pool holds a quarter of the workload's distinct tokens (at least twice
its longest request plus the watermark), so every workload evicts.

Each implementation runs in a subprocess of the venv that has it (SGLang
0.5.9 and 0.5.23 cannot share one; ``.ci/sglang_env`` builds
``build/sglang-0.5.9`` and ``build/sglang-0.5.23``); kvledger runs in the
0.5.23 one, one subprocess per (variant, page, round) running every selected
workload. vLLM 0.34.0's ``KVCacheManager`` (full attention, prefix caching
on) runs in ``build/vllm-0.34.0`` (``.ci/vllm_env``), at block size 16 and 1;
it is skipped when that venv is absent. Its loop is vLLM's own:
``get_computed_blocks`` -> ``allocate_slots`` -> ``free`` (no separate lock,
evict or insert: a request's blocks stay cached on the free queue and
allocation evicts from its head, one block at a time, so a watermark means
nothing to it). Its sha256 block hashing runs when each ``Request`` is made
and is timed apart (``hash s``). vLLM never reports a whole prompt as a hit
(the last token is recomputed for the logits), so where a request is cached
whole it hits one block fewer than the radix caches, and its evictions then
differ too: the summary says so rather than hiding the difference.

Ratios are taken within one run of this script. ``--rounds N`` runs every
variant N times, the variants taking turns, and keeps each one's best loop
and best match pass per workload. ``--clock cpu`` times each loop by its
worker's CPU time instead of the wall clock (on a machine shared with other
jobs the wall clock also counts waiting for a core). ``--small`` is the smoke
test's mode (a few dozen short requests per workload).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {
    "kvledger": "0.5.23",
    "kvledger (contracts on)": "0.5.23",
    "sglang 0.5.9 RadixCache": "0.5.9",
    "sglang 0.5.23 unified (python core)": "0.5.23",
    "sglang 0.5.23 unified (rust core)": "0.5.23",
    "sglang 0.5.20 RadixCacheCpp (C++ tree)": "sglang-0.5.20",
    "vllm 0.34.0 KVCacheManager": "vllm-0.34.0",
}
BASELINE = "kvledger (baseline)"
"""kvledger as of ``--baseline REV`` (its packages from ``git archive``, first on PYTHONPATH)."""
VOCAB = 32_000
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter
"""The clock of every loop (``--clock``): the wall clock, or the worker's own CPU time (on a machine shared with
other jobs the wall clock also counts the time a worker waited for a core, which drifts by 2x over minutes)."""
POOL_FRACTION = 4
"""The pool holds 1/POOL_FRACTION of a workload's distinct tokens (so every workload evicts)."""
WATERMARK = 64
"""Batched eviction keeps pool // WATERMARK tokens free (the scheduler's free watermark)."""


# ---------------------------------------------------------------- workloads, generated from seeds


@dataclass(frozen=True)
class Workload:
    """One generated trace: its requests (token lists), the pool it races in and the eviction slack."""

    name: str
    requests: list[list[int]]
    distinct: int
    """Tokens the generator made fresh (prefixes, suffixes, turns): what an unbounded cache would hold."""
    batched: bool

    def pool(self, page: int) -> int:
        """A quarter of the distinct tokens, at least three times the longest request; whole pages."""
        longest = max(len(r) for r in self.requests)
        pool = max(self.distinct // POOL_FRACTION, 3 * longest)
        return pool - pool % page

    def slack(self, page: int) -> int:
        """Tokens evicted beyond the shortfall: 0 for exact eviction, else the watermark."""
        return self.pool(page) // WATERMARK if self.batched else 0


class _Gen:
    """Seeded token source; counts every token it makes (``made``: the workload's distinct tokens)."""

    def __init__(self, seed: int, scale: float) -> None:
        self.rng = random.Random(seed)
        self.scale = scale
        self.made = 0

    def n(self, lo: int, hi: int) -> int:
        """A length in ``[lo, hi]`` scaled by the mode (``--small`` shrinks every length)."""
        return self.rng.randint(max(1, int(lo * self.scale)), max(1, int(hi * self.scale)))

    def tokens(self, n: int) -> list[int]:
        raw = array("H", self.rng.randbytes(2 * n))
        self.made += n
        return [1 + t % (VOCAB - 1) for t in raw]


def _prefixed(
    name: str,
    seed: int,
    requests: int,
    scale: float,
    *,
    prefixes: int,
    plen: tuple[int, int],
    nlen: tuple[int, int] | None,
    whole: bool,
    batched: bool,
) -> Workload:
    """Requests over ``prefixes`` shared prefixes: cut at a random point (or ``whole``), then random tokens.

    ``nlen``: the request's total length range (the suffix fills it up); ``None``: the suffix is 64..1,024 tokens.
    """
    g = _Gen(seed, scale)
    pre = [g.tokens(g.n(*plen)) for _ in range(prefixes)]
    out = []
    for _ in range(requests):
        p = pre[g.rng.randrange(prefixes)]
        if nlen is None:
            head = p if whole else p[: g.rng.randint(0, len(p))]
            out.append(head + g.tokens(g.n(64, 1024)))
        else:
            n = g.n(*nlen)
            cut = len(p) if whole else g.rng.randint(0, min(n, len(p)))
            out.append(p[:cut] + g.tokens(max(0, n - cut)))
    return Workload(name, out, g.made, batched)


def _chat(name: str, seed: int, requests: int, scale: float) -> Workload:
    """Multi-turn sessions in a random interleaving: each turn is the previous turn's whole sequence plus a message."""
    g = _Gen(seed, scale)
    systems = [g.tokens(g.n(256, 1024)) for _ in range(4)]
    live: list[tuple[list[int], int]] = []  # (the sequence so far, turns left)
    out: list[list[int]] = []
    width = max(2, requests // 16)
    while len(out) < requests:
        while len(live) < width:
            live.append((list(systems[g.rng.randrange(4)]), g.rng.randint(1, 12)))
        i = g.rng.randrange(len(live))
        seq, left = live[i]
        prompt = seq + g.tokens(g.n(16, 256))
        out.append(prompt)
        nxt = prompt + g.tokens(g.n(32, 384))  # the answer joins the next turn's prompt
        if left > 1:
            live[i] = (nxt, left - 1)
        else:
            live.pop(i)
    return Workload(name, out, g.made, True)


def _fanout(name: str, seed: int, requests: int, scale: float) -> Workload:
    """Many requests branching from one long prefix; half extend an earlier branch's whole sequence (an agent step)."""
    g = _Gen(seed, scale)
    root = g.tokens(g.n(16_384, 16_384))
    cap = int(32_768 * scale)
    branches: list[list[int]] = []
    out: list[list[int]] = []
    for _ in range(requests):
        if branches and g.rng.random() < 0.5:
            i = g.rng.randrange(len(branches))
            req = branches[i] + g.tokens(g.n(32, 512))
            if len(req) > cap:
                branches.pop(i)
                req = root + g.tokens(g.n(32, 512))
            else:
                branches[i] = req
        else:
            req = root + g.tokens(g.n(32, 512))
            branches.append(req)
        out.append(req)
    return Workload(name, out, g.made, True)


WORKLOADS: dict[str, Callable[[int, int, float], Workload]] = {
    "prefix-exact": lambda s, r, k: _prefixed(
        "prefix-exact", s, r, k, prefixes=32, plen=(2048, 2048), nlen=(512, 2048), whole=False, batched=False
    ),
    "prefix-batched": lambda s, r, k: _prefixed(
        "prefix-batched", s, r, k, prefixes=32, plen=(2048, 2048), nlen=(512, 2048), whole=False, batched=True
    ),
    "few-long-cut": lambda s, r, k: _prefixed(
        "few-long-cut", s, r, k, prefixes=4, plen=(8192, 8192), nlen=None, whole=False, batched=True
    ),
    "few-long-whole": lambda s, r, k: _prefixed(
        "few-long-whole", s, r, k, prefixes=4, plen=(8192, 8192), nlen=None, whole=True, batched=True
    ),
    "many-short-cut": lambda s, r, k: _prefixed(
        "many-short-cut", s, r, k, prefixes=512, plen=(32, 256), nlen=None, whole=False, batched=True
    ),
    "many-short-whole": lambda s, r, k: _prefixed(
        "many-short-whole", s, r, k, prefixes=512, plen=(32, 256), nlen=None, whole=True, batched=True
    ),
    "chat": lambda s, r, k: _chat("chat", s, r, k),
    "long-context": lambda s, r, k: _prefixed(
        "long-context",
        s,
        max(2, r // 10),
        k,
        prefixes=6,
        plen=(32_768, 32_768),
        nlen=(8192, 32_768),
        whole=False,
        batched=True,
    ),
    "fanout": lambda s, r, k: _fanout("fanout", s, r, k),
}
SMALL = {"requests": 48, "scale": 1 / 16}
"""``--small``: the smoke test's size."""


def make_workload(name: str, requests: int, *, seed: int = 0, scale: float = 1.0) -> Workload:
    """Workload ``name`` generated from ``seed``: its own random stream (``-exact``/``-batched``, ``-cut``/``-whole``
    share one: the same prefixes and lengths)."""
    stream = name
    for variant in ("-exact", "-batched", "-cut", "-whole"):  # NOTE: variants of one trace share its stream
        stream = stream.removesuffix(variant)
    return WORKLOADS[name](seed * 1_000_003 + zlib.crc32(stream.encode()), requests, scale)


# ---------------------------------------------------------------- one implementation per class, same loop


class KvledgerOps:
    """kvledger's ``RadixCache`` (token or paged allocator on CPU)."""

    def __init__(self, pool: int, page: int) -> None:
        import torch

        from kvledger.impl.allocators import PagedAllocator, TokenAllocator
        from kvledger.impl.radix import RadixCache
        from kvledger.spec.types import Component, request

        self.torch, self.request, self.full = torch, request, Component.FULL
        self._owner: tuple[int, Any] = (0, None)
        self.kv = PagedAllocator(pool // page, page) if page > 1 else TokenAllocator(pool)
        self.cache = RadixCache(self.kv, page_size=page)

    def key(self, toks: list[int]) -> Any:
        return array("q", toks)  # NOTE: token ids as the 0.5.23 variants get them (a tensor key costs a copy)

    def match(self, key: Any) -> tuple[int, Any, Any]:
        m = self.cache.match_prefix(key)
        return m.length, m.indices, m.last_node

    def lock(self, node: Any) -> Any:
        return self.cache.inc_lock_ref(node)

    def unlock(self, h: Any) -> None:
        self.cache.dec_lock_ref(h)

    def available(self) -> int:
        return int(self.kv.available_size())

    def evict(self, n: int) -> int:
        return int(self.cache.evict(self.full, n))

    def owner(self, r: int) -> Any:
        """Request ``r``'s owner, made once per request (a scheduler keeps it with the request)."""
        if self._owner[0] != r:
            self._owner = (r, self.request(r))
        return self._owner[1]

    def alloc(self, r: int, n: int) -> Any:
        return self.kv.alloc(n, self.owner(r))

    def insert(self, r: int, key: Any, prefix: Any, new: Any, matched: int) -> None:
        value = self.torch.cat((prefix, new))
        res = self.cache.insert(key, value, self.owner(r))
        if res.dup_indices.numel():
            self.kv.free(res.dup_indices, self.owner(r))


class _SGLangOps:
    """What both SGLang variants share: a CPU token (or paged) allocator, eviction by token count."""

    torch: Any
    sg: Any
    alloc_: Any
    cache: Any

    def _setup(self, torch: Any, sg: Any, pool: int, page: int) -> None:
        self.torch, self.sg = torch, sg
        if page > 1:
            self.alloc_ = sg.allocator.PagedTokenToKVPoolAllocator(pool, page, torch.int64, "cpu", None, False)
        else:
            self.alloc_ = sg.allocator.TokenToKVPoolAllocator(pool, torch.int64, "cpu", None, False)

    def available(self) -> int:
        return int(self.alloc_.available_size())

    def evict(self, n: int) -> int:
        return int(self.cache.evict(self.sg.base.EvictParams(num_tokens=n)).num_tokens_evicted)

    def alloc(self, r: int, n: int) -> Any:
        return self.alloc_.alloc(n)


class Legacy59Ops(_SGLangOps):
    """SGLang 0.5.9 ``RadixCache``; the caller frees duplicates, as ``cache_finished_req`` does."""

    def __init__(self, pool: int, page: int) -> None:
        import torch

        from kvledger.contracts.adapters.sglang.legacy import _sglang

        _, sg = _sglang()
        self._setup(torch, sg, pool, page)
        params = sg.params.CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=self.alloc_, page_size=page
        )
        self.cache = sg.radix.RadixCache(params)

    def key(self, toks: list[int]) -> Any:
        return toks

    def match(self, key: Any) -> tuple[int, Any, Any]:
        m = self.cache.match_prefix(self.sg.base.MatchPrefixParams(key=self.sg.radix.RadixKey(key)))
        return len(m.device_indices), m.device_indices, m.last_device_node

    def lock(self, node: Any) -> Any:
        self.cache.inc_lock_ref(node)
        return node

    def unlock(self, node: Any) -> None:
        self.cache.dec_lock_ref(node)

    def insert(self, r: int, key: Any, prefix: Any, new: Any, matched: int) -> None:
        value = self.torch.cat((prefix, new))
        res = self.cache.insert(self.sg.base.InsertParams(key=self.sg.radix.RadixKey(key), value=value))
        self.alloc_.free(value[matched : res.prefix_len])


class Cpp520Ops(Legacy59Ops):
    """SGLang 0.5.20 ``RadixCacheCpp`` (the C++ tree, ``SGLANG_EXPERIMENTAL_CPP_RADIX_TREE``); the caller frees
    duplicates, as its ``cache_finished_req`` does; a lock is the node id ``match_prefix`` returned."""

    def __init__(self, pool: int, page: int) -> None:
        import torch

        from kvledger.contracts.adapters.sglang.legacy_cpp import radix_cache_cpp, sglang_cpp

        _, sg = sglang_cpp()
        self._setup(torch, sg, pool, page)
        params = sg.params.CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=self.alloc_, page_size=page
        )
        self.cache = radix_cache_cpp(params)

    def insert(self, r: int, key: Any, prefix: Any, new: Any, matched: int) -> None:
        value = self.torch.cat((prefix, new))
        prefix_len = self.cache._insert(self.sg.radix.RadixKey(key), value)
        self.alloc_.free(value[matched:prefix_len])


class Unified523Ops(_SGLangOps):
    """SGLang 0.5.23 ``UnifiedRadixCache`` on one tree core; insert frees duplicates itself."""

    def __init__(self, pool: int, page: int, core: str) -> None:
        import torch

        from kvledger.contracts.adapters.sglang.unified import CORES, _sglang

        _, sg = _sglang()
        self._setup(torch, sg, pool, page)
        req_pool = sg.pool.ReqToTokenPool(size=4, max_context_len=4096, device="cpu", enable_memory_saver=False)
        params = sg.params.CacheInitParams(
            disable=False,
            req_to_token_pool=req_pool,
            token_to_kv_pool_allocator=self.alloc_,
            page_size=page,
            tree_components=(sg.ComponentType.FULL,),
            tree_core_backend=core,
        )
        self.cache = sg.unified.UnifiedRadixCache(params)
        assert type(self.cache.tree_core).__name__ == CORES[core], type(self.cache.tree_core).__name__

    def key(self, toks: list[int]) -> Any:
        return array("q", toks)

    def match(self, key: Any) -> tuple[int, Any, Any]:
        m = self.cache.match_prefix(self.sg.base.MatchPrefixParams(key=self.sg.radix.RadixKey(key)))
        n = int(m.device_prefix_len)
        idx = (
            self.cache.path_device_indices(m.last_device_node)[:n] if n else self.torch.empty(0, dtype=self.torch.int64)
        )
        return n, idx, m.last_device_node

    def lock(self, node: Any) -> Any:
        return self.cache.lock(node)

    def unlock(self, h: Any) -> None:
        self.cache.unlock(h)

    def insert(self, r: int, key: Any, prefix: Any, new: Any, matched: int) -> None:
        value = self.torch.cat((prefix, new))
        self.cache.insert(
            self.sg.base.InsertParams(key=self.sg.radix.RadixKey(key), value=value, prev_prefix_len=matched)
        )


def run_vllm_trace(requests: list[list[int]], pool: int, page: int) -> dict[str, float]:
    """vLLM's own per-request loop (``get_computed_blocks`` -> ``allocate_slots`` -> ``free``); hashing timed apart."""
    from kvledger.contracts.adapters.vllm.adapter import VLLMAdapter

    toks = [t[: len(t) - len(t) % page] for t in requests]
    longest = max(len(t) for t in toks)
    a = VLLMAdapter(block_size=page, num_blocks=pool // page, max_model_len=longest + page)
    mgr, pool_ = a.mgr, a.pool
    evicted = [0]
    inner = pool_._maybe_evict_cached_block

    def counting(block: Any) -> bool:  # NOTE: a measurement hook: counts, then does exactly what vLLM does
        gone = bool(inner(block))
        evicted[0] += page if gone else 0
        return gone

    pool_._maybe_evict_cached_block = counting
    start = clock()
    reqs = [a._make_request(r, tuple(t)) for r, t in enumerate(toks)]  # sha256 block hashes made here
    hash_seconds = clock() - start
    hit = 0
    gc.collect()  # NOTE: as in ``run_trace``
    start = clock()
    for req in reqs:
        blocks, n_hit = mgr.get_computed_blocks(req)[:2]
        if mgr.allocate_slots(req, req.num_tokens - n_hit, n_hit, blocks) is None:
            raise RuntimeError(f"vLLM request {req.request_id}: not admitted")
        mgr.free(req)
        hit += n_hit
    seconds = clock() - start
    start = clock()
    for req in reqs:
        mgr.get_computed_blocks(req)
    match_seconds = clock() - start
    return {
        "seconds": seconds,
        "requests": len(reqs),
        "tokens": sum(len(t) for t in toks),
        "hit_tokens": hit,
        "evicted_tokens": evicted[0],
        "match_seconds": match_seconds,
        "hash_seconds": hash_seconds,
    }


def build(variant: str, pool: int, page: int) -> Any:
    if variant.startswith("kvledger"):
        from kvledger.contracts import bindings

        bindings.install("on" if "contracts on" in variant else "off")
        return KvledgerOps(pool, page)
    if variant == "sglang 0.5.9 RadixCache":
        return Legacy59Ops(pool, page)
    if "RadixCacheCpp" in variant:
        return Cpp520Ops(pool, page)
    return Unified523Ops(pool, page, "rust" if "rust" in variant else "python")


def run_trace(ops: Any, requests: list[list[int]], page: int, slack: int = 0) -> dict[str, float]:
    """The per-request loop, evicting the shortfall plus ``slack`` when the pool is short; counts and timings."""
    keys = [ops.key(t[: len(t) - len(t) % page]) for t in requests]
    tokens = sum(len(t) - len(t) % page for t in requests)
    hit = evicted = 0
    gc.collect()  # NOTE: the last workload's tree is garbage with cycles: collect it now, not in this loop
    start = clock()
    for r, key in enumerate(keys, 1):
        n = len(key)
        matched, prefix, node = ops.match(key)
        h = ops.lock(node)
        need = n - matched
        if need:
            short = need - ops.available()
            if short > 0:
                evicted += ops.evict(short + slack)
            new = ops.alloc(r, need)
            if new is None:
                raise RuntimeError(f"request {r}: {need} slots not available after eviction")
            ops.insert(r, key, prefix, new, matched)
        ops.unlock(h)
        hit += matched
    seconds = clock() - start
    start = clock()
    for key in keys:
        ops.match(key)
    match_seconds = clock() - start
    return {
        "seconds": seconds,
        "requests": len(keys),
        "tokens": tokens,
        "hit_tokens": hit,
        "evicted_tokens": evicted,
        "match_seconds": match_seconds,
    }


PHASES = ("match", "lock", "evict", "alloc", "insert", "unlock")
"""The steps of one request in ``run_trace``'s loop, as ``--phases`` times them (``evict`` includes the free count)."""


def run_phases(ops: Any, requests: list[list[int]], page: int, slack: int = 0) -> dict[str, Any]:
    """``run_trace``'s loop with each step timed apart (``--phases``): seconds per phase, and the counts.

    NOTE: by ``time.perf_counter_ns`` inside the worker, whatever ``--clock`` says: the CPU clock costs
    ~1.4 µs a reading on this machine, more than a lock step, so it would drown the small phases. Run on a fresh
    cache, apart from the timed loop (whose ratios stay the benchmark's), with the same requests and results.
    """
    now = time.perf_counter_ns
    keys = [ops.key(t[: len(t) - len(t) % page]) for t in requests]
    spent = dict.fromkeys(PHASES, 0)
    hit = evicted = 0
    gc.collect()
    for r, key in enumerate(keys, 1):
        n = len(key)
        t0 = now()
        matched, prefix, node = ops.match(key)
        t1 = now()
        h = ops.lock(node)
        t2 = now()
        spent["match"] += t1 - t0
        spent["lock"] += t2 - t1
        need = n - matched
        if need:
            short = need - ops.available()
            if short > 0:
                evicted += ops.evict(short + slack)
            t3 = now()
            new = ops.alloc(r, need)
            t4 = now()
            ops.insert(r, key, prefix, new, matched)
            t5 = now()
            spent["evict"] += t3 - t2
            spent["alloc"] += t4 - t3
            spent["insert"] += t5 - t4
        else:
            t5 = now()
        ops.unlock(h)
        spent["unlock"] += now() - t5
        hit += matched
    return {"phase_seconds": {k: v / 1e9 for k, v in spent.items()}, "phase_hits": hit, "phase_evicted": evicted}


def run_workload(variant: str, w: Workload, page: int, phases: bool = False) -> dict[str, Any]:
    """``variant`` on workload ``w`` at ``page``, in a fresh cache and pool: one result (``phases``: and the loop's
    steps timed apart, in another fresh cache: ``run_phases``)."""
    pool = w.pool(page)
    requests = [t for t in w.requests if len(t) >= page]  # NOTE: every variant drops a request shorter than a page
    if variant.startswith("vllm"):
        result = run_vllm_trace(requests, pool, page)
    else:
        result = run_trace(build(variant, pool, page), requests, page, w.slack(page))
        if phases:
            split = run_phases(build(variant, pool, page), requests, page, w.slack(page))
            if (split.pop("phase_hits"), split.pop("phase_evicted")) != (
                result["hit_tokens"],
                result["evicted_tokens"],
            ):
                raise RuntimeError(f"{variant} {w.name}: the phase-timed loop disagrees with the timed loop")
            result.update(split)
    return {"variant": variant, "workload": w.name, "page": page, "pool": pool, "slack": w.slack(page), **result}


def worker(
    variant: str,
    names: list[str],
    requests: int,
    page: int,
    scale: float,
    clock_name: str = "wall",
    phases: bool = False,
) -> None:
    global clock
    clock = CLOCKS[clock_name]
    for name in names:
        result = run_workload(variant, make_workload(name, requests, scale=scale), page, phases)
        print("RESULT " + json.dumps(result), flush=True)


def python_of(version: str, venvs: dict[str, Path]) -> Path:
    venv = ROOT / "build" / version if version.startswith(("vllm-", "sglang-")) else venvs[version]
    return venv / "bin" / "python"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="all", help=f"comma-separated, of: {', '.join(WORKLOADS)} (default all)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--pages", default="1,16")
    parser.add_argument("--rounds", type=int, default=1, help="runs per variant, taking turns; the best is kept")
    parser.add_argument(
        "--variants", default="", help="comma-separated substrings: run kvledger and the variants naming one"
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="time loops by the wall clock or the worker's CPU",
    )
    parser.add_argument("--small", action="store_true", help="a few dozen short requests per workload (smoke test)")
    parser.add_argument("--detail", action="store_true", help="also a table per workload and page, every column")
    parser.add_argument(
        "--phases",
        action="store_true",
        help="also time each step of the loop apart (match, lock, evict, alloc, insert, unlock; in a second, fresh "
        "cache, by the wall clock inside the worker) and print where each variant's time goes",
    )
    parser.add_argument("--venv-059", type=Path, default=ROOT / "build" / "sglang-0.5.9")
    parser.add_argument("--venv-0523", type=Path, default=ROOT / "build" / "sglang-0.5.23")
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also race kvledger as of git revision REV ('kvledger (baseline)'): a lever's before/after in one run",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--page", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print the results as JSON lines too")
    args = parser.parse_args(argv)
    names = list(WORKLOADS) if args.workload == "all" else args.workload.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload {', '.join(unknown)} (known: {', '.join(WORKLOADS)})")
    requests, scale = (SMALL["requests"], SMALL["scale"]) if args.small else (args.requests, 1.0)
    if args.worker:
        worker(args.worker, names, int(requests), args.page, scale, args.clock, args.phases)
        return []
    venvs = {"0.5.9": args.venv_059, "0.5.23": args.venv_0523}
    for version, path in venvs.items():
        if not (path / "bin" / "python").exists():
            sys.exit(f"no SGLang {version} environment at {path}: run .ci/sglang_env first")
    wanted = [s for s in args.variants.split(",") if s]
    variants = {v: ver for v, ver in VARIANTS.items() if v == "kvledger" or not wanted or any(s in v for s in wanted)}
    env: dict[str, dict[str, str]] = {}
    if args.baseline:
        variants = {"kvledger": variants.pop("kvledger"), BASELINE: "0.5.23", **variants}
        env[BASELINE] = {**os.environ, "PYTHONPATH": str(snapshot(args.baseline, Path(tempfile.mkdtemp())))}
    skipped = [
        f"{v}: no venv at {python_of(ver, venvs).parents[1]}"
        for v, ver in variants.items()
        if not python_of(ver, venvs).exists()
    ]
    runs: list[dict[str, Any]] = []
    for page in (int(p) for p in args.pages.split(",")):
        for round_ in range(1, args.rounds + 1):
            for variant, version in variants.items():
                py = python_of(version, venvs)
                if not py.exists():
                    continue
                cmd = [str(py), __file__, "--worker", variant, "--page", str(page), "--workload", ",".join(names)]
                cmd += ["--small"] if args.small else ["--requests", str(requests)]
                cmd += ["--clock", args.clock] + (["--phases"] if args.phases else [])
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT, env=env.get(variant))
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                got = [{**json.loads(ln[len("RESULT ") :]), "round": round_} for ln in lines]
                runs += got
                if proc.returncode or len(got) != len(names):
                    why = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}, no message"]
                    skipped.append(f"{variant} page {page}: failed after {len(got)} workloads: {why[0][:160]}")
                print(f"ran {variant} page {page} round {round_}", file=sys.stderr)
    results = best_of(runs)
    report(results, list(variants), sorted(set(skipped)), detail=args.detail)
    if args.json:
        for r in runs:
            print(json.dumps(r))
    return results


def snapshot(rev: str, into: Path) -> Path:
    """kvledger's packages as of git revision ``rev`` under ``into/kvledger`` (put ``into`` on PYTHONPATH)."""
    (into / "kvledger").mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", rev, "spec", "impl", "contracts"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into / "kvledger")], input=archive, check=True)
    return into


def best_of(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (variant, workload, page): the fastest loop and the fastest match pass over its rounds."""
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in runs:
        key = (r["variant"], r["workload"], r["page"])
        if key not in best:
            best[key] = {**r, "rounds": 1}
            continue
        b = best[key]
        b["rounds"] += 1
        if (r["hit_tokens"], r["evicted_tokens"]) != (b["hit_tokens"], b["evicted_tokens"]):
            sys.exit(f"{key}: rounds disagree on hits or evictions, the workload is not deterministic")
        for k in ("seconds", "match_seconds", "hash_seconds"):
            if k in r:
                b[k] = min(b[k], r[k])
        if "phase_seconds" in r:  # NOTE: each phase's best round on its own (the noise is per phase)
            b["phase_seconds"] = {k: min(v, r["phase_seconds"][k]) for k, v in b["phase_seconds"].items()}
    return list(best.values())


def rate(r: dict[str, Any]) -> float:
    return float(r["requests"] / r["seconds"])


def short_name(variant: str) -> str:
    return variant.replace("sglang ", "").replace(" KVCacheManager", "").replace("unified ", "")


def disagreement(k: dict[str, Any], v: dict[str, Any]) -> str | None:
    """How ``v``'s hits or evictions differ from kvledger's ``k`` (``None``: they agree)."""
    if (k["hit_tokens"], k["evicted_tokens"]) == (v["hit_tokens"], v["evicted_tokens"]):
        return None
    hits, gone = f"{v['hit_tokens']:,} vs {k['hit_tokens']:,}", f"{v['evicted_tokens']:,} vs {k['evicted_tokens']:,}"
    return f"{v['workload']}: hits {hits}, evicted {gone}"


WHY_DIFFER = {
    "RadixCacheCpp": (
        "the C++ tree refreshes the nodes a walk passes whole but not the remainder of a node it splits (it keeps "
        "its older time; 0.5.9's Python tree and kvledger refresh it), so its heap of leaves evicts in another "
        "recency order; both orders obey the LRU laws (the cache check holds on it)"
    ),
    "vllm": (
        "vLLM matches whole blocks and recomputes the last token of a prompt cached whole (one block fewer), evicts "
        "one cached block at a time from its free queue's head (its own LRU order, block by block, no watermark), "
        "and keeps a null block out of the pool"
    ),
}
"""Why a variant's hits and evictions may differ from kvledger's by design; any other difference is a finding."""


def report(results: list[dict[str, Any]], variants: list[str], skipped: list[str], *, detail: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=220)
    others = [v for v in variants if v != "kvledger"]
    for page in sorted({r["page"] for r in results}):
        rows = {(r["variant"], r["workload"]): r for r in results if r["page"] == page}
        names = list(dict.fromkeys(r["workload"] for r in results if r["page"] == page and r["variant"] == "kvledger"))
        rounds = max(r["rounds"] for r in rows.values())
        present = [v for v in others if any((v, n) in rows for n in names)]
        table = Table(title=f"race, page size {page}: kvledger's throughput ÷ each variant's (best of {rounds})")
        for c in ["workload", "requests", "pool", "slack", "kvledger req/s", "hit rate"]:
            table.add_column(c, justify="left" if c == "workload" else "right")
        for v in present:
            table.add_column(f"× {short_name(v)}", justify="right")
        table.add_column("hits, evictions")
        ratios: dict[str, list[float]] = {v: [] for v in present}
        notes: dict[str, list[str]] = {}
        for n in names:
            k = rows[("kvledger", n)]
            cells, differ = [], []
            for v in present:
                r = rows.get((v, n))
                if r is None:
                    cells.append("—")
                    continue
                ratios[v].append(rate(k) / rate(r))
                cells.append(f"{rate(k) / rate(r):.2f}")
                why = disagreement(k, r)
                if why is not None:
                    differ.append(short_name(v))
                    notes.setdefault(v, []).append(why)
            table.add_row(
                n,
                f"{k['requests']:,}",
                f"{k['pool']:,}",
                f"{k['slack']:,}",
                f"{rate(k):,.0f}",
                f"{k['hit_tokens'] / k['tokens']:.4f}",
                *cells,
                "identical" if not differ else "differ: " + ", ".join(differ),
            )
        geo = [f"{math.exp(sum(map(math.log, x)) / len(x)):.2f}" if x else "—" for x in ratios.values()]
        table.add_row("geometric mean", "", "", "", "", "", *geo, "", style="bold")
        console.print(table)
        for v, lines in notes.items():
            reason = next((why for prefix, why in WHY_DIFFER.items() if prefix in v), None)
            head = f"{v} differs from kvledger ({reason})" if reason else f"{v} differs from kvledger: UNEXPECTED"
            console.print(f"  {head}: " + "; ".join(lines))
        if detail:
            for n in names:
                report_detail(console, page, n, [rows[(v, n)] for v in variants if (v, n) in rows])
        if any("phase_seconds" in r for r in rows.values()):
            report_phases(console, page, names, [[rows[(v, n)] for v in variants if (v, n) in rows] for n in names])
    for s in skipped:
        console.print(f"  not run: {s}")


def report_phases(console: Any, page: int, names: list[str], rows: list[list[dict[str, Any]]]) -> None:
    """Where each variant's time goes (``--phases``): µs a request per step, each the best of its rounds."""
    from rich.table import Table

    table = Table(title=f"where the time goes, page size {page}: µs a request, per step (wall clock in the worker)")
    for c in ["workload", "implementation", *PHASES, "sum", "timed loop"]:
        table.add_column(c, justify="left" if c in ("workload", "implementation") else "right")
    for name, group in zip(names, rows, strict=True):
        for r in group:
            split = r.get("phase_seconds")
            if split is None:
                continue
            us = [1e6 * split[p] / r["requests"] for p in PHASES]
            table.add_row(
                name,
                short_name(r["variant"]),
                *(f"{u:.1f}" for u in us),
                f"{sum(us):.1f}",
                f"{1e6 * r['seconds'] / r['requests']:.1f}",
            )
    console.print(table)


def report_detail(console: Any, page: int, name: str, rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title=f"{name}, page size {page}: {rows[0]['requests']:,} requests")
    cols = ["implementation", "requests/s", "match calls/s", "tokens/s", "hit rate", "evicted tokens", "hash s"]
    for c in cols:
        table.add_column(c, justify="left" if c == "implementation" else "right")
    for r in rows:
        table.add_row(
            r["variant"],
            f"{rate(r):,.0f}",
            f"{r['requests'] / r['match_seconds']:,.0f}",
            f"{r['tokens'] / r['seconds']:,.0f}",
            f"{r['hit_tokens'] / r['tokens']:.4f}",
            f"{r['evicted_tokens']:,}",
            f"{r['hash_seconds']:.2f}" if "hash_seconds" in r else "",
        )
    console.print(table)


if __name__ == "__main__":
    main()
