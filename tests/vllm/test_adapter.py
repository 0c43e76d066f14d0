"""vLLM's real KV cache manager, checked by the shared-block laws (tests/vllm runs inside a vLLM venv).

Each test runs against the installed release. What a release breaks is
recorded in :data:`FINDINGS` (docs/vllm.md has the counterexamples): on an
affected release the law must break, and on every other tested release it
must hold, so a test fails both when a finding disappears and when a new
break appears.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvledger.contracts.adapters.vllm.cpu_import import TESTED, installed_version_or_none, unavailable_reason
from kvledger.contracts.machines.block_machine import SharedLawBroken, machine_for_shared
from kvledger.contracts.machines.shared_laws import check_refused, check_shared_laws, check_transition
from kvledger.spec.errors import InvalidArgument

HAVE = installed_version_or_none()
pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


def _v(version: str) -> tuple[int, ...]:
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in version.split("."))


FINDINGS: dict[tuple[str, str], tuple[str, str]] = {
    ("full", "admission is a transaction"): ("0.6.6.post1", "0.7.0"),
    ("hybrid", "sentinel_count_fixed"): ("0.9.2", "0.33.0"),  # NOTE: every hybrid release before 0.33.0; docs/vllm.md
    # NOTE: finding 2 on the Mamba group too, where the adapter builds one before 0.33.0 (0.18.1 and 0.25.1 measured)
    ("mamba", "sentinel_count_fixed"): ("0.9.2", "0.33.0"),
    ("mamba", "inv_refcount_nonnegative"): ("0.9.2", "0.33.0"),
}
"""``(model, law) -> (first release seen breaking it, first release that passes)``, from docs/vllm.md."""


def affected(model: str, law: str) -> bool:
    """The installed release is recorded as breaking ``law`` for ``model``."""
    span = FINDINGS.get((model, law))
    return HAVE is not None and span is not None and _v(span[0]) <= _v(HAVE) < _v(span[1])


def _adapter(model: str):  # type: ignore[no-untyped-def]
    from kvledger.contracts.adapters.vllm.adapter import vllm_factory, vllm_hybrid_factory, vllm_mamba_factory

    return {"hybrid": vllm_hybrid_factory, "mamba": vllm_mamba_factory}.get(model, vllm_factory)()


def _mamba_ok() -> bool:
    """The installed release caches Mamba states by prefix (a ``MambaSpec`` with ``mamba_cache_mode``; the laws hold
    from 0.33.0)."""
    if unavailable_reason() is not None:
        return False
    from kvledger.contracts.adapters.protocol import Unsupported

    try:
        _adapter("mamba")
    except Unsupported:
        return False
    return True


def _hybrid_ok() -> bool:
    """The installed release has a hybrid (full + sliding window) manager: the coordinators, 0.9 on."""
    if unavailable_reason() is not None:
        return False
    from kvledger.contracts.adapters.vllm.adapter import VLLMAdapter

    try:
        VLLMAdapter(window=8)
    except ValueError:
        return False
    return True


def _laws(a, before=None):  # type: ignore[no-untyped-def]
    snap = a.shared_snapshot()
    out = check_shared_laws(snap) + (check_transition(before, snap) if before is not None else [])
    for rid, b, af in a.take_refused():
        out += check_refused(rid, b, af)
    return {law for law, _ in out}, snap


def test_a_fresh_manager_satisfies_every_law() -> None:
    a = _adapter("full")
    broken, snap = _laws(a)
    assert broken == set()
    pool = snap.pools["kv"]
    assert not pool.holders and len(pool.queue) == pool.capacity - len(pool.sentinels)
    assert a.version == HAVE and a.engine_class.endswith("KVCacheManager")


def test_a_refused_admission_that_hit_the_cache() -> None:
    """A request whose prefix is cached (evictable) but whose tail does not fit is refused, changing nothing."""
    a = _adapter("full")
    first = a.add_request((1, 2, 3, 4, 5, 6, 7, 8, 9))
    assert a.admit(64).admitted == (first,)
    a.finish(first)  # its two full blocks stay cached, evictable on the queue
    filler = a.add_request((3,) * 20)
    assert a.admit(64).admitted == (filler,)
    assert _laws(a)[0] == set()
    late = a.add_request((1, 2, 3, 4, 5, 6, 7, 8) + (2,) * 18)
    assert a.admit(64).rejected == (late,)
    broken, _ = _laws(a)
    if affected("full", "admission is a transaction"):
        assert {"admission is a transaction", "inv_refcount_counts_holders"} <= broken
    else:
        assert broken == set()


def test_a_prompt_longer_than_the_model_is_a_typed_error() -> None:
    a = _adapter("full")
    with pytest.raises(InvalidArgument, match=r"add_request .* max_model_len"):
        a.add_request((1,) * a.max_model_len)
    assert a.requests == {} and _laws(a)[0] == set()


def test_sharing_counts_every_holder_and_free_returns_blocks_to_the_queue() -> None:
    a = _adapter("full")
    r1 = a.add_request((1, 2, 3, 4, 5, 6, 7, 8, 9))
    r2 = a.add_request((1, 2, 3, 4, 5, 6, 7, 8, 5))
    assert a.admit(64).admitted == (r1, r2)
    broken, snap = _laws(a)
    assert broken == set()
    shared = [b for b, h in snap.pools["kv"].holders.items() if len(h) == 2]
    assert len(shared) == 2  # the two full prompt blocks
    a.extend(r1, 3)
    a.finish(r1)
    a.abort(r2)
    broken, snap = _laws(a)
    assert broken == set()
    assert not snap.pools["kv"].holders
    assert set(snap.pools["kv"].queue) == set(range(snap.pools["kv"].capacity)) - snap.pools["kv"].sentinels


def _reuse_the_cached_blocks(evict_drops_the_hash: bool) -> list[set[str]]:
    """A finished request leaves two cached blocks at the free queue's tail; two-token requests (one part-filled
    block each, never cached) then take every free block, the cached ones last, and the newest decodes on into the
    blocks it holds ahead (0.6.6.post1 hands a request more blocks than its prompt fills). The laws broken after
    each step."""
    a = _adapter("full")
    if not evict_drops_the_hash:  # NOTE: a planted bug, on the instance: reusing a cached block keeps its hash
        name = next(n for n in ("_maybe_evict_cached_block", "_evict_cached_block") if hasattr(a.pool, n))
        setattr(a.pool, name, lambda block: False)
    r = a.add_request((1, 2, 3, 4, 5, 6, 7, 8, 9))
    a.admit(64)
    a.finish(r)
    seen = [_laws(a)[0]]
    free = len(a.shared_snapshot().pools["kv"].queue)
    for _ in range(free):
        a.add_request((5, 4))
        a.admit(64)
        seen.append(_laws(a)[0])
    newest = a.running[-1]
    for _ in range(16):
        if a.status[newest] != "running" or a.requests[newest].num_tokens + 1 >= a.max_model_len:
            break
        try:
            a.extend(newest, 1)
        except AssertionError:  # NOTE: vLLM's own assert on caching a block that has a hash already
            seen.append({"the engine's assert"})
            break
        seen.append(_laws(a)[0])
    return seen


def test_a_reused_block_that_keeps_its_old_key_breaks_keys_match_content() -> None:
    """The key a block carries must name what its writer put in it, a block it filled only in part too."""
    control = _reuse_the_cached_blocks(evict_drops_the_hash=True)
    assert control == [set()] * len(control)
    broken = _reuse_the_cached_blocks(evict_drops_the_hash=False)
    first = next(b for b in broken if b)
    assert "inv_keys_match_content" in first, broken  # NOTE: before the engine's own assert, where it has one


def _mamba_shared(a) -> list[int]:  # type: ignore[no-untyped-def]
    """The blocks exactly two Mamba holders share, after checking that every law holds."""
    from kvledger.spec.types import Component

    broken, snap = _laws(a)
    assert broken == set()
    pool = snap.pools["kv"]
    mamba2 = [Component.MAMBA] * 2
    return [b for b, h in pool.holders.items() if b not in pool.sentinels and [o.component for o in h] == mamba2]


def test_a_mamba_state_cached_at_a_block_end_is_shared_from_the_next_step() -> None:
    """Full attention plus Mamba (``align``): an 8-token prompt's prefill leaves the state at its block end cached.
    A request on that prefix in the same scheduler step may not use it (vLLM's ``cached_blocks_this_step``: refused,
    and the refusal changes nothing); in the next step it shares it (one block, two Mamba holders, count 2). The
    adapter starts one step per ``admit`` call, not per request, and one per decode step (``new_step_starts``)."""
    from kvledger.contracts.adapters.protocol import Unsupported

    if not _mamba_ok():
        with pytest.raises(Unsupported, match="caches no Mamba state"):
            _adapter("mamba")
        return
    if affected("mamba", "inv_refcount_nonnegative"):
        pytest.skip(
            f"vLLM {HAVE} moves the null block's count on the Mamba group too (finding 2, fixed in 0.33.0): "
            "test_the_machine_finds_no_unrecorded_break[mamba] pins it"
        )
    prefix = (1, 2, 3, 4, 5, 6, 7, 8)
    a = _adapter("mamba")
    r1, r2 = a.add_request(prefix), a.add_request((*prefix, 7))
    same = a.admit(64)
    assert (same.admitted, same.rejected) == ((r1,), (r2,))  # NOTE: a state cached this step is not shared in it
    assert _mamba_shared(a) == []
    nxt = a.admit(64)
    assert nxt.admitted == (r2,) and a.prefix[r2] == 8
    (block,) = _mamba_shared(a)
    assert a.shared_snapshot().pools["kv"].counts[block] == 2

    b = _adapter("mamba")  # NOTE: a finished request's state, hit at the next admission with no decode between
    r = b.add_request(prefix)
    b.admit(64)
    b.finish(r)
    again = b.add_request((*prefix, 9, 9))
    assert b.admit(64).admitted == (again,) and b.prefix[again] == 8
    assert _mamba_shared(b) == []  # NOTE: its first holder finished: one holder now


def test_preemption_returns_everything_and_readmission_hits_the_cache() -> None:
    a = _adapter("full")
    r = a.add_request((1, 2, 3, 4, 5, 6, 7, 8, 9))
    a.admit(64)
    a.retract(r)
    broken, snap = _laws(a)
    assert broken == set() and not snap.pools["kv"].holders
    assert a.admit(64).admitted == (r,)
    assert a.prefix[r] == 8  # both full blocks found again by their hash chain
    assert _laws(a)[0] == set()


def test_a_decode_step_that_does_not_fit_preempts_the_newest_running_request() -> None:
    """As vLLM's FCFS scheduler does: the last admitted running request is preempted and the step retried."""
    a = _adapter("full")
    for base in (10, 30, 50, 70):
        a.add_request(tuple(range(base, base + 10)))
    a.admit(64)
    assert len(a.running) >= 2
    got = None
    for _ in range(a.max_model_len):  # decode steps of every running request, until one does not fit
        for rid in list(a.running):
            newest, kv = a.running[-1], a.requests[rid].num_computed_tokens
            got = a.extend(rid, 1)
            if got.retracted:
                break
            assert a.requests[rid].num_computed_tokens == kv + 1
        if got is not None and got.retracted:
            break
    assert got is not None and got.retracted and got.retracted[0] == newest, "four growing requests outgrow 12 blocks"
    assert a.status[newest] == "waiting" and a.waiting[0] == got.retracted[-1]
    if rid not in got.retracted:
        assert a.status[rid] == "running" and a.requests[rid].num_computed_tokens == kv + 1
    assert _laws(a)[0] == set()


