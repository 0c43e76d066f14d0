"""How the SGLang adapters read what moved between releases, checked without SGLang (fakes of its shapes).

The adapters drive every release from 0.5.9 to 0.5.23 by reading the installed code (a field, a signature, an
attribute), not a version table; these tests pin each reading on fakes, so the main venv (no SGLang) checks them,
and the release lists stay one list wherever they are named.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest
import torch

from kvledger.contracts.adapters.protocol import ALIASES
from kvledger.contracts.adapters.sglang import system_factory
from kvledger.contracts.adapters.sglang.common import FULL, MOST_STEPS, SWA, cow_request, match_slots, step_until
from kvledger.contracts.adapters.sglang.cpu_import import (
    COMPONENTS,
    EARLY_COMPONENTS,
    EARLY_UNIFIED,
    INC_LOCK,
    LEGACY,
    LEGACY_MAMBA,
    LEGACY_SWA,
    SCHEDULER,
    UNIFIED,
    StubbedGPUModule,
    _placeholder,
    base_release,
)
from kvledger.contracts.adapters.sglang.legacy import _publish_chunk_size, free_pages
from kvledger.contracts.adapters.sglang.legacy_swa import lock_receipt, release_args
from kvledger.contracts.adapters.sglang.scheduler_components import SplitKv, one_process
from kvledger.contracts.adapters.sglang.unified import CORE_VARIABLE, UnifiedLock, _environ, new_cache
from kvledger.contracts.adapters.sglang.unified_inc_lock import IncLockAdapter
from kvledger.contracts.adapters.system import COMPONENT_RELEASES, EARLY_COMPONENT_RELEASES, SYSTEM_ALIASES

ROOT = Path(__file__).resolve().parents[2]


def test_environ_sets_for_the_block_and_restores_what_was_there() -> None:
    name = "KVLEDGER_TEST_ENVIRON"
    os.environ.pop(name, None)
    with _environ(name, "python"):
        assert os.environ[name] == "python"
    assert name not in os.environ
    os.environ[name] = "rust"
    try:
        with pytest.raises(RuntimeError), _environ(name, "python"):
            assert os.environ[name] == "python"
            raise RuntimeError("the block fails")
        assert os.environ[name] == "rust"
        with _environ(name, None):  # NOTE: nothing asked: nothing set
            assert os.environ[name] == "rust"
        with _environ(name, "python"):
            del os.environ[name]  # NOTE: the block removed it: restoring must not fail
        assert os.environ[name] == "rust"
    finally:
        os.environ.pop(name, None)


def _fake_sglang(with_field: bool) -> tuple[SimpleNamespace, list[tuple[dict[str, Any], str | None]]]:
    """A release's ``CacheInitParams`` (with or without ``tree_core_backend``) and a cache that records what it
    was built with and the tree-core variable at that moment."""
    built: list[tuple[dict[str, Any], str | None]] = []
    fields: list[Any] = [("page_size", int)]
    if with_field:
        fields.append(("tree_core_backend", str, dataclasses.field(default="python")))
    params = dataclasses.make_dataclass("CacheInitParams", fields)

    class UnifiedRadixCache:
        def __init__(self, p: Any) -> None:
            built.append((dataclasses.asdict(p), os.environ.get(CORE_VARIABLE)))

    return SimpleNamespace(
        params=SimpleNamespace(CacheInitParams=params), unified=SimpleNamespace(UnifiedRadixCache=UnifiedRadixCache)
    ), built


def test_the_tree_core_goes_in_the_params_field_where_there_is_one_else_in_the_variable() -> None:
    os.environ.pop(CORE_VARIABLE, None)
    later, built = _fake_sglang(with_field=True)  # NOTE: 0.5.21 on
    new_cache(later, "rust", page_size=1)
    assert built == [({"page_size": 1, "tree_core_backend": "rust"}, None)]
    earlier, built = _fake_sglang(with_field=False)  # NOTE: 0.5.17 to 0.5.20
    new_cache(earlier, "rust", page_size=2)
    assert built == [({"page_size": 2}, "rust")]
    assert CORE_VARIABLE not in os.environ, "the variable is set while the cache is built only"
    new_cache(earlier, None, page_size=1)  # NOTE: no core asked: the release's default, nothing set
    assert built[-1] == ({"page_size": 1}, None)


def test_a_cache_built_on_another_tree_core_than_asked_is_refused() -> None:
    sg, built = _fake_sglang(with_field=True)
    falls_back = type("UnifiedTreeCore", (), {})  # NOTE: SGLang's Python core, whatever was asked

    class Cache(sg.unified.UnifiedRadixCache):  # type: ignore[name-defined,misc]
        def __init__(self, p: Any) -> None:
            super().__init__(p)
            self.tree_core = falls_back()

    sg.unified.UnifiedRadixCache = Cache
    assert isinstance(new_cache(sg, "python", page_size=1), Cache)
    with pytest.raises(RuntimeError, match=r"built a UnifiedTreeCore where the rust tree core .* was asked for"):
        new_cache(sg, "rust", page_size=1)
    assert len(built) == 2


def test_split_kv_fields_read_the_info_for_its_fields_and_the_owner_for_the_rest() -> None:
    owner = SimpleNamespace(req_pool_idx=3, kv_committed_len=5, kv=None)  # NOTE: 0.5.16 to 0.5.18, not allocated
    view = SplitKv(owner)
    assert (view.req_pool_idx, view.kv_committed_len, view.kv_allocated_len) == (3, 5, 0)
    owner.kv = SimpleNamespace(kv_allocated_len=8, swa_evicted_seqlen=2)
    assert (view.kv_allocated_len, view.swa_evicted_seqlen, view.req_pool_idx) == (8, 2, 3)
    with pytest.raises(AttributeError):
        _ = view.mamba_pool_idx  # NOTE: a field the owner lacks is no field, not a default


def test_one_process_state_is_read_from_the_release_fields() -> None:
    fields = ["tp_rank", "tp_size", "dp_rank", "dp_size", "dcp_size", "gpu_id"]  # NOTE: 0.5.16 adds dcp_size
    state = dataclasses.make_dataclass("ParallelState", [(f, int) for f in fields])
    got = one_process(state)
    assert dataclasses.asdict(got) == {
        "tp_rank": 0,
        "tp_size": 1,
        "dp_rank": 0,
        "dp_size": 1,
        "dcp_size": 1,
        "gpu_id": 0,
    }


def test_a_stubbed_class_types_a_pydantic_field_and_still_refuses_to_run() -> None:
    tag = _placeholder("xgrammar", "StructuralTag")
    model = pydantic.create_model("Request", tag=(tag | None, None))
    assert model(tag=None).tag is None
    assert model(tag="anything").tag == "anything"  # NOTE: any value: no value of the stub is ever made
    with pytest.raises(StubbedGPUModule):
        tag()


def _known_in_sglang_env() -> tuple[str, ...]:
    text = (ROOT / ".ci" / "sglang_env").read_text()
    found = re.search(r"^KNOWN=\(([^)]*)\)", text, re.M)
    assert found is not None, ".ci/sglang_env names no KNOWN releases"
    return tuple(found.group(1).split())


def test_every_driven_release_is_one_list() -> None:
    driven = (*system_factory.MIXINS, *EARLY_COMPONENT_RELEASES, *COMPONENT_RELEASES)
    known = _known_in_sglang_env()
    # NOTE: a post release the script also builds is driven as the release it patches (base_release)
    assert tuple(v for v in known if base_release(v) == v) == driven
    assert all(base_release(v) in driven and base_release(v) != v for v in known if v not in driven), known
    assert all(SCHEDULER.contains(v) for v in system_factory.MIXINS)
    assert all(EARLY_COMPONENTS.contains(v) for v in EARLY_COMPONENT_RELEASES)
    assert all(COMPONENTS.contains(v) for v in COMPONENT_RELEASES)
    assert not any(COMPONENTS.contains(v) for v in EARLY_COMPONENT_RELEASES)
    assert (EARLY_COMPONENTS.lowest, EARLY_COMPONENTS.highest) == (
        EARLY_COMPONENT_RELEASES[0],
        EARLY_COMPONENT_RELEASES[-1],
    )
    assert (COMPONENTS.lowest, COMPONENTS.highest) == (COMPONENT_RELEASES[0], COMPONENT_RELEASES[-1])
    assert all(
        f"sglang-{v}-system" in SYSTEM_ALIASES and f"sglang-{v}-system-chunked" in SYSTEM_ALIASES for v in driven
    )
    early_cache = [v for v in driven if EARLY_UNIFIED.contains(v)]
    assert all(f"sglang-{v}" in ALIASES for v in early_cache)
    inc_lock = [v for v in driven if INC_LOCK.contains(v)]
    assert (INC_LOCK.lowest, INC_LOCK.highest) == (inc_lock[0], inc_lock[-1])
    assert all(ALIASES[f"sglang-{v}"].endswith("unified_inc_lock:inc_lock_python_factory") for v in inc_lock)
    cache_ranges = (EARLY_UNIFIED, INC_LOCK, UNIFIED)
    cached = [v for v in driven if any(r.contains(v) for r in cache_ranges)]
    assert cached == list(driven[driven.index(EARLY_UNIFIED.lowest) :]), "every release from 0.5.11 has a cache range"
    assert all(sum(r.contains(v) for r in cache_ranges) == 1 for v in cached), "the cache ranges do not overlap"
    assert all(f"sglang-{v}" in ALIASES for v in cached)
    rust = [a.removeprefix("sglang-").removesuffix("-rust") for a in ALIASES if re.fullmatch(r"sglang-[\d.]+-rust", a)]
    assert all(INC_LOCK.contains(v) or UNIFIED.contains(v) for v in rust), "a Rust core only on a tree-core release"
    spec = importlib.util.spec_from_file_location("engine_envs", ROOT / "tests" / "test_engine_envs.py")
    assert spec is not None and spec.loader is not None
    envs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(envs)
    assert driven == envs.SGLANG, "tests/test_engine_envs.py looks for the venvs of every driven release"


def _inc_lock_adapter() -> IncLockAdapter:
    """An ``IncLockAdapter`` with only what its readings use: FULL and SWA, named as SGLang's ``ComponentType``."""
    a = IncLockAdapter.__new__(IncLockAdapter)
    a.ct = {FULL: "full", SWA: "swa"}
    a.comps = (FULL, SWA)
    return a


