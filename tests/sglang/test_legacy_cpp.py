"""SGLang 0.5.9 to 0.5.20's C++ radix tree (``RadixCacheCpp``) through the cache adapter protocol.

The tree is compiled on import (``torch.utils.cpp_extension``: a C++ compiler and ninja, about 30 s once, then
cached); without them the tests are skipped with that reason. Each test runs on the installed release (CI: 0.5.9,
0.5.10, 0.5.11, 0.5.13 and 0.5.17 within the range).
"""

from __future__ import annotations

import re
import shutil
from typing import Any

import pytest
from hypothesis import Phase, settings

from kvledger.contracts.adapters.protocol import CacheAdapter, CacheConfig
from kvledger.contracts.adapters.sglang.cpu_import import (
    LEGACY_CPP,
    SGLangVersionError,
    base_release,
    installed_release_or_none,
    installed_version_or_none,
)
from kvledger.contracts.machines.profiles import register_profiles

VERSION = installed_release_or_none()  # NOTE: a post release is judged as the release it patches
HAS_CPP = VERSION is not None and LEGACY_CPP.contains(VERSION)
pytestmark = pytest.mark.skipif(VERSION is None, reason="needs SGLang installed")
needs_cpp = pytest.mark.skipif(
    not HAS_CPP or shutil.which("c++") is None or shutil.which("ninja") is None,
    reason=f"needs {LEGACY_CPP.describe()} (have {VERSION}), a C++ compiler and ninja",
)
register_profiles()
CI = settings.get_profile("ci")
FIND = settings(CI, phases=[Phase.explicit, Phase.generate])
"""``ci`` without shrinking, for a test that asks only which law meets a planted bug first (the first failing
program as drawn: shrinking it took 20 to 40 s a test and changes nothing asserted)."""


def _adapter(page_size: int = 1) -> Any:
    from kvledger.contracts.adapters.sglang.legacy_cpp import radix_cache_cpp_factory

    return radix_cache_cpp_factory(CacheConfig(page_size=page_size))


@needs_cpp
@pytest.mark.parametrize("page_size", [1, 2])
def test_the_cpp_tree_conforms(page_size: int) -> None:
    """The whole cache machine on the C++ tree: every law it can express holds, the LRU order's included."""
    from kvledger.contracts.adapters.sglang.common import check
    from kvledger.contracts.adapters.sglang.legacy_cpp import radix_cache_cpp_factory

    run = check(lambda: radix_cache_cpp_factory(CacheConfig(page_size=page_size)), CI)
    assert run.result.ok, run.result.violation and run.result.violation.message
    assert run.result.examples >= 50 and run.result.steps > 500
    assert run.adapter == f"sglang-{installed_version_or_none()}/RadixCacheCpp"  # NOTE: the version as installed
    for law in ("inv_lock_ref_counts_handles", "inv_slots_conserved", "evicts_lru_first", "inv_content"):
        assert law not in run.skipped, law
    assert "double_dec_lock_ref (rule)" in run.skipped and "inv_lru_detached" in run.skipped


@needs_cpp
def test_a_tree_moved_inside_one_dump_is_refused_not_read_stale() -> None:
    """``one_dump`` promises its scope only reads: a lock (or an insert) made inside it moves the tree's size
    counters, and the next read of the kept dump raises ``StaleDump`` instead of answering with the tree as it was.
    Reads alone inside it answer from the one dump."""
    from kvledger.contracts.adapters.sglang.legacy_cpp import StaleDump, one_dump

    a = _adapter()
    slots = a.alloc_kv(1, 4)
    assert slots is not None
    a.write_kv(slots, (1, 2, 3, 4), 0)
    a.insert(1, (1, 2, 3, 4), slots, None)
    with one_dump():
        assert a.nodes() == a.nodes()
    with one_dump():
        a.nodes()
        a.lock((1, 2, 3, 4))
        with pytest.raises(StaleDump, match=r"one_dump: the C\+\+ tree moved inside a read-only scope"):
            a.nodes()
    slots2 = a.alloc_kv(2, 2)
    assert slots2 is not None
    a.write_kv(slots2, (7, 8), 0)
    with one_dump():
        a.nodes()
        a.insert(2, (7, 8), slots2, None)
        with pytest.raises(StaleDump):
            a.nodes()


