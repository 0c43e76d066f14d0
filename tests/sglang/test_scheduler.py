"""SGLang's real ``Scheduler`` behind the system adapter: B2 flagged in 0.5.9, B3 and B4 in 0.5.10, by general laws.

The programs are the machine's shrunk counterexamples, pasted; each replays
against the installed release: it breaks the law in the release that shipped
the bug and passes in the first release that fixed it.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import pytest

from kvledger.contracts.adapters.sglang.cpu_import import (
    base_release,
    installed_release_or_none,
    installed_version_or_none,
)
from kvledger.contracts.adapters.system import SystemAdapter, SystemConfig

VERSION = installed_release_or_none()  # NOTE: a post release is judged as the release it patches
DRIVEN = ("0.5.9", "0.5.10", "0.5.11", "0.5.12")
pytestmark = pytest.mark.skipif(VERSION not in DRIVEN, reason=f"needs SGLang {' or '.join(DRIVEN)}; have {VERSION}")
MAMBA = SystemConfig(mamba=True, ping_pong=0)


def _machine(config: SystemConfig) -> object:
    from kvledger.contracts.adapters.sglang.scheduler import scheduler_factory
    from kvledger.contracts.machines.system import machine_for_system

    state = machine_for_system(lambda: scheduler_factory(config))()
    state.inv_all_laws()
    return state


def test_the_real_scheduler_is_driven() -> None:
    from kvledger.contracts.adapters.sglang.scheduler import scheduler_factory

    a = scheduler_factory(MAMBA)  # NOTE: first: it imports SGLang with the CPU stubs
    import sglang.srt.managers.scheduler as sg  # type: ignore[import-not-found]

    assert isinstance(a, SystemAdapter) and base_release(a.version) == VERSION
    assert type(a.sched).__mro__[1] is sg.Scheduler and a.engine_class == "sglang.srt.managers.scheduler.Scheduler"
    assert a.cache_class == "MambaRadixCache"
    rid = a.add_request((5, 6, 7, 8))
    assert a.admit(64).admitted == (rid,)
    a.extend(rid, 2)
    assert a.finish(rid).finished == (rid,)
    verdict = a.idle_check()
    assert verdict is not None and verdict.ok, verdict
    snap = a.snapshot()
    assert snap.requests[rid].status == "finished" and not any(o.kind.value == "req" for o in snap.ledgers["kv"].held)
    assert a.oracle_calls() >= 3 and "scheduler.enable_overlap" in a.defaulted_flags


def test_b2_program() -> None:
    """B2 (SGLang PR #21404): a request rejected by the PrefillAdder keeps the Mamba slot its match allocated."""
    state = _machine(MAMBA)
    state.add_request(budget=64, prompt=0, sid=None, suffix=[])  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    state.add_request(budget=64, prompt=0, sid=None, suffix=[])  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    if VERSION == "0.5.9":
        with pytest.raises(AssertionError, match=r"admission rolls back: rejected request 3 keeps \{'mamba'"):
            state.add_request(budget=64, prompt=0, sid=None, suffix=[1])  # type: ignore[attr-defined]
    else:
        state.add_request(budget=64, prompt=0, sid=None, suffix=[1])  # type: ignore[attr-defined]
        state.inv_all_laws()  # type: ignore[attr-defined]


@pytest.mark.skipif(VERSION == "0.5.9", reason="streaming sessions arrive in 0.5.10 (B3's false positive)")
def test_b3_program() -> None:
    """B3 (SGLang PR #23496): the idle check counts an open session's Mamba slot as leaked (no session term)."""
    state = _machine(MAMBA)
    state.add_request(budget=64, prompt=0, sid=1, suffix=[])  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    state.end_or_chunk(op="finish", pick=0)  # type: ignore[attr-defined]
    if VERSION == "0.5.10":
        with pytest.raises(AssertionError, match=r"leak checker agrees with the ledgers: checker says ok=False"):
            state.inv_all_laws()  # type: ignore[attr-defined]
    else:
        state.inv_all_laws()  # type: ignore[attr-defined]
        state.close_session(sid=1)  # type: ignore[attr-defined]
        state.inv_all_laws()  # type: ignore[attr-defined]


@pytest.mark.skipif(VERSION == "0.5.9", reason="streaming sessions arrive in 0.5.10")
def test_b4_program() -> None:
    """B4 (SGLang PR #22862): a resumed session turn, retracted and admitted again, overwrites its row's tail.

    Seven of the machine's steps: a session's first turn ends; another request decodes, so that
    SGLang's retraction (which always keeps one request) picks the session's second turn; the
    turn is admitted again and ``alloc_for_extend`` writes over row entries the session still
    owns. 0.5.10 loses the slot (held by the session, named by nothing: ``inv_owners_account``);
    0.5.11 frees the tail first, and the turns and the close keep every law.
    """
    state = _machine(SystemConfig())
    state.add_request(budget=64, prompt=0, sid=1, suffix=[])  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    state.end_or_chunk(op="finish", pick=0)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    state.add_request(budget=64, prompt=1, sid=None, suffix=[])  # type: ignore[attr-defined]
    state.extend(pick=0, n=3, ahead=0)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    state.add_request(budget=64, prompt=0, sid=1, suffix=[1])  # type: ignore[attr-defined]
    state.end_or_chunk(op="retract", pick=0)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    assert [r for r, v in state.last.requests.items() if v.status == "waiting"] == [3]  # type: ignore[attr-defined]
    state.admit(budget=64, pick=0, batch=False)  # type: ignore[attr-defined]
    if VERSION == "0.5.10":
        with pytest.raises(AssertionError, match=r"inv_owners_account: pool 'kv': session:1 holds \[\d+\] but refer"):
            state.inv_all_laws()  # type: ignore[attr-defined]
        return
    state.inv_all_laws()  # type: ignore[attr-defined]
    for _ in range(2):
        state.end_or_chunk(op="finish", pick=0)  # type: ignore[attr-defined]
        state.inv_all_laws()  # type: ignore[attr-defined]
    state.close_session(sid=1)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    assert not state.last.sessions  # type: ignore[attr-defined]


@pytest.mark.skipif(VERSION == "0.5.9", reason="streaming sessions arrive in 0.5.10")
def test_b4_found_by_search() -> None:
    """B4 as ``kvledger check --suite system --model paged --adapter sglang-system --seed 2`` shrinks it (4 steps).

    A session's long first turn is aborted while it runs; 0.5.10 keeps the turn's KV in the
    session slot (committed 19 tokens, a partial tail page). The next turn is shorter, its match
    takes fewer tokens than were committed, and ``alloc_for_extend`` writes the new page over
    the row entries the session still owns: the overwritten page is in use and nobody's
    (``inv_slots_conserved``). 0.5.11 asserts sessions are append-only and frees the tail
    first; there the abort releases the turn, and every law holds.
    """
    from kvledger.contracts.machines.suites import SYSTEM_CONFIGS

    state = _machine(SYSTEM_CONFIGS["paged"])
    state.add_long_request(prompt=0, sid=2, suffix=[1] * 14)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    state.abort(pick=0)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    state.add_request(budget=64, prompt=0, sid=2, suffix=[])  # type: ignore[attr-defined]
    if VERSION == "0.5.10":
        with pytest.raises(AssertionError, match=r"inv_slots_conserved: pool 'kv'"):
            state.inv_all_laws()  # type: ignore[attr-defined]
        return
    state.inv_all_laws()  # type: ignore[attr-defined]
    state.close_session(sid=2)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]