def _held(receipt: Any) -> UnifiedLock:
    return UnifiedLock(hid=1, tree_lock=receipt, node=None, match=None, key=())  # type: ignore[arg-type]


def test_the_inc_lock_receipt_is_read_in_each_of_its_shapes() -> None:
    a = _inc_lock_adapter()
    up_to_0519 = SimpleNamespace(swa_uuid_for_lock=7, skip_lock_node_ids={})
    at_0520 = SimpleNamespace(swa_uuid_for_lock=7, skipped_lock_components=("mamba",))
    from_0521 = SimpleNamespace(component_lock_uuids={"swa": 7}, skipped_lock_components=("mamba",))
    assert a._receipt(_held(up_to_0519)) == (7, frozenset())
    assert a._receipt(_held(at_0520)) == (7, frozenset({"mamba"}))
    assert a._receipt(_held(from_0521)) == (7, frozenset({"mamba"}))
    a.comps = (FULL,)  # NOTE: no SWA component: no boundary, whatever the receipt carries
    assert a._receipt(_held(from_0521))[0] is None and a._receipt(_held(up_to_0519))[0] is None


def test_the_released_window_goes_where_the_release_takes_it() -> None:
    a = _inc_lock_adapter()
    up_to_0520 = SimpleNamespace(swa_evicted_seqlen=0)
    a._mark_swa_released(up_to_0520, 3)
    assert up_to_0520.swa_evicted_seqlen == 3

    @dataclasses.dataclass
    class From0521:
        component_evicted_seqlens: dict[str, int] = dataclasses.field(default_factory=dict)

        def set_evicted_seqlen(self, component_type: str, length: int) -> None:
            self.component_evicted_seqlens[component_type] = length

    later = From0521()
    a._mark_swa_released(later, 3)
    assert later.component_evicted_seqlens == {"swa": 3}


