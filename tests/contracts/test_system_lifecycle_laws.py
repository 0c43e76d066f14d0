"""The system machine's lifecycle laws fail, naming themselves, on hand-broken memory managers.

Each break is one a mutation of ``impl/`` made (``tests/benchmarks/mutation.py``) that the
default check used to miss: the laws were there for ownership, not for what a request computes.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import Phase, settings

from kvledger.contracts.adapters.reference_system import ReferenceSystemAdapter
from kvledger.contracts.machines.profiles import register_profiles
from kvledger.contracts.machines.runner import CheckResult, run_machine
from kvledger.contracts.machines.suites import SUITES
from kvledger.impl import admission
from kvledger.impl.memory import MemoryManager
from kvledger.spec.errors import InvalidArgument

register_profiles()
FIND = settings(settings.get_profile("ci"), max_examples=300, phases=[Phase.explicit, Phase.generate])


def run(model: str = "full") -> CheckResult:
    return run_machine("system", model, SUITES["system"].models[model](), [], FIND, seed=1)


def run_with(monkeypatch: pytest.MonkeyPatch, caps: frozenset[str]) -> CheckResult:
    """:func:`run` on the full model, with the reference adapter declaring ``caps``."""
    monkeypatch.setattr(ReferenceSystemAdapter, "capabilities", caps)
    return run()


def test_admission_that_forgets_what_it_computed_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = admission._commit

    def commit(mm: MemoryManager, a: Any) -> None:
        real(mm, a)
        if a.req.session is None:
            a.req.kv_len = 0  # BUG: the prompt's KV is written but the request does not count it

    monkeypatch.setattr(admission, "_commit", commit)
    result = run()
    assert result.violation is not None and result.violation.rule == "admission commits", result.violation


def test_admission_past_its_budget_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = admission._try_admit
    monkeypatch.setattr(admission, "_try_admit", lambda mm, req, budget: real(mm, req, admission.Budget(10**6, 10**6)))
    result = run()  # BUG: the budget is never checked
    assert result.violation is not None and result.violation.rule == "admission within budget", result.violation


def test_extend_that_drops_a_token_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = MemoryManager.extend

    def extend(self: MemoryManager, req: Any, new_tokens: tuple[int, ...], ahead: int = 0) -> None:
        real(self, req, new_tokens[:-1] if len(new_tokens) > 1 else new_tokens, ahead)  # BUG: one token short

    monkeypatch.setattr(MemoryManager, "extend", extend)
    result = run()
    assert result.violation is not None and result.violation.rule == "extend commits", result.violation


def test_admission_that_holds_back_room_it_has_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = admission._try_admit

    def try_admit(mm: MemoryManager, req: Any, budget: admission.Budget) -> bool:
        # BUG: one token of the budget is kept in reserve (a request fitting it exactly is refused)
        return real(mm, req, admission.Budget(budget.tokens - 1, budget.requests))

    monkeypatch.setattr(admission, "_try_admit", try_admit)
    for model in ("full", "paged", "mamba"):
        state = SUITES["system"].models[model]()()
        state.add_request(prompt=0, suffix=[], sid=None, budget=64)  # fits with room to spare: admitted
        state.inv_all_laws()
        with pytest.raises(AssertionError, match="admission admits what fits"):
            state.add_request(prompt=2, suffix=[], sid=None, budget=2)  # two new tokens, a budget of two


def test_a_refusal_for_a_short_budget_or_an_injected_failure_is_not_flagged() -> None:
    for model in ("full", "paged", "mamba"):
        state = SUITES["system"].models[model]()()
        state.add_request(prompt=0, suffix=[1, 2], sid=None, budget=5)  # six tokens over a budget of five
        state.inv_all_laws()
        state.inject_allocation_failure()
        state.add_request(prompt=2, suffix=[], sid=None, budget=64)  # refused by the injected failure
        state.inv_all_laws()
        state.admit(pick=0, budget=64)  # the failure is spent: admitted
        state.inv_all_laws()
        assert state.unspent == 0
        state.teardown()


def test_work_conservation_holds_on_the_reference_under_swarm() -> None:
    """The law is true of the reference in every state the search reaches (a longer run than the default)."""
    for model in ("full", "paged", "mamba"):
        result = run(model)
        assert result.ok, result.violation and result.violation.message


def _budget_one_short(b: Any, **kw: Any) -> Any:
    """``dataclasses.replace`` as admission uses it to shrink a batch's budget, taking one token too many."""
    import dataclasses

    return dataclasses.replace(b, **{**kw, "tokens": kw["tokens"] - 1})