@pytest.mark.skipif(VERSION == "0.5.9", reason="streaming sessions arrive in 0.5.10")
def test_b3_close_and_the_mamba_slot() -> None:
    """Closing the session frees its KV and row; 0.5.10 leaves its Mamba slot held, named by nobody."""
    from kvledger.contracts.adapters.sglang.scheduler import scheduler_factory
    from kvledger.spec.types import session

    a = scheduler_factory(MAMBA)
    a.open_session(1)
    rid = a.add_request((5, 6, 7, 8), session=1)
    a.admit(64)
    a.finish(rid)
    held = a.snapshot().ledgers["mamba"].held[session(1)]
    a.close_session(1)
    snap = a.snapshot()
    verdict = a.idle_check()
    assert not snap.references["mamba"].get(session(1)) and verdict is not None
    if VERSION == "0.5.10":
        assert snap.ledgers["mamba"].held.get(session(1)) == held
        assert not verdict.ok and "mamba" in verdict.message
    else:
        assert session(1) not in snap.ledgers["mamba"].held and verdict.ok, verdict


def test_sessions_are_declared_only_where_streaming_sessions_exist() -> None:
    from kvledger.contracts.adapters.sglang.scheduler import scheduler_factory

    a = scheduler_factory(SystemConfig(page_size=4))
    assert ("sessions" in a.capabilities) == (VERSION != "0.5.9")
    assert "locks" in a.capabilities  # NOTE: a streaming slot's lock is its session's handle
    rid = a.add_request((1, 2, 3, 4, 5))
    a.admit(64)
    a.extend(rid, 4)
    a.finish(rid)
    kv = a.snapshot().ledgers["kv"]
    assert kv.capacity == 12 and not any(o.kind.value == "req" for o in kv.held)  # pages, all back with the tree