def test_a_copy_on_write_slot_is_read_where_the_release_wrote_it() -> None:
    a = _inc_lock_adapter()
    req, slot_of = a._cow_request()
    assert slot_of(req) is None
    req.mamba_pool_idx = 5  # NOTE: 0.5.17 and 0.5.18 fill the request itself
    assert slot_of(req) == 5
    req, slot_of = a._cow_request()
    assert not req.kv.holds_mamba
    req.kv.mamba_pool_idx = 6  # NOTE: 0.5.19 on fill its ReqKvInfo
    assert slot_of(req) == 6


def test_the_legacy_caches_are_driven_on_every_release_that_ships_them() -> None:
    driven = (*system_factory.MIXINS, *EARLY_COMPONENT_RELEASES, *COMPONENT_RELEASES)
    radix = [v for v in driven if LEGACY.contains(v)]
    assert radix == list(driven), "RadixCache ships in every driven release"
    assert (LEGACY.lowest, LEGACY.highest) == (driven[0], driven[-1])
    mamba = [v for v in driven if LEGACY_MAMBA.contains(v)]
    assert (LEGACY_MAMBA.lowest, LEGACY_MAMBA.highest) == (mamba[0], mamba[-1]) == ("0.5.9", "0.5.20")
    radix_factory = "kvledger.contracts.adapters.sglang.legacy:radix_cache_factory"
    mamba_factory = "kvledger.contracts.adapters.sglang.legacy:mamba_radix_cache_factory"
    assert [a for a, t in ALIASES.items() if t == mamba_factory] == [f"sglang-{v}-mamba" for v in mamba]
    assert [a for a, t in ALIASES.items() if t == radix_factory and a.endswith("-radix")] == [
        f"sglang-{v}-radix" for v in radix
    ]
    swa = [v for v in driven if LEGACY_SWA.contains(v)]
    assert (LEGACY_SWA.lowest, LEGACY_SWA.highest) == (swa[0], swa[-1]) == ("0.5.9", "0.5.20")
    swa_factory = "kvledger.contracts.adapters.sglang.legacy_swa:swa_radix_cache_factory"
    assert [a for a, t in ALIASES.items() if t == swa_factory] == [f"sglang-{v}-swa" for v in swa]
    unified = (EARLY_UNIFIED, INC_LOCK, UNIFIED)
    before_unified = [v for v in radix if not any(r.contains(v) for r in unified)]
    assert before_unified == ["0.5.9", "0.5.10"]
    assert all(ALIASES[f"sglang-{v}"] == radix_factory for v in before_unified), "the plain name, before 0.5.11"


