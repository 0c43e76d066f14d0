"""The pools a SGLang ``UnifiedRadixCache`` (0.5.11 to 0.5.23) runs on, for a :class:`CacheConfig`; their ledgers.

What each model kind gets (SGLang's own classes, ``device="cpu"``, no KV
buffers written):

* full attention: ``TokenToKVPoolAllocator`` (``PagedTokenToKVPoolAllocator``
  for pages, ``kvcache=None``) and a ``ReqToTokenPool``;
* + SWA: the static ``SWATokenToKVPoolAllocator`` over a real, tiny
  ``SWAKVPool`` (one full and one SWA layer), ``config.kv_tokens`` full and
  ``config.swa_tokens`` SWA slots. Every full slot it allocates gets an SWA
  slot (``full_to_swa_index_mapping``); ``free`` returns both, ``free_swa``
  (an SWA tombstone) only the SWA one. NOTE: not the unified virtual-page
  pool of ``sglang.test.unified_allocator_fixtures.build_swa_pool``: the tree
  side is the same ``SWAComponent``, and the static pool's free lists are
  plain slot ids a ledger can be read from;
* + Mamba: a ``HybridReqToTokenPool`` whose ``MambaSlotAllocator`` hands out
  ``config.mamba_slots`` state slots (the ``MambaComponent`` requires it).

:class:`UnifiedPools` also keeps what the adapter gave each request (SGLang
tracks that in its ``Req`` objects, which the adapter does not build) and
turns free lists, tree holdings and request records into ledgers.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

import torch

from kvledger.contracts.adapters.protocol import CacheConfig
from kvledger.contracts.adapters.sglang.common import alloc_state, free_state, ledger
from kvledger.spec.ledger import Ledger
from kvledger.spec.types import Owner


class UnifiedPools:
    """SGLang's allocators for one cache, the adapter's record of what each request holds, and the ledgers."""

    def __init__(self, config: CacheConfig, sg: SimpleNamespace) -> None:
        self.ps = config.page_size
        self.swa = config.window is not None
        self.mamba = config.mamba
        self.req_kv: dict[int, set[int]] = {}
        self.req_mamba: dict[int, set[int]] = {}
        self.freed_by_insert: dict[int, set[int]] = {}
        self.mamba_data: dict[int, int] = {}
        a = sg.allocator
        if self.swa:
            kv = _construct(
                sg.swa_pool.SWAKVPool,
                {"enable_kvcache_transpose": False},  # NOTE: required up to 0.5.13, gone by 0.5.23
                size=config.kv_tokens,
                size_swa=config.swa_tokens,
                page_size=1,
                dtype=torch.float16,
                head_num=1,
                head_dim=8,
                v_head_dim=8,
                swa_attention_layer_ids=[1],
                full_attention_layer_ids=[0],
                device="cpu",
            )
            self.allocator: Any = sg.swa_allocator.SWATokenToKVPoolAllocator(
                config.kv_tokens, config.swa_tokens, 1, torch.float16, "cpu", kv, False
            )
        elif self.ps > 1:
            self.allocator = a.PagedTokenToKVPoolAllocator(config.kv_tokens, self.ps, torch.int64, "cpu", None, False)
        else:
            self.allocator = a.TokenToKVPoolAllocator(config.kv_tokens, torch.int64, "cpu", None, False)
        if self.mamba:
            cache_params = SimpleNamespace(
                shape=SimpleNamespace(conv=[(1, 2)], temporal=(1, 1, 2)),
                dtype=SimpleNamespace(conv=torch.float32, temporal=torch.float32),
                layers=[0],
            )
            self.req_pool: Any = _construct(
                sg.pool.HybridReqToTokenPool,
                {},
                size=4,
                mamba_size=config.mamba_slots,
                mamba_spec_state_size=config.mamba_slots,
                max_context_len=64,
                device="cpu",
                enable_memory_saver=False,
                cache_params=cache_params,
                mamba_layer_ids=[0],
                enable_mamba_extra_buffer=False,
                enable_overlap_schedule=False,
            )
        else:
            self.req_pool = sg.pool.ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)

    # ------------------------------------------------------------ KV

    def alloc_kv(self, req: int, n: int) -> tuple[int, ...] | None:
        got = self.allocator.alloc(n)
        if got is None:
            return None
        slots = tuple(int(x) for x in got.tolist())
        self.req_kv.setdefault(req, set()).update(slots)
        return slots

    def free_kv(self, req: int, slots: tuple[int, ...]) -> None:
        # NOTE: a driver written before Inserted.dups_freed (the trace recorder) frees insert's duplicates
        # again; those are acknowledged here, never handed to SGLang's allocator twice.
        done = self.freed_by_insert.get(req, set())
        rest = [x for x in slots if x not in done]
        done.difference_update(slots)
        if rest:
            self.allocator.free(torch.tensor(rest, dtype=torch.int64))
        self.req_kv.setdefault(req, set()).difference_update(slots)

    def inserted(self, req: int, offered: tuple[int, ...], freed: tuple[int, ...]) -> None:
        """``insert`` took ``offered`` from ``req``: new pages to the tree, ``freed`` back to the free list."""
        self.freed_by_insert.setdefault(req, set()).update(freed)
        self.req_kv.setdefault(req, set()).difference_update(offered)

    def swa_of(self, full_slots: Iterable[int]) -> set[int]:
        """The SWA slots paired with ``full_slots`` (0, no pair, left out)."""
        xs = list(full_slots)
        if not xs:
            return set()
        mapped = self.allocator.full_to_swa_index_mapping[torch.tensor(xs, dtype=torch.int64)]
        return {int(x) for x in mapped.tolist() if int(x) > 0}

    # ------------------------------------------------------------ Mamba

    @property
    def mamba_allocator(self) -> Any:
        """The Mamba slot allocator the tree frees into: ``mamba_allocator`` from 0.5.13, ``mamba_pool`` before."""
        return getattr(self.req_pool, "mamba_allocator", None) or self.req_pool.mamba_pool

    def alloc_mamba(self, req: int) -> int | None:
        return alloc_state(self.mamba_allocator, req, self.req_mamba)

    def free_mamba(self, req: int, slot: int) -> None:
        free_state(self.mamba_allocator, req, slot, self.req_mamba)

    # ------------------------------------------------------------ ledgers

    def ledgers(
        self,
        kv_nodes: Mapping[Owner, Iterable[int]],
        swa_nodes: Mapping[Owner, Iterable[int]],
        mamba_nodes: Mapping[Owner, Iterable[int]],
    ) -> dict[str, Ledger]:
        """Each pool's ledger: SGLang's free list, the tree's holdings (per node owner), the requests' records."""
        out: dict[str, Ledger] = {}
        if self.swa:
            full, win = self.allocator.full_attn_allocator, self.allocator.swa_attn_allocator
            out["kv"] = ledger("kv", full.size, 1, _free(full), kv_nodes, self.req_kv)
            reqs = {r: self.swa_of(xs) for r, xs in self.req_kv.items()}
            out["swa"] = ledger("swa", win.size, 1, _free(win), swa_nodes, reqs)
        elif self.ps > 1:
            a = self.allocator
            every = getattr(a, "get_all_free_pages", None)  # NOTE: 0.5.23; before, free_pages + release_pages
            free = [int(x) for x in every().tolist()] if every is not None else _free(a)
            reqs = {r: {x // self.ps for x in xs} for r, xs in self.req_kv.items()}
            out["kv"] = ledger("kv", a.num_pages, 1, free, kv_nodes, reqs)
        else:
            out["kv"] = ledger("kv", self.allocator.size, 1, _free(self.allocator), kv_nodes, self.req_kv)
        if self.mamba:
            m = self.mamba_allocator
            free = [int(x) for x in m.free_slots.tolist()]
            out["mamba"] = ledger("mamba", m.size, 1, free, mamba_nodes, self.req_mamba)
        return out


def _construct(cls: Any, named_only: Mapping[str, Any], **kwargs: Any) -> Any:
    """``cls(**kwargs)`` as this release's ``cls`` takes it (releases differ in their arguments).

    ``kwargs`` it does not name are dropped unless it takes ``**kwargs``; ``named_only`` are passed only
    where ``cls`` names them (never into its ``**kwargs``).
    """
    params = inspect.signature(cls).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    kwargs.update({k: v for k, v in named_only.items() if k in params})
    return cls(**kwargs)


def _free(token_allocator: Any) -> list[int]:
    """A token allocator's free slots: its free list and the slots it holds back for release."""
    return [int(x) for x in torch.cat((token_allocator.free_pages, token_allocator.release_pages)).tolist()]