def test_a_session_keeps_its_first_turns_lock_until_a_deferred_close_completes() -> None:
    """0.5.10 to 0.5.12: the first turn's lock passes to the session's slot at its finish, as the session's handle.
    A close while the turn runs is deferred (0.5.11 on) to the turn's end: the session is reported open, lock and
    all, until the loop's reaper completes the close at the next step. Every lock law holds throughout."""
    if VERSION == "0.5.9":
        pytest.skip("0.5.9 has no streaming sessions")
    from kvledger.contracts.adapters.sglang.scheduler import scheduler_factory
    from kvledger.contracts.machines.system import check_snapshot
    from kvledger.spec.locks import locked_length
    from kvledger.spec.types import HandleId

    a = scheduler_factory(SystemConfig())
    warm = a.add_request((5, 6, 7, 8, 9, 10, 11))
    a.admit(64)
    a.finish(warm)
    a.open_session(1)
    rid = a.add_request((5, 6, 7, 8, 9, 10, 11, 12), session=1)
    a.admit(64)
    a.extend(rid, 1)
    snap = a.snapshot()
    check_snapshot(snap, None, a.capabilities)
    assert snap.locks is not None and snap.requests[rid].status == "running"
    held = snap.requests[rid].handle
    assert held is not None and locked_length(snap.locks.handles[HandleId(held)]) >= 6
    a.close_session(1)
    a.finish(rid)
    snap = a.snapshot()
    check_snapshot(snap, None, a.capabilities)
    kept = snap.sessions[1].handle if 1 in snap.sessions else None
    assert snap.locks is not None and set(snap.locks.handles) == ({kept} if kept is not None else set())
    if VERSION != "0.5.10":  # NOTE: 0.5.10 closes at once (and frees the running turn's memory: its B3/B4 finding)
        assert kept is not None and locked_length(snap.locks.handles[HandleId(kept)]) >= 6
    a.admit(64)  # NOTE: the next step: the reaper completes the deferred close
    snap = a.snapshot()
    check_snapshot(snap, None, a.capabilities)
    assert 1 not in snap.sessions and snap.locks is not None and not snap.locks.handles and not snap.locks.lock_ref


def test_what_is_not_driven_is_refused_by_name() -> None:
    from kvledger.contracts.adapters.sglang.common import NotExpressible
    from kvledger.contracts.adapters.sglang.scheduler import SchedulerAdapter, scheduler_factory

    with pytest.raises(NotExpressible, match=r"ping-pong track buffers \(ping_pong=1\)"):
        SchedulerAdapter(SystemConfig(mamba=True, ping_pong=1))
    # the factory (what --adapter uses) drives a Mamba model without them, and its config says so
    assert scheduler_factory(SystemConfig(mamba=True, ping_pong=1)).config.ping_pong == 0
    with pytest.raises(NotExpressible, match="no sliding-window model"):
        scheduler_factory(SystemConfig(window=4))
    with pytest.raises(NotExpressible, match="page size 1 only"):
        scheduler_factory(SystemConfig(mamba=True, ping_pong=0, page_size=4))