def test_a_decode_step_of_the_newest_request_that_does_not_fit_preempts_itself() -> None:
    """The newest running request is vLLM's first victim: when its own step does not fit, it is preempted itself
    (back to the front of the queue, nothing computed) and the older requests run on untouched."""
    a = _adapter("full")
    for base in (10, 30, 50):
        a.add_request(tuple(range(base, base + 10)))
    if len(a.admit(64).admitted) < 3:  # NOTE: 0.6.6.post1 and 0.7.x keep a watermark of free blocks: two run
        pytest.skip("the release admits two of the three requests (the newest then finishes before the pool fills)")
    newest, older = a.running[-1], a.running[:-1]
    held = {r: a.requests[r].num_computed_tokens for r in older}
    got = None
    for _ in range(a.max_model_len):
        got = a.extend(newest, 1)
        if got.retracted or got.finished:
            break
    assert got is not None and got.retracted == (newest,), f"three requests outgrow 12 blocks: {got}"
    assert a.status[newest] == "waiting" and a.waiting[0] == newest
    assert a.requests[newest].num_computed_tokens == 0
    assert a.running == older and {r: a.requests[r].num_computed_tokens for r in older} == held
    assert _laws(a)[0] == set()


@pytest.mark.skipif(not _hybrid_ok(), reason="no hybrid (full + sliding window) manager before 0.9")
def test_sliding_window_frees_a_request_holding_the_null_block() -> None:
    a = _adapter("hybrid")
    before = a.shared_snapshot()
    r = a.add_request((1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8))
    a.admit(64)
    a.extend(r, 4)
    mid = a.shared_snapshot()
    null = set(mid.pools["kv"].sentinels)
    assert null and any(b in null for b in mid.pools["kv"].holders)  # the window skipped blocks: null stands in
    a.finish(r)
    broken, _ = _laws(a, mid)
    expected = {"sentinel_count_fixed", "inv_refcount_nonnegative"}
    assert (expected <= broken) if affected("hybrid", "sentinel_count_fixed") else broken == set()
    assert not check_transition(before, mid)