def test_the_swa_lock_receipt_is_read_as_the_release_gives_it() -> None:
    """0.5.9's ``inc_lock_ref`` returns the SWA uuid itself and ``dec_lock_ref`` takes it bare; from 0.5.10 an
    ``IncLockRefResult`` carries it and ``dec_lock_ref`` takes ``DecLockRefParams``."""
    assert lock_receipt(None) is None and lock_receipt(7) == 7
    assert lock_receipt(SimpleNamespace(delta=None, swa_uuid_for_lock=7)) == 7

    def dec_at_059(node: object, swa_uuid_for_lock: int | None = None) -> None: ...

    def dec_from_0510(node: object, params: object = None, skip_swa: bool = False) -> None: ...

    @dataclasses.dataclass
    class DecLockRefParams:
        swa_uuid_for_lock: int | None = None

    base = SimpleNamespace(DecLockRefParams=DecLockRefParams)
    assert release_args(dec_at_059, base, 7) == (7,)
    assert release_args(dec_from_0510, base, 7) == (DecLockRefParams(swa_uuid_for_lock=7),)
    assert release_args(dec_from_0510, base, None) == (DecLockRefParams(),)


def test_the_mamba_chunk_size_is_published_as_the_release_takes_it() -> None:
    published: list[Any] = []

    class ResolvedArgs:  # NOTE: 0.5.19 on: publishing calls resolve_once, so the args must be SGLang's own
        def __init__(self, model_path: str, device: str) -> None:
            self.model_path, self.device = model_path, device

        def resolve_once(self) -> None:
            raise AssertionError("publishing resolves the args; the adapter only builds them")

    later = SimpleNamespace(ServerArgs=ResolvedArgs, set_global_server_args_for_scheduler=published.append)
    _publish_chunk_size(later)
    (args,) = published
    assert isinstance(args, ResolvedArgs) and args._mamba_cache_chunk_size == 64  # type: ignore[attr-defined]
    assert (args.model_path, args.device) == ("dummy", "cpu")
    earlier = SimpleNamespace(
        ServerArgs=type("ServerArgs", (), {}), set_global_server_args_for_scheduler=published.append
    )
    _publish_chunk_size(earlier)  # NOTE: up to 0.5.18: any object with the field
    assert published[-1] == SimpleNamespace(mamba_cache_chunk_size=64)