@pytest.mark.parametrize("licensed", [True, False], ids=["prefix_cache", "set_aside"])
def test_a_match_one_token_short_fails_admission_reuses_the_cache(
    licensed: bool, licensed_machine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug planted in SGLang's own ``RadixCache.match_prefix``: a waiting request's key is matched but its last
    token, so it runs on a shorter prefix than the cache holds; everything stays owned and locked as it should.
    Only ``admission reuses the cache`` sees it; with the capability set aside the program passes every law."""
    from kvledger.contracts.adapters.sglang.scheduler import scheduler_factory

    state = licensed_machine(scheduler_factory(SystemConfig()), "prefix_cache", licensed)
    import dataclasses

    from sglang.srt.managers.schedule_batch import Req  # type: ignore[import-not-found]
    from sglang.srt.mem_cache.radix_cache import RadixCache  # type: ignore[import-not-found]

    match, init, admitting = RadixCache.match_prefix, Req.init_next_round_input, []

    def matching(self: object, *args: object, **kwargs: object) -> object:
        admitting.append(self)  # NOTE: the admission's own match (0.5.9 passes no request to a tree without Mamba)
        try:
            return init(self, *args, **kwargs)
        finally:
            admitting.pop()

    def short(self: object, params: object) -> object:
        n = len(params.key)  # type: ignore[attr-defined]
        if admitting and n > 1:
            params = dataclasses.replace(params, key=params.key[: n - 1])  # type: ignore[type-var, attr-defined]
        return match(self, params)

    monkeypatch.setattr(Req, "init_next_round_input", matching)
    monkeypatch.setattr(RadixCache, "match_prefix", short)
    state.add_request(budget=64, prompt=0, sid=None, suffix=[5, 6, 7, 8])  # type: ignore[attr-defined]
    state.finish(pick=0)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    if licensed:
        with pytest.raises(AssertionError, match=r"admission reuses the cache: request 2 \(8 tokens"):
            state.add_request(budget=64, prompt=0, sid=None, suffix=[5, 6, 7, 8])  # type: ignore[attr-defined]
        return
    state.add_request(budget=64, prompt=0, sid=None, suffix=[5, 6, 7, 8])  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]


@pytest.mark.parametrize("licensed", [True, False], ids=["caches_on_finish", "set_aside"])
def test_a_finish_that_does_not_insert_fails_inv_end_caches(
    licensed: bool, licensed_machine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug planted in SGLang's own ``RadixCache.cache_finished_req``: a finished request outside a session takes
    the path that frees its KV without caching it (``is_insert=False``, which SGLang has for requests it must not
    cache). Its prompt was cached after prefill, so only its decoded tokens are lost; every slot goes back to the
    free list. Only ``inv_end_caches`` sees it; with the capability set aside the program passes every law."""
    from kvledger.contracts.adapters.sglang.scheduler import scheduler_factory

    state = licensed_machine(scheduler_factory(SystemConfig()), "caches_on_finish", licensed)
    from sglang.srt.mem_cache.radix_cache import RadixCache  # type: ignore[import-not-found]

    cache_finished = RadixCache.cache_finished_req

    def no_insert(self: object, req: object, is_insert: bool = True, **kwargs: object) -> object:
        keep = is_insert and getattr(req, "session", None) is not None
        return cache_finished(self, req, is_insert=keep, **kwargs)

    monkeypatch.setattr(RadixCache, "cache_finished_req", no_insert)
    state.add_request(budget=64, prompt=0, sid=None, suffix=[5, 6, 7, 8])  # type: ignore[attr-defined]
    state.extend(pick=0, n=3, ahead=0)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    if licensed:
        with pytest.raises(AssertionError, match=r"inv_end_caches: request 1 finished with 11 tokens computed"):
            state.finish(pick=0)  # type: ignore[attr-defined]
        return
    state.finish(pick=0)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]