def _speculative() -> bool:
    """The installed release decodes draft tokens (``Request.spec_token_ids``, 0.7 on)."""
    return unavailable_reason() is None and "speculative" in _adapter("full").capabilities


SPEC_FINDINGS: dict[str, tuple[str, str]] = {
    "lookahead past max_model_len": ("0.8.5.post1", "0.9.2"),
}
"""Speculative decoding's findings: ``name -> (first release seen asserting, first release seen passing)``, as
measured (docs/vllm.md); vLLM's PR 17474 (0.9.0) caps the slots a step asks at ``max_model_len``."""


def test_a_speculative_step_keeps_the_accepted_drafts_and_rolls_back_the_rest() -> None:
    if not _speculative():  # NOTE: 0.6.6.post1: no drafts, so `ahead` is not expressed and the step decodes plainly
        a = _adapter("full")
        rid = a.add_request((1, 2, 3, 4, 5))
        a.admit(64)
        a.extend(rid, 2, ahead=2)
        assert a.requests[rid].num_computed_tokens == 5 + 2
        return
    from kvledger.contracts.adapters.vllm.adapter import _vocab_token

    a = _adapter("full")
    calls: list[tuple[int, int, int]] = []
    allocate = a.mgr.allocate_slots

    def watched(req, n, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((n, len(req.spec_token_ids), kwargs.get("num_lookahead_tokens", 0)))
        return allocate(req, n, *args, **kwargs)

    a.mgr.allocate_slots = watched
    rid = a.add_request((1, 2, 3, 4, 5))
    a.admit(64)
    before, tokens = a.requests[rid].num_computed_tokens, list(a.requests[rid].all_token_ids)
    snap0 = a.shared_snapshot()
    a.extend(rid, 9, ahead=3)
    req = a.requests[rid]
    assert req.num_computed_tokens == before + 9 and req.spec_token_ids == []
    # NOTE: the kept drafts are the tokens the model samples there: the sequence is the one plain decoding makes
    assert list(req.all_token_ids) == tokens + [_vocab_token(rid, p) for p in range(len(tokens), len(tokens) + 9)]
    decode = calls[1:]
    assert decode and all(drafts == 3 and n == 1 + drafts for n, drafts, _ in decode), decode
    # NOTE: some steps kept drafts (fewer steps than tokens), and some rejected them (not every step kept all)
    assert len(decode) < 9 and len(decode) > 9 // 4, decode
    if "num_lookahead_tokens" in a._alloc_params:
        assert all(ahead == 3 for _, _, ahead in decode), decode
    broken, _ = _laws(a, snap0)
    assert broken == set(), broken


@pytest.mark.skipif(not _speculative(), reason="no draft tokens before 0.7")
def test_a_step_whose_lookahead_passes_max_model_len() -> None:
    """A request near the end of its context with lookahead slots asked past it: 0.8.x's manager asserts (it clips
    the new blocks at the block table's width and then asserts there is one); from 0.9 the ask is capped."""
    a = _adapter("full")
    rid = a.add_request(tuple(i % 5 + 1 for i in range(a.max_model_len - 8)))
    a.admit(64)
    first, fixed = SPEC_FINDINGS["lookahead past max_model_len"]
    if _v(first) <= _v(HAVE or "0") < _v(fixed):
        with pytest.raises(AssertionError):
            a.extend(rid, 2, ahead=10)
    else:
        a.extend(rid, 2, ahead=10)
        assert a.requests[rid].num_computed_tokens == a.max_model_len - 8 + 2
        broken, _ = _laws(a)
        assert broken == set(), broken


@pytest.mark.slow
@pytest.mark.parametrize("model", ["full", "hybrid", "mamba"])
def test_the_machine_finds_no_unrecorded_break(model: str) -> None:
    """The search may or may not reach a recorded finding (the witnesses above pin those); it must find nothing else."""
    if model == "hybrid" and not _hybrid_ok():
        pytest.skip("no hybrid (full + sliding window) manager before 0.9")
    if model == "mamba" and not _mamba_ok():
        pytest.skip("no Mamba prefix caching (mamba_cache_mode 'align') before 0.33")
    machine = machine_for_shared(lambda: _adapter(model))
    recorded = {law for (m, law) in FINDINGS if m == model and affected(m, law)}
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=25,
                stateful_step_count=20,
                deadline=None,
                derandomize=True,
                # NOTE: no shrinking: the verdict is which laws broke, which the first failing program already shows
                phases=[Phase.explicit, Phase.reuse, Phase.generate],
                database=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    except SharedLawBroken as err:
        found = {law for law, _ in err.violations}
        assert recorded & found, f"vLLM {HAVE} {model}: unrecorded break {err}"


def test_the_installed_release_is_one_of_the_tested() -> None:
    assert HAVE in TESTED


def test_the_abstraction_sees_hand_broken_structures() -> None:
    """Break vLLM's own objects by hand: each law must notice, through the adapter's abstraction function."""
    a = _adapter("full")
    r = a.add_request((1, 2, 3, 4, 5, 6, 7, 8, 9))
    a.admit(64)
    assert _laws(a)[0] == set()
    held = a.requests[r]
    table = next(iter(a._groups()))[1][held.request_id]
    queue = a._queue()
    blocks = a._blocks()
    free_one = next(
        b for b in blocks if b.ref_cnt == 0 and b not in table and b.block_id not in a.pool_state().sentinels
    )

    table[0].next_free_block = free_one  # a held block keeps a link into the queue
    assert "inv_lru_detached" in _laws(a)[0]
    table[0].next_free_block = None

    queue.num_free_blocks += 1  # the counter drifts from the queue
    assert "inv_counters_recount" in _laws(a)[0]
    queue.num_free_blocks -= 1

    table[0].ref_cnt += 1  # a count no holder explains
    assert "inv_refcount_counts_holders" in _laws(a)[0]
    table[0].ref_cnt -= 1

    index, *dups = a._index_maps()
    key = next(k for k in index if not any(k in d for d in dups))  # NOTE: a key one block caches
    entry = index.pop(key)  # a cached block the index forgets
    assert "inv_index_names_carriers" in _laws(a)[0]
    index[key] = entry
    assert _laws(a)[0] == set()


def test_a_key_two_blocks_cache_is_read_whole_and_a_block_it_forgets_is_seen() -> None:
    """Two blocks computed apart with the same content are both cached under one key, in every index shape.

    vLLM caches a block under its hash without looking for one already there, so two blocks can carry one key:
    a ``{block_id: block}`` dict to 0.33, a second dict of ids (``_dup_ids``) from 0.34. The abstraction must
    name both, and an index that forgets one of them while the block still carries the key breaks a law.
    """
    from kvledger.contracts.adapters.vllm.adapter import _vocab_token

    a = _adapter("full")
    first = a.add_request((1, 2, 3, 4, 5, 6, 7, 8))
    assert a.admit(64).admitted == (first,)
    tokens = list(a.requests[first].all_token_ids)
    tokens += [_vocab_token(first, i) for i in range(len(tokens), 12)]  # what ``first`` will generate
    later = a.add_request((*tokens, 7))
    assert a.admit(64).admitted == (later,)
    a.extend(first, 4)  # ``first``'s third block fills with what ``later``'s third block already holds
    broken, snap = _laws(a)
    assert broken == set()
    shared = {k: ids for k, ids in snap.pools["kv"].index.items() if len(ids) == 2}
    assert len(shared) == 1, snap.pools["kv"].index
    maps = a._index_maps()
    key, entry = next((k, m[k]) for m in maps for k in m if isinstance(m[k], dict) and len(m[k]) == 2)
    victim = next(b for b in entry if all(m.get(key) != b for m in maps))  # NOTE: not the one id a 0.34 key keeps
    kept = entry.pop(victim)  # the index forgets a block that still carries the key
    assert "inv_index_names_carriers" in _laws(a)[0]
    entry[victim] = kept
    assert _laws(a)[0] == set()