def _two_waiting(m: Any) -> None:
    m.swarm(frozenset())
    for _ in range(2):
        m.add_request(prompt=2, suffix=[], sid=None, budget=1)  # 2 tokens over a budget of 1: both wait
        m.inv_all_laws()
    assert sorted(r.status for r in m.last.requests.values()) == ["waiting", "waiting"]


def test_a_batch_whose_budget_shrinks_too_fast_is_caught_by_work_conservation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch of two under a budget of exactly their four tokens: the reference admits both; a budget that shrinks
    by one token more per admitted request refuses the second, which fit what was left."""
    m = SUITES["system"].models["full"]()()
    _two_waiting(m)
    m.admit(pick=1, budget=64, batch=True, edge=0)
    m.inv_all_laws()
    assert sorted(r.status for r in m.last.requests.values()) == ["running", "running"]

    m = SUITES["system"].models["full"]()()
    _two_waiting(m)
    monkeypatch.setattr(admission, "replace", _budget_one_short)
    with pytest.raises(AssertionError, match=r"admission admits what fits: request 2 .* tried in the order"):
        m.admit(pick=1, budget=64, batch=True, edge=0)


def test_work_conservation_is_judged_per_step_order() -> None:
    """``StepResult.tried`` is the order the reference tried its batch (the law walks it)."""
    m = SUITES["system"].models["full"]()()
    _two_waiting(m)
    result = m.sys.admit(3)  # 3 tokens: the first fits, the second no longer does
    assert result.tried == (1, 2) and result.admitted == (1,) and result.rejected == (2,)


def test_a_rollback_that_keeps_the_match_length_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """``inv_waiting_blank``: a refused attempt rolls its match back; one that leaves ``prefix_len`` set leaves a
    waiting request claiming a prefix it does not hold."""
    real = admission.rollback

    def rollback(mm: MemoryManager, a: Any) -> None:
        kept = a.req.prefix_len
        real(mm, a)
        a.req.prefix_len = kept  # BUG: the match length survives the rollback

    m = SUITES["system"].models["full"]()()
    m.swarm(frozenset())
    m.add_request(prompt=0, suffix=[], sid=None, budget=64)
    m.inv_all_laws()
    m.finish(pick=0)  # (1, 2, 3, 4) is cached now
    m.inv_all_laws()
    m.add_request(prompt=0, suffix=[3, 3, 3], sid=None, budget=1)  # matches the cached prefix, refused by the budget
    m.inv_all_laws()
    monkeypatch.setattr(admission, "rollback", rollback)
    m.add_request(prompt=0, suffix=[3, 3, 3], sid=None, budget=1)
    with pytest.raises(AssertionError, match="inv_waiting_blank: waiting request"):
        m.inv_all_laws()


def test_a_close_that_keeps_the_sessions_memory_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvledger.impl.session import Sessions

    real = Sessions.close

    def close(self: Sessions, sid: int) -> None:
        if self.slots[sid].row is None:
            real(self, sid)  # BUG: a session holding memory is never released (its close deferred forever)

    monkeypatch.setattr(Sessions, "close", close)
    result = run("paged")
    assert result.violation is not None and result.violation.rule == "inv_released_on_close", result.violation
    assert "was closed with no turn running and still holds" in result.violation.message


@pytest.mark.parametrize("how", ["no guard", "guard negated"])
def test_a_close_that_frees_a_running_turns_memory_is_caught(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """A close of a session whose turn runs on its memory, accepted at once: the session is gone (and what it held
    freed) under a running turn. The system machine makes that close (it used to skip it) and holds it to
    ``inv_close_spares_the_turn``, and the turn's end to its laws. "guard negated" is issue 19's seeds 9 and 19
    survivor (the in-use test negated: a session lent to a turn that waits is refused, one lent to a running turn
    released)."""
    from kvledger.impl.requests import Status
    from kvledger.impl.session import Sessions

    real = Sessions.close

    def close(self: Sessions, sid: int) -> None:
        slot = self.slots.get(sid)
        if slot is not None and slot.lent_to is not None:
            running = self.mm.requests[slot.lent_to].status is Status.RUNNING
            if how == "guard negated" and not running:
                raise InvalidArgument("close_session", "session", (), f"session {sid} is in use")
            slot.lent_to = None  # BUG: the running turn is not looked at
        real(self, sid)

    monkeypatch.setattr(Sessions, "close", close)
    result = run()
    assert result.violation is not None, "a close of a session in use that is accepted was not caught"
    # NOTE: the law the state breaks first: the close's own (memory the turn held freed), or the turn's end (its
    # session gone: a save refused); the program closes the session while its turn runs
    assert "close_session" in result.violation.program, result.violation
    assert result.violation.rule in (
        "inv_close_spares_the_turn",
        "implementation refused a valid step: InvalidArgument",
    )


def test_a_deferred_close_that_frees_the_turns_slots_breaks_its_law(monkeypatch: pytest.MonkeyPatch) -> None:
    """A close of a session in use, deferred (accepted, the session kept until its turn ends), that frees the KV
    slots the running turn holds at once: ``inv_close_spares_the_turn`` names it at the close."""
    from kvledger.impl.requests import Status
    from kvledger.impl.session import Sessions

    real = Sessions.close

    def close(self: Sessions, sid: int) -> None:
        slot = self.slots.get(sid)
        turn = self.mm.requests[slot.lent_to] if slot is not None and slot.lent_to is not None else None
        if turn is None or turn.status is not Status.RUNNING or turn.row is None:
            real(self, sid)
            return
        held = self.mm.rows.table[turn.row, : turn.alloc_len]
        if held.numel():
            self.mm.kv.free(held.clone(), turn.owner)  # BUG: deferred, but the turn's slots are freed now

    monkeypatch.setattr(Sessions, "close", close)
    result = run()
    assert result.violation is not None and result.violation.rule == "inv_close_spares_the_turn", result.violation
    assert "left the session and the turn" in result.violation.message


def test_an_admission_that_locks_its_match_and_recomputes_it_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The match is locked but not used: the request computes its whole prompt anew (its cached prefix is held
    from eviction for nothing). Memory stays consistent; the lock no longer covers the prefix the request runs on."""
    real = admission._acquire

    def acquire(mm: MemoryManager, a: Any) -> None:
        real(mm, a)
        if a.req.session is None:
            a.req.prefix_len = a.req.own_from = 0  # BUG: the matched prefix is not the request's

    monkeypatch.setattr(admission, "_acquire", acquire)
    result = run()  # NOTE: recomputing what the cache held breaks ``admission reuses the cache`` first
    assert result.violation is not None and result.violation.rule == "admission reuses the cache", result.violation
    caps = ReferenceSystemAdapter.capabilities - {"prefix_cache"}  # an engine that does not show its cache
    monkeypatch.setattr(ReferenceSystemAdapter, "capabilities", caps)
    result = run()
    assert result.violation is not None and result.violation.rule == "inv_lock_covers_prefix", result.violation