def test_finding_0_5_11_a_first_turn_aborted_while_it_runs_leaks_its_mamba_state() -> None:
    """Found by the system machine on 0.5.11's Mamba kind (80 programs at seed 1, then cut to its two steps): a
    streaming session's first turn is admitted and aborted while it runs. 0.5.11 (and 0.5.12) free its KV but keep
    its Mamba state, named by no structure (SGLang's own strict idle check agrees: ``leaked_mamba_pages``); 0.5.13
    and 0.5.23 pass the same program (``test_scheduler_components.py``). 0.5.10 meets B3 on it first (its idle
    check and the ledgers disagree); 0.5.9 has no streaming sessions (the turn is an ordinary request, and passes)."""
    state = _machine(MAMBA)
    state.add_request(budget=64, prompt=0, sid=1, suffix=[])  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    state.abort(pick=0)  # type: ignore[attr-defined]
    if VERSION in ("0.5.11", "0.5.12"):
        with pytest.raises(AssertionError, match=r"inv_owners_account: pool 'mamba': req:1 holds \[\d\] but refer"):
            state.inv_all_laws()  # type: ignore[attr-defined]
    elif VERSION == "0.5.10":
        with pytest.raises(AssertionError, match=r"leak checker agrees with the ledgers"):
            state.inv_all_laws()  # type: ignore[attr-defined]
    else:
        state.inv_all_laws()  # type: ignore[attr-defined]


