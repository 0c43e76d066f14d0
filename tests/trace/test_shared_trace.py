"""System traces of shared pools: blocks held by several holders at once, counted by the engine.

A toy engine with vLLM's shape (a reference count per block, one free queue
of free and cached blocks, prefix hits by block hash, a sentinel block) is
recorded through the request-level protocol, so the recorder and the replay
are tested without any engine installed (``tests/vllm/test_traces.py`` does the
same with vLLM itself). Hand-broken traces show each shared law failing with
exit 1 and naming the block and the holder; malformed shared events exit 2 at
their line; traces without shared pools replay as before.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from kvledger.contracts.adapters.system import (
    RequestView,
    SharedBlocks,
    StepResult,
    SystemConfig,
    SystemSnapshot,
)
from kvledger.contracts.trace.adapter_recorder import AdapterRecorder, CannotRecord, record_adapter_workload
from kvledger.contracts.trace.replay import ReplayResult, replay
from kvledger.contracts.trace.system_replay import SHARED_LAWS
from kvledger.spec.shared import SharedPool
from kvledger.spec.types import Component, Owner, request

BLOCK = 2
SENTINEL = 0


class ToyShared:
    """A block manager with shared blocks (vLLM's shape, in 80 lines): ``count`` per block, a free queue of free
    and cached blocks, a hash index of full blocks, block 0 a sentinel. ``leak_on_refusal``: a refused admission
    keeps the counts it raised on its cache hits (the class of vLLM 0.6.6.post1's finding)."""

    name, version, engine_class = "toy-shared", "1", "tests.ToyShared"
    capabilities = frozenset({"abort", "retract", "targeted_admission"})

    def __init__(self, blocks: int = 10, leak_on_refusal: bool = False) -> None:
        self.config = SystemConfig(page_size=BLOCK, kv_tokens=blocks * BLOCK)
        self.blocks, self.leak = blocks, leak_on_refusal
        self.count = [0] * blocks
        self.queue = [b for b in range(blocks) if b != SENTINEL]
        self.index: dict[tuple[int, ...], int] = {}
        self.key: dict[int, tuple[int, ...]] = {}
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}
        self.status: dict[int, str] = {}
        self.prefix: dict[int, int] = {}
        self.waiting: list[int] = []

    def _take(self) -> int:
        b = self.queue.pop(0)
        if b in self.key:  # evict a cached block
            del self.index[self.key.pop(b)]
        self.count[b] = 1
        return b

    def _cache(self, rid: int) -> None:
        toks, table = self.tokens[rid], self.tables[rid]
        for i, b in enumerate(table):
            prefix = tuple(toks[: (i + 1) * BLOCK])
            if len(prefix) == (i + 1) * BLOCK and prefix not in self.index and b not in self.key:
                self.index[prefix], self.key[b] = b, prefix

    def add_request(self, tokens: tuple[int, ...], session: int | None = None) -> int:
        rid = len(self.status)
        self.tokens[rid], self.status[rid], self.prefix[rid] = list(tokens), "waiting", 0
        self.waiting.append(rid)
        return rid

    def admit(self, budget: int, rid: int | None = None) -> StepResult:
        rid = rid if rid is not None else self.waiting[0]
        toks = self.tokens[rid]
        hits: list[int] = []
        while (len(hits) + 1) * BLOCK < len(toks) and tuple(toks[: (len(hits) + 1) * BLOCK]) in self.index:
            hits.append(self.index[tuple(toks[: (len(hits) + 1) * BLOCK])])
        need = -(-len(toks) // BLOCK) - len(hits)
        fits = len(toks) - len(hits) * BLOCK <= budget and need <= len([b for b in self.queue if b not in hits])
        if not fits and not self.leak:
            return StepResult(rejected=(rid,))
        for b in hits:
            if self.count[b] == 0:
                self.queue.remove(b)
            self.count[b] += 1
        if not fits:
            return StepResult(rejected=(rid,))
        self.tables[rid] = hits + [self._take() for _ in range(need)]
        self.prefix[rid], self.status[rid] = len(hits) * BLOCK, "running"
        self.waiting.remove(rid)
        self._cache(rid)
        return StepResult(admitted=(rid,))

    def extend(self, rid: int, n: int, ahead: int = 0) -> StepResult:
        for _ in range(n):
            if len(self.tokens[rid]) == len(self.tables[rid]) * BLOCK:
                if not self.queue:
                    return StepResult(rejected=(rid,))
                self.tables[rid].append(self._take())
            self.tokens[rid].append(len(self.tokens[rid]) % 3 + 1)
            self._cache(rid)
        return StepResult()

    def _free(self, rid: int) -> None:
        for b in reversed(self.tables.pop(rid, [])):
            self.count[b] -= 1
            if self.count[b] == 0:
                self.queue.append(b)

    def finish(self, rid: int) -> StepResult:
        self._free(rid)
        self.status[rid] = "finished"
        return StepResult(finished=(rid,))

    def abort(self, rid: int) -> StepResult:
        self._free(rid)
        if rid in self.waiting:
            self.waiting.remove(rid)
        self.status[rid] = "aborted"
        return StepResult(finished=(rid,))

    def retract(self, rid: int) -> StepResult:
        self._free(rid)
        self.status[rid] = "waiting"
        self.waiting.insert(0, rid)
        return StepResult(retracted=(rid,))

    def idle_check(self) -> None:
        return None

    def snapshot(self) -> SystemSnapshot:
        holders: dict[int, list[Owner]] = {}
        for rid, table in self.tables.items():
            for b in table:
                holders.setdefault(b, []).append(request(rid))
        pool = SharedPool(
            "kv",
            self.blocks,
            {b: tuple(hs) for b, hs in holders.items()},
            dict(enumerate(self.count)),
            tuple(self.queue),
            frozenset({SENTINEL}),
        )
        views = {
            r: RequestView(r, s, None, tuple(self.tokens[r]), len(self.tokens[r]), self.prefix[r], None)
            for r, s in self.status.items()
        }
        return SystemSnapshot({}, {}, views, page_size=BLOCK, shared=SharedBlocks({"kv": pool}))


def recorded(seed: int, ops: int = 200, **kw: Any) -> list[str]:
    buf = io.StringIO()
    record_adapter_workload(ToyShared(**kw), ops, seed, buf)  # type: ignore[arg-type]
    return buf.getvalue().splitlines()


def run(lines: list[str]) -> ReplayResult:
    return replay(io.StringIO("\n".join(lines) + "\n"))


# ---------------------------------------------------------------- recorded traces


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_recorded_trace_of_a_healthy_engine_replays_clean(seed: int) -> None:
    lines = recorded(seed)
    header = json.loads(lines[0])
    assert header["shared"] == {"kv": [[SENTINEL, 0]]} and header["pools"] == {"kv": [0, 10]}
    ops = {json.loads(t)["op"] for t in lines[1:]}
    assert {"join", "leave", "count", "queue"} <= ops
    r = run(lines)
    assert r.ok, (r.violation, r.error)
    for law in ("inv_refcount_counts_holders", "inv_free_iff_unheld", "inv_owners_account", "admission rolls back"):
        assert r.checked.get(law), law
    shared = [json.loads(t) for t in lines[1:] if json.loads(t)["op"] == "count"]
    assert any(c >= 2 for ev in shared for _, c in ev["counts"]), "no block was ever shared: the test proves little"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_engine_that_leaks_counts_on_refusal_fails_replay(seed: int) -> None:
    r = run(recorded(seed, leak_on_refusal=True))
    assert r.violation is not None, "the leaking engine replayed clean"
    assert r.violation.rule == "inv_refcount_counts_holders" and r.violation.op == "call admit", r.violation
    assert "kv block" in r.violation.message


def test_recording_refuses_an_engine_that_does_not_start_fresh() -> None:
    toy = ToyShared()
    toy.queue.pop()  # a block off the queue, held by nobody
    with pytest.raises(CannotRecord, match="fresh engine: its free queue"):
        AdapterRecorder(toy, io.StringIO())  # type: ignore[arg-type]
    toy.queue.append(toy.blocks - 1)
    toy.count[3] = 1  # counted, held by nobody
    with pytest.raises(CannotRecord, match=r"blocks \[3\] have non-zero counts"):
        AdapterRecorder(toy, io.StringIO())  # type: ignore[arg-type]


# ---------------------------------------------------------------- hand-broken recorded traces


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", ["a holder dropped", "a counter off by one", "a block freed while held"])
def test_a_hand_broken_trace_fails_naming_the_block_and_holder(
    name: str, seed: int, shared_breaks: dict[str, Any]
) -> None:
    lines = recorded(seed)
    assert run(lines).ok
    brk = shared_breaks[name]
    broken, block, holder = brk.apply(lines)
    r = run(broken)
    assert r.exit_code == 1 and r.violation is not None, (name, r.error)
    assert r.violation.rule in brk.laws, r.violation
    assert f"block {block}" in r.violation.message and holder in r.violation.message, r.violation.message
    assert f"kv block {block}" in r.violation.history and holder in r.violation.history


# ---------------------------------------------------------------- hand-written traces: each law has teeth

HEADER = {
    "kvledger_trace": 1,
    "config": {"page_size": 2},
    "adapter": "hand",
    "version": "1",
    "pools": {"kv": [0, 6], "mamba": [0, 2]},
    "shared": {"kv": [[0, 5]]},
}
ADD = [{"op": "call", "name": "add_request", "req": r, "tokens": [1, 2, 3]} for r in (0, 1)]


def admit(r: int, ok: bool = True) -> dict[str, Any]:
    return {"op": "call", "name": "admit", "req": r, "admitted": ok, "prefix_len": 0}


def call(name: str, r: int) -> dict[str, Any]:
    return {"op": "call", "name": name, "req": r}


def join(holder: str, *blocks: int) -> dict[str, Any]:
    return {"op": "join", "pool": "kv", "holder": holder, "blocks": list(blocks)}


def leave(holder: str, *blocks: int) -> dict[str, Any]:
    return {"op": "leave", "pool": "kv", "holder": holder, "blocks": list(blocks)}


def count(*pairs: tuple[int, int]) -> dict[str, Any]:
    return {"op": "count", "pool": "kv", "counts": [list(p) for p in pairs]}


def queue(joined: list[int], left: list[int]) -> dict[str, Any]:
    return {"op": "queue", "pool": "kv", "joined": joined, "left": left}


def hand(*events: dict[str, Any], header: dict[str, Any] | None = None) -> ReplayResult:
    lines = [json.dumps(header or HEADER)] + [json.dumps({"step": i, **e}) for i, e in enumerate(events, 1)]
    return run(lines)


# Two requests share block 1; each holds one block of its own; the sentinel (block 0, count 5) stands in twice.
SHARE = [
    *ADD,
    admit(0),
    join("req:0", 1, 2, 0),
    count((1, 1), (2, 1)),
    queue([], [1, 2]),
    admit(1),
    join("req:1/swa", 1, 3, 0, 0),
    count((1, 2), (3, 1)),
    queue([], [3]),
]
FREE_0 = [call("finish", 0), leave("req:0", 1, 2, 0), count((1, 1), (2, 0)), queue([2], [])]


def test_sharing_and_freeing_hold() -> None:
    r = hand(*SHARE, *FREE_0)
    assert r.ok, (r.violation, r.error)
    assert r.checked["inv_refcount_counts_holders"] >= 4 and r.checked["sentinel_count_fixed"] >= 1


@pytest.mark.parametrize(
    ("events", "law", "says"),
    [
        # the engine counts one holder of block 1 where two hold it
        ([*SHARE[:-2], count((1, 1), (3, 1)), SHARE[-1]], "inv_refcount_counts_holders", "req:1/swa"),
        # a negative count
        ([*SHARE, *FREE_0[:2], count((1, 1), (2, -1)), FREE_0[3]], "inv_refcount_nonnegative", "block 2"),
        # a freed block that never goes back onto the queue: lost
        ([*SHARE, *FREE_0[:3]], "inv_free_iff_unheld", "not on the free queue"),
        # a block queued while a holder still holds it
        ([*SHARE, *FREE_0[:3], queue([1, 2], [])], "inv_free_iff_unheld", "req:1/swa"),
        # a block queued twice
        ([*SHARE, *FREE_0[:3], queue([2, 4], [])], "inv_free_iff_unheld", "already"),
        # a block taken off the queue twice
        ([*SHARE[:-1], queue([], [3, 1])], "inv_free_iff_unheld", "not on it"),
        # the sentinel's count moves
        ([*SHARE[:-2], count((1, 2), (3, 1), (0, 7)), SHARE[-1]], "sentinel_count_fixed", "from 5 to 7"),
        # the sentinel goes onto the queue
        ([*SHARE, *FREE_0[:3], queue([2, 0], [])], "inv_sentinel_fixed", "sentinel kv block 0"),
        # a finished request still holds a block (its leave dropped one; the engine's count agrees with the trace)
        ([*SHARE, call("finish", 0), leave("req:0", 1, 0), count((1, 1)), queue([], [])], "inv_owners_account", "2"),
        # a holder leaves a block it does not hold
        ([*SHARE, call("finish", 0), leave("req:0", 3)], "inv_owners_account", "does not hold"),
        # a block given to a request that ended
        ([*SHARE, *FREE_0, call("extend", 0), join("req:0", 4)], "inv_owners_account", "ended"),
        # a rejected admission keeps a block (its count agrees: only the rollback law sees it)
        ([*ADD, admit(0, ok=False), join("req:0", 1), count((1, 1)), queue([], [1])], "admission rolls back", "1"),
        # a call that raised moved a block
        ([*ADD, {**admit(0), "error": "OutOfMemory"}, join("req:0", 1)], "rejected call leaves state unchanged", ""),
    ],
)
def test_each_shared_law_fails_on_a_hand_broken_trace(events: list[dict[str, Any]], law: str, says: str) -> None:
    r = hand(*events)
    assert r.exit_code == 1 and r.violation is not None, (r.error, r.checked)
    assert r.violation.rule == law, r.violation
    assert says in r.violation.message, r.violation.message


def test_an_admitted_request_that_loses_a_block_breaks_admission_commits() -> None:
    # req 0 is admitted a second time (after a retract it re-holds block 1); the same call drops block 1 again
    events = [
        *ADD[:1],
        admit(0),
        join("req:0", 1),
        count((1, 1)),
        queue([], [1]),
        call("retract", 0),
        leave("req:0", 1),
        count((1, 0)),
        queue([1], []),
    ]
    assert hand(*events).ok
    r = hand(*events[:5], admit(0), leave("req:0", 1), count((1, 0)), queue([1], []))
    assert r.violation is not None and r.violation.rule == "admission commits", r.violation
    assert "kv block 1" in r.violation.message


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"op": "own", "pool": "kv", "slots": [1], "src": None, "dst": "req:0"}, "pool 'kv' is shared"),
        ({"op": "join", "pool": "mamba", "holder": "req:0", "blocks": [1]}, "a shared pool"),
        ({"op": "join", "pool": "nope", "holder": "req:0", "blocks": [1]}, "a shared pool"),
        ({"op": "join", "pool": "kv", "holder": "req:0", "blocks": [6]}, "in [0, 6)"),
        ({"op": "leave", "pool": "kv", "holder": "request:0", "blocks": [1]}, "holder"),
        ({"op": "join", "pool": "kv", "holder": "req:0/kv", "blocks": [1]}, "holder"),
        ({"op": "join", "pool": "kv", "holder": "req:0", "blocks": [-1]}, "blocks"),
        ({"op": "count", "pool": "kv", "counts": [[1, 1], [1, 2]]}, "each item once"),
        ({"op": "count", "pool": "kv", "counts": [[1, 1.0]]}, "counts"),
        ({"op": "count", "pool": "kv", "counts": [[1]]}, "counts"),
        ({"op": "count", "pool": "kv", "counts": [[9, 1]]}, "in [0, 6)"),
        ({"op": "queue", "pool": "kv", "joined": [1, 1], "left": []}, "each item once"),
        ({"op": "queue", "pool": "kv", "joined": [], "left": [7]}, "in [0, 6)"),
        ({"op": "queue", "pool": "kv", "joined": []}, "'left'"),
        ({"op": "join", "pool": "kv", "holder": "req:0", "blocks": [1], "count": 1}, "unknown field"),
    ],
)
def test_malformed_shared_events_exit_2_at_their_line(event: dict[str, Any], expected: str) -> None:
    r = hand(*ADD, admit(0), event)
    assert r.exit_code == 2 and r.error is not None, r
    assert r.error.line == 5 and expected in str(r.error), r.error