def test_an_admission_that_runs_on_its_match_without_locking_it_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The match is used but never locked: the request holds no live handle at all, so eviction may take the KV it
    runs on. No lock covers nothing, which is not the prefix it runs on (mutation seed 23 found the law skipped a
    request without a handle)."""
    real = admission._acquire

    def acquire(mm: MemoryManager, a: Any) -> None:
        real(mm, a)
        if a.req.session is None and a.req.handle is not None:
            mm.cache.dec_lock_ref(a.req.handle)
            a.req.handle = None  # BUG: the matched prefix runs unlocked

    monkeypatch.setattr(admission, "_acquire", acquire)
    result = run()
    assert result.violation is not None and result.violation.rule == "inv_lock_covers_prefix", result.violation
    assert "holds no live lock" in result.violation.message


def test_an_admission_that_locks_its_matchs_parent_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock on the wrong node: admission locks the matched node's parent, so the request reads the matched node's
    KV with no lock on it (eviction may take it). The lock counts and handles agree. Where the engine shows what
    its rows borrow (``rows``), ``inv_borrowed_under_lock`` names it; an engine that reports its prefix
    (``prefix_locked``) breaks ``inv_lock_covers_prefix`` first; with neither, only what eviction later does to
    the unlocked KV is met (the reference's own check refuses an insert over a reused slot), programs later."""
    real = admission._acquire

    def acquire(mm: MemoryManager, a: Any) -> None:
        real(mm, a)
        h = a.req.handle
        node = mm.cache._nodes.get(h.node_id) if h is not None and a.req.session is None else None
        if node is not None and node.parent is not None and node.parent is not mm.cache.root:
            mm.cache.dec_lock_ref(h)
            a.req.handle = mm.cache.inc_lock_ref(node.parent)  # BUG: the lock goes one node up

    monkeypatch.setattr(admission, "_acquire", acquire)
    caps = ReferenceSystemAdapter.capabilities
    rows = run_with(monkeypatch, caps - {"prefix_locked"}).violation
    assert rows is not None and rows.rule == "inv_borrowed_under_lock", rows
    assert "from the cache, but its lock" in rows.message
    prefix = run_with(monkeypatch, caps).violation
    assert prefix is not None and prefix.rule == "inv_lock_covers_prefix", prefix
    neither = run_with(monkeypatch, caps - {"prefix_locked", "rows"})
    v = neither.violation
    assert v is None or (v.rule not in (rows.rule, prefix.rule) and len(v.steps) > len(rows.steps)), v


