"""Fresh memory bugs planted in the installed engine's own objects (SGLang or vLLM): does the system machine find them?

    build/sglang-0.5.23/bin/python tests/benchmarks/bench_engine_faults.py [--seeds 1,2,3] [--model full]
        [--fault kv-free-drop,...] [--set-aside sessions] [--adapter sglang-0.5.23-system-chunked] [--json out.json]
    build/vllm-0.10.2/bin/python tests/benchmarks/bench_engine_faults.py [--adapter vllm-hybrid] ...

A benchmark, not a test: run it with each release's venv (``.ci/sglang_env``, ``.ci/vllm_env``). The five seed bugs
are the ones the machines were built around; these are bugs nobody filed, of the kinds serving engines ship, planted
in the real engine's memory objects of every release alike, not in kvledger's reference. Each fault fires on one
call in ``--every`` (3 by default), so a run also meets the healthy path.

SGLang (the KV allocator, the request-to-token pool, the Mamba slot allocator, the tree cache):

* ``kv-free-drop``: the KV allocator's ``free`` does nothing (a release that forgets its slots);
* ``kv-free-short``: ``free`` gives back all but the last page (an off-by-one at the end of a range);
* ``kv-free-twice``: ``free`` gives the same slots back twice (a double free);
* ``kv-alloc-hands-back``: an ``alloc`` / ``alloc_extend`` / ``alloc_decode`` puts the first page it handed out back
  on the free list (a slot in use that the allocator counts free);
* ``row-free-drop``: the request-to-token pool's ``free`` does nothing (a row that lost its owner);
* ``lock-dec-drop``: the tree's ``dec_lock_ref`` does nothing (a lock its holder never gives back);
* ``lock-inc-undone``: ``inc_lock_ref`` takes the lock and gives it straight back (a holder running on a prefix
  it does not lock);
* ``lock-on-parent``: a request's tree lock is taken on the matched node's parent (a lock on the wrong node: the
  holder reads the matched node's KV with no lock on it). From 0.5.22 ``lock`` takes it and the ``TreeLock`` names
  the parent; before, ``inc_lock_ref`` does, and the request keeps naming the matched node;
* ``mamba-free-drop`` / ``mamba-alloc-hands-back`` (``--model mamba``): the Mamba state-slot allocator's ``free``
  does nothing, or its ``alloc`` puts the first slot it handed out back on the free list;
* ``mamba-lock-release-drop`` (``--model mamba``): the unified tree's Mamba component skips its part of a lock's
  release (``release_component_lock``; full attention's part goes on), so the state stays locked with no holder
  (0.5.11 on: 0.5.9 to 0.5.12's ``MambaRadixCache`` has no component call to plant it in, and reads ``never fired``);
* ``swa-lock-release-drop`` (``--model swa`` or ``hybrid``): the same for the SWA component (a window segment
  locked with no holder);
* ``swa-receipt-drop`` (``--model swa`` or ``hybrid``; B5's class): an SWA release is handed its receipt without
  the window's boundary uuid, so it walks to the root and lowers the counts of ancestors other holders locked.

vLLM (the ``BlockPool`` and its free queue, or the manager itself before 0.8; the single-type managers' tables):

* ``queue-release-drop``: the free queue's ``append`` / ``append_n`` / ``prepend_n`` drops the blocks it is given (a
  block whose last holder let go never comes back);
* ``queue-release-twice``: the free queue appends a released block twice (a double free);
* ``queue-remove-drop``: the free queue's ``remove`` does nothing (a cache hit that stays on the free list);
* ``touch-no-ref``: a cache hit (``touch``) takes the block off the free queue but does not count its new holder;
* ``new-no-ref``: ``get_new_blocks`` hands out its first block without counting the holder;
* ``evict-keeps-hash``: reusing a cached block skips dropping its hash (the index still names the old content);
* ``table-keep``: ``free`` releases a request's blocks but its block table keeps naming them.

Per seed the machine runs at the ``check`` profile on ``sglang-<release>-system`` (or ``vllm``, or ``--adapter``)
once unfaulted (the control: a fault's verdict counts only where the control holds, or breaks later or by another
law) and once per fault. It prints the law that broke first (or ``holds``), the programs and steps run, and the
time. A run counts as caught by a law only when the verdict is one of the system machine's laws; the engine's own
assert (``implementation crashed``) or another crash is counted apart, as the engine's catch, not kvledger's. A run
whose fault never fired (the release never called the planted site) reads ``never fired`` and is left out. Run it
with ``python -O`` to strip the engine's asserts and measure what the laws find alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hypothesis import settings
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lock_faults import plant as plant_lock
from bench_lock_faults import tree_cache

from kvledger.contracts.adapters.protocol import set_aside
from kvledger.contracts.adapters.sglang import cpu_import as sglang_import
from kvledger.contracts.adapters.system import SystemAdapter, SystemConfig, load_system_factory
from kvledger.contracts.adapters.vllm import cpu_import as vllm_import
from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.runner import run_machine
from kvledger.contracts.machines.suites import ENGINE_SYSTEM_CONFIGS
from kvledger.contracts.machines.system import RULES, machine_for_system


class Every:
    """Counts calls to one planted site; ``fires()`` is true on every ``n``-th. ``Every.fired`` counts the fires of
    every instance (a run whose fault never fired planted nothing, whatever its verdict)."""

    fired = 0

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def fires(self) -> bool:
        self.calls += 1
        if self.calls % self.n:
            return False
        Every.fired += 1
        return True


def scheduler(adapter: Any) -> Any:
    """The SGLang ``Scheduler`` an adapter drives (the mixin adapters' ``sched``, the components adapters' ``s``)."""
    return getattr(adapter, "sched", None) or adapter.s


def _plant_free(allocator: Any, fault: str, every: Every) -> None:
    """Fault the allocator's frees: ``free`` (slot ids) and, where the release has it, ``free_page_ids`` (page ids:
    0.5.23's paged allocator frees a request's segments through it and never calls ``free``). A free made inside
    another planted one (0.5.23's ``free_page_ids`` at page size 1 calls ``free``) passes through as it is."""
    depth = [0]

    def plant(name: str, unit: int) -> None:
        free = getattr(allocator, name)

        def faulty(ids: Any, *args: Any, **kwargs: Any) -> Any:
            fault_now = not depth[0] and ids is not None and len(ids) > 0 and every.fires()
            depth[0] += 1
            try:
                if not fault_now:
                    return free(ids, *args, **kwargs)
                if fault == "kv-free-drop":
                    return None
                if fault == "kv-free-short":  # NOTE: a whole page short (a token short of a page frees it anyway)
                    return free(ids[:-unit], *args, **kwargs) if len(ids) > unit else None
                free(ids, *args, **kwargs)
                return free(ids.clone(), *args, **kwargs)
            finally:
                depth[0] -= 1

        setattr(allocator, name, faulty)

    plant("free", max(1, int(getattr(allocator, "page_size", 1))))
    if callable(getattr(allocator, "free_page_ids", None)):
        plant("free_page_ids", 1)


def _plant_alloc(allocator: Any, every: Every) -> None:
    free = allocator.free

    def wrap(name: str) -> None:
        call = getattr(allocator, name, None)
        if call is None:
            return

        def faulty(*args: Any, **kwargs: Any) -> Any:
            got = call(*args, **kwargs)
            if got is not None and len(got) > 0 and every.fires():
                free(got[:1].clone())  # NOTE: the page of the first slot handed out goes back on the free list
            return got

        setattr(allocator, name, faulty)

    for name in ("alloc", "alloc_extend", "alloc_decode"):
        wrap(name)


def _plant_row(pool: Any, every: Every) -> None:
    free = pool.free

    def faulty(req: Any, *args: Any, **kwargs: Any) -> Any:
        return None if every.fires() else free(req, *args, **kwargs)

    pool.free = faulty


def _mamba_slots(adapter: Any) -> Any:
    """The Mamba state-slot allocator (``mamba_allocator`` from 0.5.13, the ``MambaPool`` itself before)."""
    pool = scheduler(adapter).req_to_token_pool
    found = getattr(pool, "mamba_allocator", None) or getattr(pool, "mamba_pool", None)
    if found is None:
        raise SystemExit("this model has no Mamba state pool: the mamba faults need --model mamba")
    return found


def _plant_lock_on_parent(adapter: Any, every: Every) -> None:
    """``lock-on-parent``: one lock in ``every`` whose node has a parent below the root goes to that parent."""
    cache = tree_cache(adapter)
    core = getattr(cache, "tree_core", None)

    def parent_of(node: Any) -> Any:
        """The parent below the root to lock instead of ``node`` (a node, or its id on a tree core), or ``None``."""
        if isinstance(node, int) and core is None:
            return None
        n = core.node_by_id(node) if isinstance(node, int) else node
        up = getattr(n, "parent", None)
        if up is None or getattr(up, "parent", None) is None:
            return None  # NOTE: the root, or a child of it: no other node to lock
        return up.id if isinstance(node, int) else up

    def make(call: Callable[..., Any]) -> Callable[..., Any]:
        def faulty(node: Any, *args: Any, **kwargs: Any) -> Any:
            up = parent_of(node)
            return call(up if up is not None and every.fires() else node, *args, **kwargs)

        return faulty

    _wrap(cache, "lock" if callable(getattr(cache, "lock", None)) else "inc_lock_ref", make)


def _component(adapter: Any, name: str) -> tuple[Any, Any] | None:
    """The unified tree's component ``name`` (``"MAMBA"``, ``"SWA"``) and its type, or ``None`` where the tree has
    no such per-component lock to plant in (``MambaRadixCache``, a config without it): the run reads never fired."""
    components = getattr(tree_cache(adapter), "components", None)
    if not isinstance(components, dict):
        return None
    return next(((c, t) for t, c in components.items() if t.name == name), None)


def _plant_component_release(adapter: Any, every: Every, name: str) -> None:
    """``mamba-lock-release-drop`` / ``swa-lock-release-drop``: the tree's component ``name`` skips one release in
    ``every``."""
    found = _component(adapter, name)
    if found is not None:
        _wrap(found[0], "release_component_lock", lambda call: lambda *a, **k: None if every.fires() else call(*a, **k))


def _plant_swa_receipt(adapter: Any, every: Every) -> None:
    """``swa-receipt-drop`` (B5's class): one SWA release in ``every`` is given its receipt without the window's
    boundary uuid, so it walks to the root and lowers the counts of ancestors other holders locked."""
    found = _component(adapter, "SWA")
    if found is None:
        return
    swa = found[1]

    def unbounded(params: Any) -> Any:
        uuids = getattr(params, "component_lock_uuids", None)
        if isinstance(uuids, dict) and uuids.get(swa) is not None:  # NOTE: 0.5.20 on
            return dataclasses.replace(params, component_lock_uuids={**uuids, swa: None})
        if getattr(params, "swa_uuid_for_lock", None) is not None:  # NOTE: to 0.5.19
            return dataclasses.replace(params, swa_uuid_for_lock=None)
        return None

    def make(call: Callable[..., Any]) -> Callable[..., Any]:
        def faulty(node: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
            dropped = unbounded(params) if params is not None else None
            return call(node, dropped if dropped is not None and every.fires() else params, *args, **kwargs)

        return faulty

    _wrap(found[0], "release_component_lock", make)


def _flat(blocks: Any) -> list[Any]:
    """The blocks of a list, a tuple of per-group lists or a ``KVCacheBlocks``, flattened in order."""
    inner = getattr(blocks, "blocks", blocks)
    out: list[Any] = []
    for x in inner or ():
        out.extend(_flat(x) if isinstance(x, list | tuple) else [x])
    return out


def _pool_call(adapter: Any, *names: str) -> tuple[Any, str]:
    """The vLLM object and method name of a block-pool call: ``BlockPool`` from 0.8, the manager's own before."""
    pool = adapter.pool
    for name in names:
        if callable(getattr(pool, name, None)):
            return pool, name
    raise SystemExit(f"vLLM {adapter.version} has none of {names} on {type(pool).__name__}")


def _wrap(obj: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Shadow ``obj.name`` with ``make(original)`` on the instance (the engine's own calls go through ``self``)."""
    setattr(obj, name, make(getattr(obj, name)))


def _plant_queue(adapter: Any, fault: str, every: Every) -> None:
    queue = adapter._queue()

    def releases(call: Callable[..., Any], many: bool) -> Callable[..., Any]:
        def faulty(arg: Any, *args: Any, **kwargs: Any) -> Any:
            blocks = list(arg) if many else [arg]
            given = blocks if many else arg  # NOTE: an iterator given to ``*_n`` was read into ``blocks``
            if not blocks or not every.fires():
                return call(given, *args, **kwargs)
            if fault == "queue-release-drop":
                return None
            call(given, *args, **kwargs)
            return call(blocks[:1] if many else arg, *args, **kwargs)

        return faulty

    for name, many in (("append", False), ("append_n", True), ("prepend_n", True)):
        if hasattr(queue, name):
            _wrap(queue, name, lambda call, many=many: releases(call, many))


def _plant_queue_remove(adapter: Any, every: Every) -> None:
    _wrap(adapter._queue(), "remove", lambda call: lambda b, *a, **k: None if every.fires() else call(b, *a, **k))


def _plant_uncounted(adapter: Any, every: Every, names: tuple[str, ...], given: Callable[[Any, Any], Any]) -> None:
    """After the pool call ``names`` names, the first block it gave a holder (``given(args, result)``) is counted one
    holder short: a cache hit taken off the free queue (``touch``) or a new block (``get_new_blocks``) whose holder is
    not counted."""
    pool, name = _pool_call(adapter, *names)

    def make(call: Callable[..., Any]) -> Callable[..., Any]:
        def faulty(*args: Any, **kwargs: Any) -> Any:
            out = call(*args, **kwargs)
            blocks = [b for b in _flat(given(args, out)) if not getattr(b, "is_null", False)]
            if blocks and every.fires():
                blocks[0].ref_cnt -= 1
            return out

        return faulty

    _wrap(pool, name, make)


def _plant_evict(adapter: Any, every: Every) -> None:
    pool, name = _pool_call(adapter, "_maybe_evict_cached_block", "_evict_cached_block")

    def make(call: Callable[..., Any]) -> Callable[..., Any]:
        def faulty(block: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(block, "block_hash", None) is not None and every.fires():
                return False
            return call(block, *args, **kwargs)

        return faulty

    _wrap(pool, name, make)


def _plant_table(adapter: Any, every: Every) -> None:
    def make(call: Callable[..., Any]) -> Callable[..., Any]:
        def faulty(request: Any, *args: Any, **kwargs: Any) -> Any:
            rid = request.request_id
            kept = [(t, list(t[rid])) for _, t in adapter._groups() if t.get(rid)]
            kept = kept if kept and every.fires() else []  # NOTE: a request holding nothing plants nothing
            out = call(request, *args, **kwargs)
            for table, blocks in kept:
                table[rid] = blocks
            return out

        return faulty

    _wrap(adapter.mgr, "free", make)


VLLM_FAULTS: dict[str, Callable[[Any, Every], None]] = {
    "queue-release-drop": lambda a, e: _plant_queue(a, "queue-release-drop", e),
    "queue-release-twice": lambda a, e: _plant_queue(a, "queue-release-twice", e),
    "queue-remove-drop": _plant_queue_remove,
    "touch-no-ref": lambda a, e: _plant_uncounted(a, e, ("touch", "_touch"), lambda args, out: args[0]),
    "new-no-ref": lambda a, e: _plant_uncounted(a, e, ("get_new_blocks", "_get_new_blocks"), lambda args, out: out),
    "evict-keeps-hash": _plant_evict,
    "table-keep": _plant_table,
}
"""vLLM's faults, planted on a freshly built adapter's ``KVCacheManager`` and its pool."""

SGLANG_FAULTS: dict[str, Callable[[Any, Every], None]] = {
    "kv-free-drop": lambda a, e: _plant_free(scheduler(a).token_to_kv_pool_allocator, "kv-free-drop", e),
    "kv-free-short": lambda a, e: _plant_free(scheduler(a).token_to_kv_pool_allocator, "kv-free-short", e),
    "kv-free-twice": lambda a, e: _plant_free(scheduler(a).token_to_kv_pool_allocator, "kv-free-twice", e),
    "kv-alloc-hands-back": lambda a, e: _plant_alloc(scheduler(a).token_to_kv_pool_allocator, e),
    "row-free-drop": lambda a, e: _plant_row(scheduler(a).req_to_token_pool, e),
    "lock-dec-drop": lambda a, e: plant_lock(tree_cache(a), "no-dec", fires=e.fires),  # NOTE: bench_lock_faults'
    "lock-inc-undone": lambda a, e: plant_lock(tree_cache(a), "no-inc", fires=e.fires),
    "lock-on-parent": _plant_lock_on_parent,
    "mamba-free-drop": lambda a, e: _plant_free(_mamba_slots(a), "kv-free-drop", e),
    "mamba-alloc-hands-back": lambda a, e: _plant_alloc(_mamba_slots(a), e),
    "mamba-lock-release-drop": lambda a, e: _plant_component_release(a, e, "MAMBA"),
    "swa-lock-release-drop": lambda a, e: _plant_component_release(a, e, "SWA"),
    "swa-receipt-drop": _plant_swa_receipt,
}
"""SGLang's faults, planted on a freshly built adapter (the machine builds one per program)."""

MAMBA_ONLY = frozenset({"mamba-free-drop", "mamba-alloc-hands-back", "mamba-lock-release-drop"})
SWA_ONLY = frozenset({"swa-lock-release-drop", "swa-receipt-drop"})

MODELS: dict[str, SystemConfig] = ENGINE_SYSTEM_CONFIGS
"""``kvledger check --adapter``'s system models (with the two sliding-window kinds, ``swa`` and ``hybrid``; with a
Mamba pool beside the window, more running requests meet SGLang's full-Mamba-pool crash first)."""


def factory(adapter_name: str, model: str, fault: str | None, every: int, aside: frozenset[str]) -> Callable[[], Any]:
    """A fresh adapter per program, with ``fault`` planted (``None``: the control)."""
    faults = VLLM_FAULTS if adapter_name.startswith("vllm") else SGLANG_FAULTS

    def make() -> SystemAdapter:
        adapter = set_aside(load_system_factory(adapter_name)(MODELS[model]), aside)
        if fault is not None:
            faults[fault](adapter, Every(every))
        return adapter

    return make


NEVER_FIRED = "never fired"
"""The verdict of a run whose fault never fired: the release never called the planted site (not a miss)."""


@dataclass(frozen=True)
class Run:
    fault: str
    seed: int
    verdict: str
    """The law that broke first, or ``holds``."""
    message: str
    examples: int
    steps: int
    seconds: float


def run(adapter_name: str, model: str, fault: str | None, seed: int, args: argparse.Namespace) -> Run:
    aside = frozenset(x for x in args.set_aside.split(",") if x)
    machine = machine_for_system(factory(adapter_name, model, fault, args.every, aside))
    profile = settings(settings.get_profile("check"))
    start = time.perf_counter()
    Every.fired = 0
    result = run_machine("system", model, machine, list(RULES), profile, seed=seed, shrink_for=args.shrink_for)
    v = result.violation
    unplanted = fault is not None and Every.fired == 0
    return Run(
        fault or "(none: control)",
        seed,
        NEVER_FIRED if unplanted else "holds" if v is None else v.rule,
        "" if v is None else str(v.message).splitlines()[0][:160],
        result.examples,
        result.steps,
        round(time.perf_counter() - start, 1),
    )


def engine() -> tuple[str, str, dict[str, Callable[[Any, Every], None]]]:
    """``(engine, release, its faults)`` of the engine installed here: SGLang, else vLLM."""
    release = sglang_import.installed_version_or_none()
    if release is not None:
        return "sglang", release, SGLANG_FAULTS
    release = vllm_import.installed_version_or_none()
    if release is not None:
        return "vllm", release, VLLM_FAULTS
    raise SystemExit(
        "neither SGLang nor vLLM is installed: run this with a release's venv (.ci/sglang_env, .ci/vllm_env)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated Hypothesis seeds")
    parser.add_argument("--model", default="full", choices=sorted(MODELS))
    parser.add_argument("--adapter", default=None, help="the system adapter (default sglang-<release>-system, vllm)")
    parser.add_argument("--fault", default=None, help="comma-separated (default: every fault of the engine installed)")
    parser.add_argument("--every", type=int, default=3, help="a fault fires on one call in this many")
    parser.add_argument("--set-aside", default="", help="capabilities (or laws) set aside, comma-separated")
    parser.add_argument("--shrink-for", type=float, default=5.0, help="seconds a violation may shrink")
    parser.add_argument("--json", type=Path, default=None, help="also write the runs here")
    args = parser.parse_args()
    name, release, known = engine()
    adapter = args.adapter or (f"sglang-{release}-system" if name == "sglang" else "vllm")
    config = MODELS[args.model]
    default = [f for f in known if (f not in MAMBA_ONLY or config.mamba) and (f not in SWA_ONLY or config.window)]
    faults = [f for f in args.fault.split(",") if f] if args.fault else default
    unknown = [f for f in faults if f not in known]
    if unknown:
        raise SystemExit(f"unknown fault(s) {', '.join(unknown)}: {name}'s faults are {', '.join(known)}")
    register_profiles()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [run(adapter, args.model, None, seed, args) for seed in seeds]
    runs += [run(adapter, args.model, fault, seed, args) for fault in faults for seed in seeds]
    control = {r.seed: r for r in runs if r.fault.startswith("(")}
    table = Table(title=f"{name} {release} ({adapter}): planted faults, system/{args.model}, one call in {args.every}")
    for col in ("fault", "seed", "verdict", "programs", "steps", "time", "first line"):
        table.add_column(col)
    caught = crashed = 0
    for r in runs:
        c = control[r.seed]
        found = r.verdict not in ("holds", NEVER_FIRED) and (c.verdict != r.verdict or c.examples > r.examples)
        if found and not r.fault.startswith("("):
            caught += r.verdict in RULES
            crashed += r.verdict not in RULES
        table.add_row(r.fault, str(r.seed), r.verdict, str(r.examples), str(r.steps), f"{r.seconds}s", r.message[:80])
    Console().print(table)
    unplanted = sum(r.verdict == NEVER_FIRED for r in runs)
    planted = len(runs) - len(control) - unplanted
    Console().print(
        f"caught by a law in {caught} of {planted} planted runs, by a crash (the engine's own assert) in {crashed} "
        f"(a verdict other than the control's, or earlier); {unplanted} run(s) never fired their fault"
    )
    if args.json is not None:
        runs_out = [asdict(r) for r in runs]
        args.json.write_text(
            json.dumps({"engine": name, "release": release, "adapter": adapter, "model": args.model, "runs": runs_out})
        )


if __name__ == "__main__":
    main()
