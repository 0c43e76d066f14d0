"""Streaming sessions: a request's memory kept between turns (bugs B3, B4).

A session slot (SGLang's ``SessionSlot``) holds, between two turns, the
request-table row, the KV slots written in that row and the Mamba state (plus
ping-pong track buffers) of the last request. The laws:

* **append-only resumption** — a turn resumes from a prefix no longer than
  what was committed (``prefix_len <= committed_len``);
* **tail release** — on resume, row positions ``[start, allocated_len)`` are
  freed *before* anything is written over them, where ``start`` is
  ``prefix_len`` rounded *up* to a page boundary (a paged allocator frees
  whole pages and the partial page still holds committed tokens); the
  remainder ``[prefix_len, start)`` stays with the row;
* **release on close** — closing frees everything the session holds, at once or, while a turn
  still runs on its memory, when that turn ends (``inv_released_on_close``);
* **held equals recorded** — what the ledgers say the session holds is exactly
  what its slot records (``inv_session_holds_recorded``);
* **resumption reuses** — a turn resumes on every committed token its own tokens
  but the last repeat, no fewer (``inv_resume_reuses``): a resume that keeps
  less recomputes KV the session holds; and a turn that ends into its session
  commits every token it computed (``inv_turn_saved_whole``; ``inv_turn_saved_past`` where the finish
  computes more first).

>>> s = save(new_session(1), row=3, kv=(10, 11, 12, 13, 14, 15), committed_len=5, mamba=frozenset({2}))
>>> plan = resume(s, prefix_len=3, page_size=2)
>>> plan.kept, plan.freed
((10, 11, 12, 13), (14, 15))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import icontract

from kvledger.spec.errors import InvalidArgument, LedgerError, must
from kvledger.spec.ledger import Ledger, held_by, holdings
from kvledger.spec.types import Owner, session


@dataclass(frozen=True)
class SessionSlot:
    """What one streaming session holds between turns (nothing while a turn runs)."""

    sid: int
    row: int | None = None
    kv: tuple[int, ...] = ()  # token slot of each position [0, allocated_len), as written in the row
    committed_len: int = 0  # positions whose KV is final; <= allocated_len
    mamba: frozenset[int] = frozenset()  # Mamba state slot and track buffers

    @property
    def allocated_len(self) -> int:
        return len(self.kv)

    @property
    def owner(self) -> Owner:
        return session(self.sid)

    @property
    def empty(self) -> bool:
        return self.row is None and not self.kv and not self.mamba


@dataclass(frozen=True)
class ResumePlan:
    """What resuming hands to the next turn and what it must free first."""

    prefix_len: int
    row: int | None
    kept: tuple[int, ...]  # positions [0, start): handed to the request with the row
    freed: tuple[int, ...]  # positions [start, allocated_len): freed before the row is written
    mamba: frozenset[int]


def new_session(sid: int) -> SessionSlot:
    """An open session holding nothing."""
    return SessionSlot(sid)


def inv_committed_within_allocated(s: SessionSlot) -> bool:
    """committed_len <= allocated_len."""
    return 0 <= s.committed_len <= s.allocated_len


def reusable_on_resume(committed: Sequence[int], tokens: Sequence[int]) -> int:
    """How many tokens a turn with ``tokens`` resumes on, of the session's ``committed`` tokens: their common
    prefix with all of ``tokens`` but the last (the last token is always computed: its logits sample the next).

    >>> reusable_on_resume((1, 2, 3), (1, 2, 3, 4)), reusable_on_resume((1, 2, 3), (1, 2, 3))
    (3, 2)
    >>> reusable_on_resume((1, 2), (1, 5, 2))
    1
    """
    n, last = 0, len(tokens) - 1
    while n < min(len(committed), last) and committed[n] == tokens[n]:
        n += 1
    return n


def inv_resume_reuses(prefix_len: int, committed: Sequence[int], tokens: Sequence[int]) -> bool:
    """A turn resumed its session on exactly what it may reuse (:func:`reusable_on_resume`): fewer recomputes KV
    the session holds, more runs on committed tokens its own tokens leave (what append-only forbids)."""
    return prefix_len == reusable_on_resume(committed, tokens)


def inv_turn_saved_whole(computed: Sequence[int], committed: Sequence[int]) -> bool:
    """A turn that ends into its session commits every token it computed, no fewer (the next turn would recompute
    them) and no others: the session's committed tokens are the turn's ``computed`` ones.

    >>> inv_turn_saved_whole((1, 2, 3), (1, 2, 3)), inv_turn_saved_whole((1, 2, 3), (1, 2))
    (True, False)
    """
    return tuple(committed) == tuple(computed)


def inv_turn_saved_past(computed: Sequence[int], committed: Sequence[int], reach: int) -> bool:
    """``inv_turn_saved_whole`` for an engine whose finish computes more tokens first (SGLang decodes until the EOS
    is sampled, computing the KV of the token before it): the session's committed tokens begin with every token the
    turn had computed when its finish began, no fewer and none changed, and are no more than ``reach`` (the most
    the finish can have computed).

    >>> inv_turn_saved_past((1, 2, 3), (1, 2, 3, 4), 4), inv_turn_saved_past((1, 2, 3), (1, 2), 4)
    (True, False)
    >>> inv_turn_saved_past((1, 2, 3), (1, 5, 3, 4), 4), inv_turn_saved_past((1, 2, 3), (1, 2, 3, 4, 5), 4)
    (False, False)
    """
    return tuple(committed[: len(computed)]) == tuple(computed) and len(committed) <= reach


def inv_kv_needs_row(s: SessionSlot) -> bool:
    """KV slots are only held together with the row that references them."""
    return s.row is not None or not s.kv


def round_up(n: int, page_size: int) -> int:
    """``n`` rounded up to a multiple of ``page_size``."""
    return -(-n // page_size) * page_size


def tail_start(prefix_len: int, allocated_len: int, page_size: int) -> int:
    """First row position freed on resume: ``prefix_len`` rounded up to a page, at most ``allocated_len``."""
    return min(round_up(prefix_len, page_size), allocated_len)


def check_save(s: SessionSlot, row: int | None, kv: tuple[int, ...], committed_len: int) -> LedgerError | None:
    """Why saving into ``s`` is illegal (it still holds a turn's memory, KV without a row, bad lengths), or ``None``."""
    if kv and row is None:
        return InvalidArgument("save", "session", kv, f"session {s.sid}: KV slots without the row that references them")
    if not s.empty:
        return InvalidArgument(
            "save", "session", s.kv, f"session {s.sid} still holds row {s.row}: resume or close first"
        )
    if not 0 <= committed_len <= len(kv):
        return InvalidArgument("save", "session", kv, f"committed_len {committed_len} outside [0, {len(kv)}]")
    return None


def check_resume(s: SessionSlot, prefix_len: int, page_size: int) -> LedgerError | None:
    """Why resuming ``s`` at ``prefix_len`` is illegal (append-only), or ``None``."""
    if page_size < 1:
        return InvalidArgument("resume", "session", (), f"page_size {page_size} must be >= 1")
    if not 0 <= prefix_len <= s.committed_len:
        return InvalidArgument(
            "resume",
            "session",
            (),
            f"session {s.sid}: prefix {prefix_len} beyond committed {s.committed_len} "
            "(streaming sessions are append-only)",
        )
    return None


@icontract.require(
    lambda s, row, kv, committed_len: check_save(s, row, kv, committed_len) is None,
    "session empty, KV with its row, lengths valid",
    error=lambda s, row, kv, committed_len: must(check_save(s, row, kv, committed_len)),
)
@icontract.ensure(lambda result: inv_committed_within_allocated(result), "committed within allocated")
@icontract.ensure(lambda result: inv_kv_needs_row(result), "kv held with its row")
def save(
    s: SessionSlot, row: int | None, kv: tuple[int, ...], committed_len: int, mamba: frozenset[int]
) -> SessionSlot:
    """The session takes the finished turn's row, KV and Mamba state (``save_from_req``)."""
    return SessionSlot(s.sid, row, kv, committed_len, mamba)


@icontract.require(lambda s: inv_committed_within_allocated(s), "well-formed session")
@icontract.require(
    lambda s, prefix_len, page_size: check_resume(s, prefix_len, page_size) is None,
    "append-only",
    error=lambda s, prefix_len, page_size: must(check_resume(s, prefix_len, page_size)),
)
@icontract.ensure(lambda s, result: result.kept + result.freed == s.kv, "kept and freed split the row")
@icontract.ensure(lambda result: len(result.kept) >= result.prefix_len, "committed prefix kept")
@icontract.ensure(
    lambda page_size, result: not result.freed or len(result.kept) % page_size == 0, "tail freed from a page boundary"
)
def resume(s: SessionSlot, prefix_len: int, page_size: int) -> ResumePlan:
    """Plan the next turn: free the tail past the page-aligned prefix, hand the rest to the request."""
    start = tail_start(prefix_len, s.allocated_len, page_size)
    return ResumePlan(prefix_len, s.row, s.kv[:start], s.kv[start:], s.mamba)


def close(s: SessionSlot) -> tuple[SessionSlot, ResumePlan]:
    """Close: everything the session holds is released (row, every KV slot, Mamba state and track buffers)."""
    return new_session(s.sid), ResumePlan(0, s.row, (), s.kv, s.mamba)


def inv_released_on_close(ledgers: Mapping[str, Ledger], sid: int) -> bool:
    """Release on close: once a session is closed with no turn of it running, it holds nothing in any pool.

    (An engine may defer the release while a turn runs on the session's memory; with none running, nothing
    is left to wait for.)

    >>> kv = Ledger("kv", 4, frozenset({0, 1}), {session(1): frozenset({2, 3})})
    >>> inv_released_on_close({"kv": kv}, 1), inv_released_on_close({"kv": kv}, 2)
    (False, True)
    """
    return not holdings(ledgers, session(sid))


def taken_from_the_turn(
    before: Mapping[str, Ledger], after: Mapping[str, Ledger], sid: int, turn: Owner
) -> dict[str, frozenset[int]]:
    """Per pool, the slots session ``sid`` or its running ``turn`` held in ``before`` that neither holds in
    ``after`` (a pool missing from ``after``: all of them).

    >>> from kvledger.spec.types import request
    >>> kv = Ledger("kv", 4, frozenset({0}), {session(1): frozenset({1}), request(7): frozenset({2, 3})})
    >>> freed = Ledger("kv", 4, frozenset({0, 1}), {request(7): frozenset({2, 3})})
    >>> taken_from_the_turn({"kv": kv}, {"kv": freed}, 1, request(7))
    {'kv': frozenset({1})}
    """
    owners = (session(sid), turn)
    out: dict[str, frozenset[int]] = {}
    for name, was in before.items():
        now = after.get(name)
        held = frozenset().union(*(held_by(was, o) for o in owners))
        kept = frozenset().union(*(held_by(now, o) for o in owners)) if now is not None else frozenset()
        if held - kept:
            out[name] = held - kept
    return out


def inv_close_spares_the_turn(before: Mapping[str, Ledger], after: Mapping[str, Ledger], sid: int, turn: Owner) -> bool:
    """A close made while a turn runs on the session's memory frees none of it: an engine refuses the close, or
    defers the release to the turn's end (``inv_released_on_close``); either way every slot the session or the
    running ``turn`` held before the close is still held by one of them after it (:func:`taken_from_the_turn`
    finds none).

    >>> from kvledger.spec.types import request
    >>> kv = Ledger("kv", 4, frozenset({0}), {session(1): frozenset({1}), request(7): frozenset({2, 3})})
    >>> freed = Ledger("kv", 4, frozenset({0, 1}), {request(7): frozenset({2, 3})})
    >>> inv_close_spares_the_turn({"kv": kv}, {"kv": kv}, 1, request(7))
    True
    >>> inv_close_spares_the_turn({"kv": kv}, {"kv": freed}, 1, request(7))
    False
    """
    return not taken_from_the_turn(before, after, sid, turn)


def inv_lent_to_a_live_turn(sid: int, lent_to: int | None, live: Mapping[int, int | None]) -> bool:
    """A session's memory is lent only to a live turn of it: ``lent_to`` names a request that is waiting or
    running (``live``: each such request's session) and belongs to session ``sid``. A turn gives the memory back,
    or saves into it, as it ends (finished, aborted, retracted, dropped); a session still lent to one that ended
    holds its memory for nobody and is never resumed again.

    >>> inv_lent_to_a_live_turn(1, None, {}), inv_lent_to_a_live_turn(1, 7, {7: 1})
    (True, True)
    >>> [inv_lent_to_a_live_turn(1, 7, live) for live in ({}, {7: 2}, {7: None})]
    [False, False, False]
    """
    return lent_to is None or (lent_to in live and live[lent_to] == sid)


def inv_session_holds_recorded(
    s: SessionSlot, kv: Ledger, rows: Ledger | None, mamba: Ledger | None, page_size: int = 1
) -> bool:
    """The ledgers' view of what the session holds equals what its slot records (no more, no less)."""
    pages = frozenset(x // page_size for x in s.kv) if page_size > 1 else frozenset(s.kv)
    ok = held_by(kv, s.owner) == pages
    if rows is not None:
        ok = ok and held_by(rows, s.owner) == (frozenset() if s.row is None else frozenset({s.row}))
    if mamba is not None:
        ok = ok and held_by(mamba, s.owner) == s.mamba
    return ok
