"""Admission as a transaction (bug B2).

Admitting a waiting request matches it against the cache (which may lock
nodes and allocate a Mamba slot by copy-on-write), then either commits — the
request is added to the batch and keeps what it acquired — or rolls back — the
request goes back to the waiting queue holding exactly what it held before the
attempt, with no lock handle left behind. The laws are stated over ledgers
and live handles, so they hold for any implementation of the adder:

* ``inv_rollback_restores`` — after a rejected attempt, the request holds in
  every pool exactly what it held before, and the live handles it owns are the
  ones it owned before;
* ``inv_commit_keeps`` — after an admitted attempt, the request still holds
  everything it held before (nothing of an admitted request was freed behind
  its back: a later free of it would be a use-after-free);
* ``refusal_has_reason`` — work conservation: an attempt is refused only for a
  reason, its tokens over the budget or a pool short of free slots for it; a
  request whose whole prompt fits and finds room in every pool is admitted;
  ``inv_batch_work_conserving`` states it over a whole step, in the order the
  policy tried its requests (what earlier admissions took is not left);
* ``inv_reuses_cache`` — an admission reuses the cache: a request admitted
  outside a session runs on the longest prefix of its tokens but the last that
  the match rule (``spec.prefix.matches``, ``match_length``) allows, no shorter than the cache
  kept through the step offers and no longer than it held before it.

>>> from kvledger.spec.ledger import new_ledger, allocate
>>> from kvledger.spec.types import request
>>> m = new_ledger("mamba", 2)
>>> a = begin(request(7), {"mamba": m}, frozenset())
>>> grabbed = allocate(m, request(7), frozenset({0}))  # copy-on-write during matching
>>> inv_rollback_restores(a, {"mamba": grabbed}, frozenset())
False
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvledger.spec.ledger import Ledger, Slots, held_by
from kvledger.spec.prefix import PrefixCache, match_length
from kvledger.spec.types import HandleId, Owner


@dataclass(frozen=True)
class Budget:
    """What one prefill batch may still take (SGLang's ``PrefillAdder`` budgets)."""

    tokens: int
    requests: int


@dataclass(frozen=True)
class Attempt:
    """The state of one request when an admission attempt began."""

    req: Owner
    before: Mapping[str, Slots]  # pool name -> slots the request held
    handles_before: frozenset[HandleId]


def begin(req: Owner, ledgers: Mapping[str, Ledger], handles: frozenset[HandleId]) -> Attempt:
    """Record what ``req`` holds as an attempt starts (``handles``: the live handles it owns)."""
    return Attempt(req, {name: held_by(led, req) for name, led in ledgers.items()}, handles)


def fits(budget: Budget, new_tokens: int) -> bool:
    """The request's uncached tokens and one request slot fit in what remains of the budget."""
    return budget.requests >= 1 and new_tokens <= budget.tokens


def refusal_has_reason(budget: Budget, tokens: int, free: Mapping[str, int], need: Mapping[str, int]) -> bool:
    """Work conservation: a refused attempt had a reason. ``tokens``: the request's whole prompt (its uncached
    tokens are at most these); ``need``: per pool, the slots it takes when nothing of it is cached (a row, its KV
    pages, a Mamba state and its track buffers); ``free``: per pool, the slots free when the attempt began (the
    cache's evictable slots not counted). Without a reason the attempt must have been admitted.

    >>> refusal_has_reason(Budget(16, 1), 4, {"kv": 48, "req_to_token": 4}, {"kv": 4, "req_to_token": 1})
    False
    >>> refusal_has_reason(Budget(2, 1), 4, {"kv": 48, "req_to_token": 4}, {"kv": 4, "req_to_token": 1})
    True
    """
    return not fits(budget, tokens) or any(free.get(pool, 0) < n for pool, n in need.items())


@dataclass(frozen=True)
class Tried:
    """One request an admission step tried, as :func:`unreasoned_refusals` judges it.

    ``tokens``: its whole prompt; ``new_tokens``: when admitted, the uncached tokens it took from the budget;
    ``need``: per pool, the most slots its admission can take (a row, the KV pages of its whole prompt, a Mamba
    state and its track buffers); ``judged``: whether a refusal of it must have a reason that this law sees
    (a session's turn may wait for its session: not judged).
    """

    rid: int
    admitted: bool
    tokens: int
    new_tokens: int
    need: Mapping[str, int]
    judged: bool = True


def unreasoned_refusals(
    budget: Budget, tried: Sequence[Tried], free: Mapping[str, int], refused_keep: bool = False
) -> tuple[int, ...]:
    """Work conservation over one step, in the order the policy tried its requests: the refusals without a
    reason. Walking ``tried``, the budget left shrinks by each admitted request's new tokens and the room left in
    each pool (``free`` when the step began, evictable slots not counted) by the most it can take, a lower bound
    of what was free when each later request was tried (admissions only allocate or evict); a refused request
    that fit what was left of the budget and found that room (:func:`refusal_has_reason` false) is returned.
    ``refused_keep``: a refused attempt may keep a reservation (it takes room too).

    >>> a = Tried(1, True, 4, 4, {"kv": 4, "req_to_token": 1})
    >>> b = Tried(2, False, 4, 0, {"kv": 4, "req_to_token": 1})
    >>> unreasoned_refusals(Budget(8, 2), [a, b], {"kv": 48, "req_to_token": 4})  # 4 tokens were left: b fit
    (2,)
    >>> unreasoned_refusals(Budget(7, 2), [a, b], {"kv": 48, "req_to_token": 4})  # 3 were left
    ()
    >>> unreasoned_refusals(Budget(8, 2), [a, b], {"kv": 48, "req_to_token": 1})  # a took the last row
    ()
    """
    left, room, out = budget, dict(free), []
    for t in tried:
        if t.admitted:
            left = take(left, t.new_tokens)
        elif t.judged and not refusal_has_reason(left, t.tokens, room, t.need):
            out.append(t.rid)
        if t.admitted or refused_keep:
            room = {pool: n - t.need.get(pool, 0) for pool, n in room.items()}
    return tuple(out)


def inv_batch_work_conserving(
    budget: Budget, tried: Sequence[Tried], free: Mapping[str, int], refused_keep: bool = False
) -> bool:
    """Every refusal of an admission step had a reason (:func:`unreasoned_refusals` is empty)."""
    return not unreasoned_refusals(budget, tried, free, refused_keep)


def inv_waiting_blank(kv_len: int, prefix_len: int) -> bool:
    """A request waiting for admission (new, refused or retracted) keeps nothing it computed or matched: a refused
    attempt rolled its match back, a retraction gave its KV back (an engine that prefills on admission).

    >>> inv_waiting_blank(0, 0), inv_waiting_blank(0, 2)
    (True, False)
    """
    return kv_len == 0 and prefix_len == 0


def kept_through(before: PrefixCache, after: PrefixCache) -> PrefixCache:
    """What the cache held through a step that cached nothing: each page, SWA-live page and Mamba state that
    ``before`` and ``after`` both hold, with the same slots (what a step evicted is gone from ``after``)."""
    return PrefixCache(
        before.page_size,
        before.window,
        before.mamba,
        {k: v for k, v in before.full.items() if after.full.get(k) == v},
        before.swa_live & after.swa_live,
        {k: v for k, v in before.mamba_state.items() if after.mamba_state.get(k) == v},
    )


def reuse_bounds(before: PrefixCache, after: PrefixCache, tokens: Sequence[int]) -> tuple[int, int]:
    """The prefix a request with ``tokens`` may be admitted on, matched in an admission step that cached nothing
    (it matches, locks, allocates and evicts): at least the longest match of its tokens but the last in what the
    cache kept through the step (:func:`kept_through`; a match rule is monotone in the cache), at most the longest
    in what it held before the step (the last token is always computed: its logits sample the next one)."""
    key = tuple(tokens[: max(0, len(tokens) - 1)])
    return match_length(kept_through(before, after), key), match_length(before, key)


def inv_reuses_cache(prefix_len: int, tokens: Sequence[int], before: PrefixCache, after: PrefixCache) -> bool:
    """A request admitted outside a session runs on the prefix the cache offered it (:func:`reuse_bounds`): one
    shorter recomputes KV the cache held (more KV taken, a lower hit rate), one longer runs on KV it never held.

    >>> b = PrefixCache(1, None, False, {(1,): (4,), (1, 2): (5,), (1, 2, 3): (6,)})
    >>> inv_reuses_cache(2, (1, 2, 3), b, b), inv_reuses_cache(1, (1, 2, 3), b, b)
    (True, False)
    >>> evicted = PrefixCache(1, None, False, {(1,): (4,)})  # the step evicted (1, 2) and (1, 2, 3)
    >>> inv_reuses_cache(1, (1, 2, 3), b, evicted)
    True
    """
    low, high = reuse_bounds(before, after, tokens)
    return low <= prefix_len <= high


def take(budget: Budget, new_tokens: int) -> Budget:
    """The budget left after admitting a request with ``new_tokens`` uncached tokens."""
    return Budget(budget.tokens - new_tokens, budget.requests - 1)


def inv_rollback_restores(a: Attempt, after: Mapping[str, Ledger], handles_after: frozenset[HandleId]) -> bool:
    """A rejected request holds exactly what it held before the attempt, in every pool and in locks."""
    same_slots = all(held_by(led, a.req) == a.before.get(name, frozenset()) for name, led in after.items())
    return same_slots and handles_after == a.handles_before


def inv_commit_keeps(a: Attempt, after: Mapping[str, Ledger], lenders: tuple[Owner, ...] = ()) -> bool:
    """An admitted request still holds everything it held before the attempt.

    ``lenders``: owners whose holdings the request now runs on (a session whose record it
    borrows); what the request handed to them on admission is still its to use.
    """
    return all(
        a.before.get(name, frozenset()) <= held_by(led, a.req).union(*(held_by(led, o) for o in lenders))
        for name, led in after.items()
    )


def leaked_by_rollback(a: Attempt, after: Mapping[str, Ledger]) -> dict[str, Slots]:
    """Per pool, the slots a rejected request kept that it did not hold before (for error messages)."""
    out = {}
    for name, led in after.items():
        extra = held_by(led, a.req) - a.before.get(name, frozenset())
        if extra:
            out[name] = extra
    return out