def test_a_match_s_slots_are_read_where_the_release_keeps_them() -> None:
    node = object()
    up_to_0521 = SimpleNamespace(device_indices=torch.tensor([4, 5]), last_device_node=node)
    assert match_slots(None, up_to_0521) == (4, 5)
    paths: list[Any] = []

    def path_device_indices(n: Any) -> torch.Tensor:
        paths.append(n)
        return torch.tensor([7, 8, 9])

    cache = SimpleNamespace(path_device_indices=path_device_indices)
    from_0522 = SimpleNamespace(device_prefix_len=2, last_device_node=node)  # NOTE: the length only
    assert match_slots(cache, from_0522) == (7, 8) and paths == [node]
    assert match_slots(cache, SimpleNamespace(device_prefix_len=0, last_device_node=None)) == ()
    assert len(paths) == 1, "an empty match reads no path"


def test_free_pages_are_read_from_the_census_where_there_is_one() -> None:
    up_to_0519 = SimpleNamespace(free_pages=torch.tensor([3, 1]), release_pages=torch.tensor([2]))
    assert free_pages(up_to_0519) == [3, 1, 2]
    from_0520 = SimpleNamespace(  # NOTE: a paged allocator stages its frees; release_pages is None
        free_pages=torch.tensor([3]), release_pages=None, get_all_free_pages=lambda: torch.tensor([3, 1, 2])
    )
    assert free_pages(from_0520) == [3, 1, 2]


def test_a_legacy_copy_on_write_slot_is_read_where_the_release_wrote_it() -> None:
    req, slot_of = cow_request()
    assert slot_of(req) is None and req.mamba_pool_idx is None
    req.mamba_pool_idx = torch.tensor(5)  # NOTE: up to 0.5.18 the request itself
    assert int(slot_of(req)) == 5
    req, slot_of = cow_request()
    assert not req.kv.holds_mamba  # NOTE: 0.5.19 on allocate only for a request whose kv holds no state
    req.kv.mamba_pool_idx = torch.tensor(6)  # NOTE: 0.5.19 on its ReqKvInfo
    assert int(slot_of(req)) == 6