def test_a_chunk_that_moves_the_lock_without_the_prefix_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunked prefill caches the computed prefix and locks it, but the request keeps its old prefix length."""
    real = MemoryManager.chunk

    def chunk(self: MemoryManager, req: Any) -> None:
        before = (req.prefix_len, req.own_from)
        real(self, req)
        req.prefix_len = before[0]  # BUG: the lock moved to the chunk, the prefix length did not

    monkeypatch.setattr(MemoryManager, "chunk", chunk)
    result = run()  # NOTE: a request that does not run on what its chunk cached breaks ``chunk caches its prefix``
    assert result.violation is not None and result.violation.rule == "chunk caches its prefix", result.violation
    caps = ReferenceSystemAdapter.capabilities - {"caches_on_chunk"}  # an engine whose chunk reports differently
    monkeypatch.setattr(ReferenceSystemAdapter, "capabilities", caps)
    result = run()
    assert result.violation is not None and result.violation.rule == "inv_lock_covers_prefix", result.violation


def test_an_admission_that_gives_no_mamba_state_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request admitted without the Mamba state it runs on (the allocation skipped): memory stays consistent, but
    the request has no recurrent state."""
    real = admission._acquire

    def acquire(mm: MemoryManager, a: Any) -> None:
        real(mm, a)
        if a.req.session is None and a.mamba is not None and mm.mamba is not None:
            mm.free_mamba(a.req.owner, a.mamba)  # BUG: no state for the request
            a.mamba = a.req.mamba = None

    monkeypatch.setattr(admission, "_acquire", acquire)
    result = run("mamba")
    assert result.violation is not None and result.violation.rule == "admission commits", result.violation


@pytest.mark.parametrize(("model", "pool"), [("full", "kv"), ("mamba", "mamba")])
def test_an_injected_failure_that_never_fires_is_caught(monkeypatch: pytest.MonkeyPatch, model: str, pool: str) -> None:
    """Issue 19, new family, seed 9: an allocation that counts an injected failure off but does not fail (its
    raise dropped). The machine excuses what an injected failure may refuse, so without a law of its own every
    failure path went unchecked: a step begun with a failure pending that refused nothing must not hand a request
    free KV."""
    name = "alloc_kv" if pool == "kv" else "alloc_mamba"
    real = getattr(MemoryManager, name)

    def spends_silently(self: MemoryManager, *args: Any) -> Any:
        if self.fail_next > 0:
            self.fail_next -= 1  # BUG: counted off, never raised
        return real(self, *args)

    assert run(model).violation is None
    monkeypatch.setattr(MemoryManager, name, spends_silently)
    result = run(model)
    assert result.violation is not None, result
    assert result.violation.rule == "an injected failure fails the next allocation", result.violation