@pytest.mark.parametrize(
    ("shared", "pools", "expected"),
    [
        ({"kvv": []}, {"kv": [0, 6]}, "among those of 'pools'"),
        ({"kv": [[6, 0]]}, {"kv": [0, 6]}, "in [0, 6)"),
        ({"kv": [[1, 0], [1, 0]]}, {"kv": [0, 6]}, "each sentinel once"),
        ({"kv": [1]}, {"kv": [0, 6]}, "sentinels"),
        ({"kv": [[1, True]]}, {"kv": [0, 6]}, "sentinels"),
        ([], {"kv": [0, 6]}, "an object"),
        ({"kv": []}, None, "only in a system trace"),
    ],
)
def test_a_malformed_shared_header_exits_2_at_line_1(shared: object, pools: object, expected: str) -> None:
    header = {**HEADER, "shared": shared, "pools": pools}
    if pools is None:
        del header["pools"]
    r = hand(*ADD, header=header)
    assert r.exit_code == 2 and r.error is not None and r.error.line == 1, r
    assert expected in str(r.error), r.error


def test_a_trace_without_shared_pools_replays_as_before_and_says_what_it_did_not_check() -> None:
    plain = {k: v for k, v in HEADER.items() if k != "shared"}
    r = hand(
        *ADD[:1],
        admit(0),
        {"op": "own", "pool": "mamba", "slots": [1], "src": None, "dst": "req:0"},
        call("finish", 0),
        {"op": "own", "pool": "mamba", "slots": [1], "src": "req:0", "dst": None},
        header=plain,
    )
    assert r.ok, (r.violation, r.error)
    unchecked = dict(r.unchecked)
    for law in SHARED_LAWS:
        assert law in unchecked and law not in r.checked
    r = hand(*ADD[:1], admit(0), join("req:0", 1), header=plain)
    assert r.exit_code == 2 and r.error is not None and "a shared pool" in str(r.error)


def test_a_huge_shared_pool_costs_only_the_blocks_that_move() -> None:
    """A shared pool of 2**31 blocks replays like one of 6 (a replay walking the pool would not finish)."""
    big = {**HEADER, "pools": {"kv": [0, 2**31]}}
    r = hand(*SHARE, *FREE_0, header=big)
    assert r.ok, (r.violation, r.error)


def test_a_holder_per_group_is_one_owner_for_the_end_of_a_request() -> None:
    """``req:1/swa`` is request 1's holding in one group: finishing request 1 must return it too."""
    r = hand(*SHARE, call("finish", 1), leave("req:1/swa", 1, 0, 0), count((1, 1)), queue([], []))
    assert r.violation is not None and r.violation.rule == "inv_owners_account"
    assert "req:1/swa" in r.violation.message and "kv block 3" in r.violation.message


def test_owner_strings_round_trip() -> None:
    from kvledger.contracts.trace.system_replay import parse_holder

    for o in (request(3), Owner(request(3).kind, 3, Component.SWA), Owner(request(3).kind, 0, Component.FULL)):
        assert parse_holder(str(o), 1) == o