def test_a_decode_waits_out_the_prefills_before_it_and_a_stuck_one_is_given_up() -> None:
    """``step_until`` (the scheduler adapters' decode loop) bounds the steps in which a request does not move, not the
    steps in all: a scheduler that prefills each waiting request first (one step each, nothing decodes) is busy, not
    stuck; an engine that never decodes is given up after the slack; one that moves forever stops at MOST_STEPS."""
    waiting = [7, 8, 9, 10, 11, 12]  # more prefills than the n + 2 steps a fixed bound would allow for n = 3
    out: list[int] = []

    def busy() -> None:
        if waiting:
            waiting.pop()  # a prefill step: the running request does not decode
        else:
            out.append(1)

    steps = 0

    def counted(step: Any) -> Any:
        def run() -> None:
            nonlocal steps
            steps += 1
            step()

        return run

    assert step_until(counted(busy), lambda: len(out) >= 3, lambda: len(out), lambda: 2 + len(waiting))
    assert (len(out), steps) == (3, 9)

    steps = 0
    assert not step_until(counted(lambda: None), lambda: False, lambda: 0, lambda: 2)
    assert steps == 3  # more than the slack of 2 steps without a move

    steps = 0
    moved = iter(range(10**6))
    assert not step_until(counted(lambda: None), lambda: False, lambda: next(moved), lambda: 0)
    assert steps == MOST_STEPS


def test_the_early_schedulers_holders_get_the_skip_set_of_their_own_acquire() -> None:
    """0.5.13 to 0.5.16's holders keep no skip set: the adapter watches the cache's acquires and gives each holder
    the one of its own lock, so a tombstone its acquire passed over is no site of its handle (0.5.17 keeps it on
    the request). Checked on a fake cache: a new lock takes the step's last acquire of its node and uuid; a lock
    that did not move keeps its own; a session slot taking its request's lock over keeps the request's; a holder
    that holds nothing is forgotten."""
    from kvledger.contracts.adapters.sglang.scheduler_components_early import _Acquires, _Holder
    from kvledger.spec.types import request, session

    class Result(SimpleNamespace):
        pass

    class Cache:
        def inc_lock_ref(self, node: Any) -> Any:
            return Result(swa_uuid_for_lock=node.uuid, skip_lock_node_ids={"mamba": set(node.tombs)})

    cache, acq = Cache(), _Acquires()
    acq.watch(cache)
    n7 = SimpleNamespace(id=7, uuid=3, tombs={7})
    n8 = SimpleNamespace(id=8, uuid=None, tombs=set())
    a, b, s = request(1), request(2), session(1)
    cache.inc_lock_ref(n7)  # a's lock: node 7's Mamba state was a tombstone
    acq.settle({}, {a: (7, 3)})
    assert acq.kept[a] == ((7, 3), {"mamba": frozenset({7})})
    n7.tombs = set()  # revived
    cache.inc_lock_ref(n7)  # b's lock on the same node: nothing passed over
    cache.inc_lock_ref(n8)  # a temporary lock, released in the step
    acq.settle({a: (7, 3)}, {a: (7, 3), b: (7, 3)})
    assert acq.kept[a][1] == {"mamba": frozenset({7})}, "a lock that did not move keeps its own skip set"
    assert acq.kept[b][1] == {"mamba": frozenset()}
    acq.settle({a: (7, 3), b: (7, 3)}, {b: (7, 3), s: (7, 3)})  # a's turn ends: its session's slot takes its lock
    assert acq.kept[s][1] == {"mamba": frozenset({7})} and a not in acq.kept
    acq.settle({b: (7, 3), s: (7, 3)}, {s: (7, 3)})
    assert set(acq.kept) == {s}
    held = _Holder(SimpleNamespace(swa_uuid_for_lock=3, last_node=n7), acq.kept[s][1])
    assert held.swa_uuid_for_lock == 3 and held.skip_lock_node_ids == {"mamba": frozenset({7})}
    assert not hasattr(held, "lock")  # NOTE: the receipt readers tell releases apart by this field