def test_a_session_left_lent_to_an_ended_turn_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 9: an abort (or retract) of a session's turn that skips giving the session's
    memory back (its test for an open session negated): the session stays lent to a request that has ended, so it
    is never resumed again, and, lent, it is exempt from the committed-length law. A session is lent only to a
    live turn of it (``spec.session.inv_lent_to_a_live_turn``)."""
    real = MemoryManager._release_all

    def keeps_the_loan(self: MemoryManager, req: Any) -> None:
        slot = self.sessions.slots.get(req.session) if req.session is not None else None
        kept = None if slot is None else (slot.lent_to, slot.tokens, slot.committed_len)
        real(self, req)
        if slot is not None and kept is not None:
            slot.lent_to, slot.tokens, slot.committed_len = kept  # BUG: the turn's loan never given back

    monkeypatch.setattr(MemoryManager, "_release_all", keeps_the_loan)
    result = run()
    assert result.violation is not None and result.violation.rule == "inv_lent_to_a_live_turn", result.violation


def test_a_finish_that_drops_the_mamba_state_of_the_prefix_it_caches_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 3 (``aligned == req.kv_len`` negated in ``finish``): on a Mamba model of page 1
    every finish then caches the KV without its state and frees the state. Nothing is leaked or misowned, so only
    ``inv_end_caches`` (the state goes into the tree with the prefix it summarises) sees it."""
    real = MemoryManager._cache_into_tree

    def cache_into_tree(self: MemoryManager, req: Any, state: Any) -> Any:
        return real(self, req, None)  # BUG: the prefix is cached without the state the request ended with

    monkeypatch.setattr(MemoryManager, "_cache_into_tree", cache_into_tree)
    result = run("mamba")
    assert result.violation is not None and result.violation.rule == "inv_end_caches", result.violation
    assert "a Mamba state" in result.violation.message, result.violation


def test_a_finish_that_drops_a_one_token_requests_state_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, new family, seed 2 (``finish``'s ``aligned > 0`` made ``aligned > 1``): a Mamba request that ends
    with one token computed leaves its state uncached. The machine's prompts hold a one-token head (a request of
    one token), and ``inv_end_caches`` reads the KV content: the state must sit at the node that holds the
    request's last position, not anywhere in the tree."""
    real = MemoryManager._cache_into_tree

    def cache_into_tree(self: MemoryManager, req: Any, state: Any) -> Any:
        return real(self, req, None if req.kv_len == 1 else state)  # BUG: a one-token prefix cached stateless

    monkeypatch.setattr(MemoryManager, "_cache_into_tree", cache_into_tree)
    result = run("mamba")
    assert result.violation is not None and result.violation.rule == "inv_end_caches", result.violation
    assert "finished with 1 tokens computed and a Mamba state" in result.violation.message, result.violation