@needs_cpp
def test_the_dump_reads_the_tree_a_split_and_a_lock_leave() -> None:
    """Two keys that share a page: the match of the shorter one splits the first node; its lock counts the node
    above too. The snapshot reads all of it from ``debug_print``, and the handle covers the matched pages."""
    from kvledger.spec.types import Component

    a = _adapter()
    assert isinstance(a, CacheAdapter) and base_release(a.version) == VERSION
    slots = a.alloc_kv(1, 4)
    assert slots is not None
    a.write_kv(slots, (1, 2, 3, 4), 0)
    assert a.insert(1, (1, 2, 3, 4), slots, None).prefix_len == 0
    m, h = a.lock((1, 2, 9))
    assert (m.length, m.slots) == (2, slots[:2])
    nodes = a.nodes()
    top = next(n for n in nodes.values() if n.parent == 0)
    (low,) = (n for n in nodes.values() if n.parent == top.nid)
    assert (top.tokens, top.slots, top.lock_ref) == ((1, 2), slots[:2], 1)
    assert (low.tokens, low.slots, low.lock_ref) == ((3, 4), slots[2:], 0)
    snap = a.snapshot()
    assert snap.prefix.full == {(1,): slots[:1], (1, 2): slots[1:2], (1, 2, 3): slots[2:3], (1, 2, 3, 4): slots[3:]}
    assert snap.locks.handles[a.handle_id(h)] == {((1,), Component.FULL), ((1, 2), Component.FULL)}
    assert snap.sizes[Component.FULL] == (2, 2)
    a.unlock(h)
    assert a.snapshot().sizes[Component.FULL] == (4, 0)


def test_a_malformed_dump_is_refused_by_name() -> None:
    """Lines the parser cannot read, a node under no printed node, a node without its key line, a key or slots of
    another length, a key the debug limit hid: each a ``ValueError`` naming what is wrong (never a silently wrong
    tree)."""
    from kvledger.contracts.adapters.sglang.legacy_cpp import parse_dump

    good = (
        "Evictable size: 4\n0 [root]\n  2 [depth = 1] [len = 2] [gpu] [io = free] [rc = 0] [hit = 0]\n"
        "    1 [depth = 2] [len = 2] [gpu] [io = free] [rc = 0] [hit = 0]\n"
        "Node 1: key = [3, 4] device_indices = [3, 4] host_indices = [[N/A]]\n"
        "Node 2: key = [1, 2] device_indices = [1, 2] host_indices = [[N/A]]\n"
    )
    nodes = parse_dump(good)
    assert [(n.nid, n.parent, n.tokens) for n in nodes.values()] == [(2, 0, (1, 2)), (1, 2, (3, 4))]
    bad = {
        good.replace("[rc = 0] [hit = 0]\n    1", "[rc = 0]\n    1"): "a line the adapter cannot read",
        good.replace("[depth = 2]", "[depth = 3]"): "node 1 at depth 3 below no printed node",
        good.replace("Node 1: key = [3, 4] device_indices = [3, 4] host_indices = [[N/A]]\n", ""): "node 1 has no key",
        good.replace("key = [3, 4]", "key = [3]"): "node 1 has len 2 but 1 tokens and 2 device indices",
        good.replace("device_indices = [3, 4]", "device_indices = [[N/A]]"): "but 2 tokens and 0 device indices",
        good.replace(
            "Node 1: key = [3, 4] device_indices = [3, 4] host_indices = [[N/A]]",
            "Node 1: key is too long (2 tokens), skipping...",
        ): "node 1's key (2 tokens) was not printed: SGLANG_RADIX_CPP_DEBUG_LIMIT is below it",
    }
    for text, why in bad.items():
        with pytest.raises(ValueError, match=re.escape(why)):
            parse_dump(text)


@needs_cpp
def test_a_release_that_never_unlocks_fails_the_lock_laws(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug in SGLang's wrapper: ``dec_lock_ref`` returns without calling into the tree. The general
    lock laws find it on the C++ tree, from its own counts."""
    from kvledger.contracts.adapters.sglang.common import check
    from kvledger.contracts.adapters.sglang.legacy_cpp import radix_cache_cpp_factory

    a = _adapter()
    monkeypatch.setattr(type(a.cache), "dec_lock_ref", lambda self, node, params=None: None)
    run = check(lambda: radix_cache_cpp_factory(CacheConfig()), FIND)
    v = run.result.violation
    assert v is not None and v.rule.startswith("inv_lock"), v


@needs_cpp
def test_an_eviction_that_keeps_the_slots_fails_conservation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug in SGLang's wrapper: ``evict`` drops the tree's nodes but never frees their slots. The
    slots then belong to nobody, and the conservation law names them."""
    from kvledger.contracts.adapters.sglang.common import check
    from kvledger.contracts.adapters.sglang.legacy_cpp import radix_cache_cpp_factory

    a = _adapter()
    base = a.sg.base

    def evict(self: Any, params: Any) -> Any:
        evicted = self.tree.evict(params.num_tokens)  # BUG: the evicted slots are never freed
        return base.EvictResult(num_tokens_evicted=sum(len(x) for x in evicted))

    monkeypatch.setattr(type(a.cache), "evict", evict)
    run = check(lambda: radix_cache_cpp_factory(CacheConfig()), FIND)
    v = run.result.violation
    assert v is not None and v.rule == "inv_slots_conserved", v


@pytest.mark.skipif(VERSION is None or HAS_CPP, reason=f"needs a release past {LEGACY_CPP.describe()}")
def test_a_release_without_the_cpp_tree_refuses_its_adapter_by_range() -> None:
    """Releases from 0.5.21 on ship no C++ tree: the adapter names the range it was tested on."""
    with pytest.raises(SGLangVersionError, match=re.escape(f"tested on ({LEGACY_CPP.describe()})")):
        _adapter()