@pytest.mark.skipif(VERSION not in ("0.5.11", "0.5.12"), reason="the session exemption of B2's fix came in 0.5.11")
@pytest.mark.parametrize("licensed", [True, False], ids=["reservations", "set_aside"])
def test_a_rejected_session_turn_keeps_its_mamba_slot_as_a_reservation(
    licensed: bool, licensed_machine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From 0.5.11 the scheduler frees a rejected request's copy-on-write Mamba slot only outside a session (a
    session's slot has its own lifecycle), as 0.5.13 and 0.5.23 do, so the adapter declares ``reservations`` for
    Mamba there. The program is the one ``kvledger check --suite system --adapter sglang-0.5.11-system --model mamba
    --seed 1`` met first without the licence (4 steps)."""
    from kvledger.contracts.adapters.sglang.scheduler import scheduler_factory

    state = licensed_machine(scheduler_factory(MAMBA), "reservations", licensed)
    state.arrive(budget=64, edge=None, prompt=0, step=False, suffix=[])  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    state.repeat_sequence(branch=None, finish=False, pick=0, sid=None)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    if licensed:
        state.repeat_sequence(branch=None, finish=False, pick=0, sid=1)  # type: ignore[attr-defined]
        state.inv_all_laws()  # type: ignore[attr-defined]
        return
    with pytest.raises(AssertionError, match=r"admission rolls back: rejected request 3 keeps \{'mamba'"):
        state.repeat_sequence(branch=None, finish=False, pick=0, sid=1)  # type: ignore[attr-defined]


def test_chunked_prefill_is_driven() -> None:
    """``sglang-V-system-chunked``: SGLang's chunked prefill on; a prompt longer than a chunk is admitted with its
    first chunk, each ``chunk`` step caches the chunk before it and prefills the next, and a request whose prompt is
    prefilled (or is still being prefilled, for ``extend``) is refused with a typed error that changes nothing."""
    from kvledger.contracts.adapters.sglang.common import SchedulerError
    from kvledger.contracts.adapters.sglang.scheduler import chunked_scheduler_factory
    from kvledger.spec.types import OwnerKind, request

    a = chunked_scheduler_factory(SystemConfig())
    assert a.chunk_tokens == 4 and {"chunk", "chunk_prompts_only", "caches_on_chunk"} <= a.capabilities
    assert "prefix_cache" not in a.capabilities
    rid = a.add_request(tuple(range(10, 21)))  # 11 tokens: chunks of 4, 4 and 3
    assert a.admit(64).admitted == (rid,)

    def tree(snap: object) -> int:
        kv = snap.ledgers["kv"]  # type: ignore[attr-defined]
        return sum(len(u) for o, u in kv.held.items() if o.kind is OwnerKind.NODE)

    snap = a.snapshot()
    r = snap.requests[rid]
    assert (r.status, r.kv_len, r.prefix_len, tree(snap)) == ("running", 4, 0, 0)
    with pytest.raises(SchedulerError, match=r"extend of request 1 by 1: its prompt is still being prefilled"):
        a.extend(rid, 1)
    assert a.snapshot() == snap
    a.chunk(rid)
    snap = a.snapshot()
    r = snap.requests[rid]
    assert (r.kv_len, r.prefix_len, tree(snap)) == (8, 4, 4)  # the first chunk cached, the request runs on it
    assert len(snap.ledgers["kv"].held[request(rid)]) == 4
    a.chunk(rid)  # the last chunk: prefilled, the prompt cached, a first token decoded
    snap = a.snapshot()
    assert (snap.requests[rid].kv_len, tree(snap)) == (11, 11)
    with pytest.raises(SchedulerError, match=r"chunk of request 1 \(running\): SGLang chunks a prompt only"):
        a.chunk(rid)
    assert a.snapshot() == snap
    assert a.finish(rid).finished == (rid,)
    verdict = a.idle_check()
    assert verdict is not None and verdict.ok, verdict


def test_the_checker_runs_chunked_prefill_without_a_finding() -> None:
    """``kvledger check --suite system --adapter sglang-0.5.9-system-chunked`` on the full and paged kinds (60
    programs each) holds, with the chunk's law checked (not among the skipped)."""
    import json

    from typer.testing import CliRunner

    from kvledger.contracts.cli import app

    if VERSION != "0.5.9":
        pytest.skip("0.5.10 ships B4 and 0.5.11+ the close leak: the machine stops there first")
    for model in ("full", "paged"):
        args = ["check", "--suite", "system", "--adapter", "sglang-0.5.9-system-chunked", "--model", model]
        result = CliRunner().invoke(app, [*args, "--examples", "60", "--seed", "5", "--json"])
        assert result.exit_code == 0, result.output
        payload = json.loads(result.stdout[result.stdout.index("{") :])
        (r,) = payload["results"]
        assert r["violation"] is None and "chunk caches its prefix" not in r["skipped"], r


@pytest.mark.parametrize("licensed", [True, False], ids=["caches_on_chunk", "set_aside"])
def test_a_stash_a_page_short_fails_chunk_caches_its_prefix(
    licensed: bool, licensed_machine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug planted in SGLang's own ``RadixCache.cache_unfinished_req``: stashing a chunked request
    (``chunked=True``), it caches the chunk's whole pages but the last, and the request runs on that shorter
    prefix, so its next chunk computes that page again into fresh slots written over the row entries that named
    the old ones. ``chunk caches its prefix`` names the cause at the chunk; set aside, the orphaned slots are
    found by ``inv_owners_account`` in the same step."""
    from kvledger.contracts.adapters.sglang.scheduler import chunked_scheduler_factory

    state = licensed_machine(chunked_scheduler_factory(SystemConfig(page_size=2)), "caches_on_chunk", licensed)
    from sglang.srt.mem_cache.radix_cache import RadixCache  # type: ignore[import-not-found]

    stash = RadixCache.cache_unfinished_req

    def short(self: object, req: object, chunked: bool = False, **kwargs: object) -> object:
        if not chunked:
            return stash(self, req, chunked=chunked, **kwargs)
        fill = req.fill_ids  # type: ignore[attr-defined]
        req.fill_ids = fill[: len(fill) - len(fill) % 2 - 2]  # type: ignore[attr-defined]
        try:
            return stash(self, req, chunked=chunked, **kwargs)
        finally:
            req.fill_ids = fill  # type: ignore[attr-defined]

    monkeypatch.setattr(RadixCache, "cache_unfinished_req", short)
    state.add_long_request(prompt=0, sid=None, suffix=[1] * 12, whole_row=False)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    if licensed:
        with pytest.raises(AssertionError, match=r"chunk caches its prefix: request 1 was chunked with 4 tokens"):
            state.chunk(pick=0)  # type: ignore[attr-defined]
        return
    state.chunk(pick=0)  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match=r"inv_owners_account: pool 'kv': req:1"):
        state.inv_all_laws()  # type: ignore[attr-defined]


@pytest.mark.parametrize("model", ["full", "paged", "mamba"])
def test_a_request_aborted_mid_prefill_ends_and_gives_everything_back(model: str) -> None:
    """Abort while a prompt is being prefilled in chunks: SGLang marks the request (``to_finish``) and it ends once
    its chunks have run; on the way and after it, every law holds and the engine's strict idle check passes."""
    from kvledger.contracts.adapters.sglang.scheduler import chunked_scheduler_factory
    from kvledger.contracts.machines.suites import SYSTEM_CONFIGS
    from kvledger.contracts.machines.system import machine_for_system

    config = SYSTEM_CONFIGS[model]
    a = chunked_scheduler_factory(config)
    state = machine_for_system(lambda: a)()
    state.inv_all_laws()  # type: ignore[attr-defined]
    state.add_long_request(prompt=0, sid=None, suffix=[1] * 14, whole_row=False)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    assert a.sched.chunked_req is a.reqs[1].sg
    state.abort(pick=0)  # type: ignore[attr-defined]
    state.inv_all_laws()  # type: ignore[attr-defined]
    for _ in range(4):
        state.chunk(pick=0)  # type: ignore[attr-defined]
        state.inv_all_laws()  # type: ignore[attr-defined]
    assert a.snapshot().requests[1].status == "aborted"
    verdict = a.idle_check()
    assert verdict is not None and verdict.ok, verdict


@pytest.mark.skipif(VERSION not in ("0.5.11", "0.5.12"), reason=f"0.5.11's and 0.5.12's outcome; have {VERSION}")
def test_finding_a_mamba_pool_with_every_state_held_crashes_the_scheduler(
    crash_on_a_full_mamba_pool: Callable[[Any], None],
) -> None:
    """The components adapters' finding (``test_scheduler_components.py``, found on 0.5.13 to 0.5.21), here on the
    mixin-era schedulers: the same five steps end in SGLang's own assertion ``Can not alloc mamba cache``, in the
    copy of the running state a prefill donates to the tree (``cache_unfinished_req``) with every Mamba slot
    held. 0.5.10 runs the same program through (its ``MambaRadixCache`` caches no unfinished request's state); 0.5.9
    ends it with B2 first."""
    crash_on_a_full_mamba_pool(_machine(SystemConfig(mamba=True)))


@pytest.mark.parametrize("cpp", [False, True], ids=["python_tree", "cpp_tree"])
def test_an_extend_waits_out_the_prefills_the_scheduler_runs_first(cpp: bool) -> None:
    """A running request decodes only in the steps the scheduler gives to decoding: while long requests wait to be
    prefilled (chunk by chunk here), a step decodes nothing. The adapter once gave an extend of ``n`` tokens ``n +
    2`` steps in all and read the request's short decode as a broken ``extend commits`` (``kvledger check --suite
    system --adapter sglang-0.5.9-system-cpp --model paged --seed 2``, 96 programs, shrunk to this one: the last
    extend of 7 tokens met two whole-row prompts waiting; 0.5.10 broke it too). It now bounds only the steps in
    which the request does not move, by the prefills still queued, and every law holds through the program."""
    import shutil

    from kvledger.contracts.adapters.system import load_system_factory
    from kvledger.contracts.machines.suites import SYSTEM_CONFIGS
    from kvledger.contracts.machines.system import machine_for_system
    from kvledger.spec.types import Component

    if cpp and (shutil.which("c++") is None or shutil.which("ninja") is None):
        pytest.skip("the C++ tree needs a C++ compiler and ninja")
    # NOTE: named by the version as installed: a post release's name (sglang-0.5.12.post1-system) is its release's
    name = f"sglang-{installed_version_or_none()}-system{'-cpp' if cpp else ''}"
    state: Any = machine_for_system(lambda: load_system_factory(name)(SYSTEM_CONFIGS["paged"]))()
    state.inv_all_laws()
    program: list[tuple[str, dict[str, Any]]] = [
        ("swarm", dict(off=frozenset({"tight budgets", "sessions"}))),
        ("add_long_request", dict(prompt=0, sid=None, suffix=[3, 1, 1, 1, 1, 3], whole_row=False)),
        ("abort", dict(pick=0)),
        ("add_request", dict(budget=13, prompt=2, sid=None, suffix=[1, 3, 1, 2])),
        ("retract", dict(pick=3)),
        ("add_request", dict(budget=15, prompt=3, sid=None, suffix=[])),
        ("retract", dict(pick=2)),
        ("evict", dict(comp=Component.MAMBA, n=8)),
        ("evict", dict(comp=Component.FULL, n=8)),
        ("extend", dict(ahead=0, n=2, pick=5)),
        ("extend", dict(ahead=1, n=2, pick=6)),
        ("add_request", dict(budget=7, prompt=0, sid=2, suffix=[1, 3, 3, 3])),
        ("add_long_request", dict(prompt=2, sid=1, suffix=[2, 3, 3, 2, 1, 2, 2, 3], whole_row=False)),
        ("abort", dict(pick=2)),
        ("add_request", dict(budget=16, prompt=0, sid=2, suffix=[1, 3, 1])),
        ("extend_far_ahead", dict(ahead=9, n=8, pick=1)),
        (
            "add_long_request",
            dict(prompt=0, sid=None, suffix=[3, 2, 2, 1, 2, 3, 3, 3, 3, 1, 3, 3, 3, 2], whole_row=True),
        ),
        ("add_long_request", dict(prompt=3, sid=None, suffix=[1, 3, 1, 3, 1, 2, 3, 1, 3], whole_row=True)),
        ("extend_far_ahead", dict(ahead=10, n=7, pick=5)),
        ("extend", dict(ahead=3, n=1, pick=2)),
        ("retract", dict(pick=0)),
        ("retract", dict(pick=3)),
        ("arrive", dict(budget=9, edge=-1, prompt=1, step=False, suffix=[3, 1, 2, 1])),
        ("repeat_sequence", dict(branch=None, finish=False, pick=2, sid=2)),
        ("evict", dict(comp=Component.MAMBA, n=2)),
        ("evict", dict(comp=Component.FULL, n=4)),
        ("finish", dict(pick=0)),
        ("admit", dict(batch=True, budget=2, edge=None, pick=5)),
        ("extend_far_ahead", dict(ahead=10, n=7, pick=5)),
    ]
    for rule, args in program:
        getattr(state, rule)(**args)
        state.inv_all_laws()
    state.teardown()


@pytest.mark.parametrize("model", ["full", "mamba"])
def test_a_scheduler_that_never_decodes_breaks_a_running_request_moves(model: str) -> None:
    """An engine that admits requests and then never runs a decode batch (planted in ``get_next_batch_to_run``):
    the system machine's first extend or finish of a running request reads ``a running request moves``, where the
    adapter once gave up silently and left the read to ``extend commits`` (and to nothing on a finish)."""
    from hypothesis import Phase, settings

    from kvledger.contracts.adapters.sglang.scheduler import scheduler_factory
    from kvledger.contracts.machines.profiles import register_profiles
    from kvledger.contracts.machines.runner import run_machine
    from kvledger.contracts.machines.system import RULES, machine_for_system

    def planted() -> SystemAdapter:
        a: Any = scheduler_factory(MAMBA if model == "mamba" else SystemConfig())
        real = a.sched.get_next_batch_to_run

        def no_decode(*args: Any, **kwargs: Any) -> Any:
            batch = real(*args, **kwargs)
            return None if batch is not None and not batch.forward_mode.is_extend() else batch

        a.sched.get_next_batch_to_run = no_decode
        return a  # type: ignore[no-any-return]

    register_profiles()
    quick = settings(settings.get_profile("ci"), max_examples=10, stateful_step_count=20, phases=[Phase.generate])
    result = run_machine("system", model, machine_for_system(planted), list(RULES), quick, seed=0)
    v = result.violation
    prepare = sys.modules["sglang.srt.managers.schedule_batch"].ScheduleBatch.prepare_for_decode  # NOTE: imported
    if "self.input_ids = self.output_ids.to(" in inspect.getsource(prepare):
        # NOTE: 0.5.12.post1 coerces the last step's output ids as it prepares a decode: the decode the plant dropped
        # had taken them, so the next one fails inside SGLang in the same step, a crash reported with the program
        assert v is not None and v.rule == "implementation crashed: AttributeError", v
        assert "schedule_batch.py" in v.message and any(s.startswith("extend(") for s in v.steps), v
        return
    assert v is not None and v.rule == "a running request moves", v
    assert "of request" in v.message and "still running" in v.message, v.message