@pytest.mark.parametrize("model", ["full", "paged"])
def test_a_finish_that_caches_nothing_is_caught(monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    """A finish that takes the abort path (everything released, nothing cached) breaks no ownership law: the
    request's slots go back to the free list. Only ``inv_end_caches`` sees the prefix missing from the tree."""
    from kvledger.impl.requests import Status

    real = MemoryManager.finish

    def finish(self: MemoryManager, req: Any) -> None:
        if req.session is not None:
            return real(self, req)
        self.abort(req)  # BUG: an ended request's prefix is dropped, not cached
        req.status = Status.FINISHED
        return None

    monkeypatch.setattr(MemoryManager, "finish", finish)
    result = run(model)
    assert result.violation is not None and result.violation.rule == "inv_end_caches", result.violation


@pytest.mark.parametrize("model", ["full", "paged", "mamba"])
def test_admission_that_matches_less_than_the_cache_holds_is_caught(
    monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """``admission reuses the cache``: a match one token short (fresh seed 31's mutant of ``_acquire``) keeps every
    ownership and lock law, and recomputes KV the cache held."""
    real = admission._acquire

    def acquire(mm: MemoryManager, a: Any) -> None:
        req, tokens = a.req, a.req.tokens
        if req.session is None and len(tokens) > 1:
            req.tokens = tokens[:-1]  # BUG: the match key leaves out the last two tokens
        try:
            real(mm, a)
        finally:
            req.tokens = tokens

    monkeypatch.setattr(admission, "_acquire", acquire)
    result = run(model)
    assert result.violation is not None and result.violation.rule == "admission reuses the cache", result.violation
    assert "the cache offered it" in result.violation.message


@pytest.mark.parametrize("model", ["full", "paged", "mamba"])
def test_a_resume_that_reuses_less_than_the_session_committed_is_caught(
    monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """``resume reuses the session``: a turn resumed one token short recomputes KV its session holds; every
    ownership law holds (the tail it frees is the session's to free)."""
    from kvledger.impl import session

    real = session.common_prefix
    monkeypatch.setattr(session, "common_prefix", lambda a, b: max(0, real(a, b) - 1))  # BUG: one token short
    result = run(model)
    assert result.violation is not None and result.violation.rule == "resume reuses the session", result.violation
    assert "of them its own but the last repeat" in result.violation.message


@pytest.mark.parametrize("model", ["full", "paged", "mamba"])
def test_a_chunk_that_caches_nothing_is_caught(monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    """``chunk caches its prefix``: a chunk that returns before caching (the mutant negating the test of its early
    return survived the default check beside seed 33's sample) leaves every ownership and lock law intact."""
    real = MemoryManager.chunk

    def chunk(self: MemoryManager, req: Any) -> None:
        if req.session is not None or req.kv_len - req.kv_len % self.cache.page_size <= req.prefix_len:
            real(self, req)  # BUG: a chunk with new whole pages to cache returns at once

    monkeypatch.setattr(MemoryManager, "chunk", chunk)
    result = run(model)
    assert result.violation is not None and result.violation.rule == "chunk caches its prefix", result.violation


@pytest.mark.parametrize("model", ["full", "paged", "mamba"])
def test_an_extend_that_takes_more_than_it_asked_is_caught(monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    """``extend takes what it asked``: speculative decoding that keeps one slot more ahead than it was asked for
    holds KV nobody writes; it is the request's own, referenced by its row, so no ownership law sees it."""
    real = MemoryManager.extend

    def extend(self: MemoryManager, req: Any, new_tokens: tuple[int, ...], ahead: int = 0) -> None:
        real(self, req, new_tokens, ahead + 1 if ahead else 0)  # BUG: one more slot than asked ahead

    monkeypatch.setattr(MemoryManager, "extend", extend)
    result = run(model)
    assert result.violation is not None and result.violation.rule == "extend takes what it asked", result.violation
    assert "more asked ahead (page" in result.violation.message


def _save_one_token_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a save into a session that leaves the turn's last computed token uncommitted."""
    from kvledger.impl.session import Sessions

    real = Sessions.save

    def save(self: Sessions, req: Any) -> None:
        real(self, req)
        slot = self.slots[req.session]
        if slot.committed_len:
            slot.committed_len, slot.tokens = slot.committed_len - 1, slot.tokens[:-1]  # BUG: one token short

    monkeypatch.setattr(Sessions, "save", save)


@pytest.mark.parametrize("model", ["full", "paged", "mamba"])
def test_a_save_that_commits_less_than_the_turn_computed_is_caught(monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    """``a turn commits what it computed``: a save that leaves the last computed token uncommitted keeps the slots
    with the session (its row names them) and the next turn resumes on what was committed: only this law sees it."""
    _save_one_token_short(monkeypatch)
    result = run(model)
    assert result.violation is not None and result.violation.rule == "a turn commits what it computed", result.violation


@pytest.mark.parametrize("model", ["full", "mamba"])
def test_without_finish_in_place_a_save_short_of_the_computed_is_still_caught(
    monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """An engine whose finish computes more first (no ``finish_in_place``) is held to the weaker reading
    (``inv_turn_saved_past``): the committed tokens begin with what the turn had computed. The reference computes
    nothing more, so the save one token short above is still caught, and the message says which reading."""
    from kvledger.contracts.machines.suites import SYSTEM_CONFIGS
    from kvledger.contracts.machines.system import machine_for_system

    class NotInPlace(ReferenceSystemAdapter):
        capabilities = ReferenceSystemAdapter.capabilities - {"finish_in_place"}

    _save_one_token_short(monkeypatch)
    machine = machine_for_system(lambda: NotInPlace(SYSTEM_CONFIGS[model]))
    result = run_machine("system", model, machine, [], FIND, seed=1)
    v = result.violation
    assert v is not None and v.rule == "a turn commits what it computed", v
    assert "(and what its finish computed after them, at most" in v.message, v.message


@pytest.mark.parametrize("model", ["full", "paged"])
def test_an_alloc_that_evicts_more_than_it_is_short_is_caught(monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    """``alloc evicts no more than it is short``: making room for twice the shortfall frees cached prefixes for
    nothing (a lower hit rate); every slot evicted goes back to the free list, so no ownership law sees it."""
    real = MemoryManager._make_room

    def make_room(self: MemoryManager, comp: Any, short: int, what: str) -> None:
        if short > 0:
            short = min(self.cache.evictable_size(comp), 2 * short)  # BUG: twice what it is short
        real(self, comp, short, what)

    monkeypatch.setattr(MemoryManager, "_make_room", make_room)
    result = run(model)
    assert result.violation is not None and result.violation.rule == "alloc evicts no more than it is short", (
        result.violation
    )
