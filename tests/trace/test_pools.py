"""The replay's sparse ledgers are ``spec.ledger``: same verdicts, same errors, same state, any run."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvledger.contracts.trace.pools import SparseLedger
from kvledger.spec import ledger as L
from kvledger.spec.errors import LedgerError
from kvledger.spec.types import Component, Owner, node, request, session

OWNERS = [request(1), request(2), node(3), node(3, Component.MAMBA), session(4)]
MOVES = st.tuples(
    st.sampled_from([None, *OWNERS]),
    st.sampled_from([None, *OWNERS]),
    st.frozensets(st.integers(-1, 10), max_size=4),
)


def _spec_move(s: L.Ledger, src: Owner | None, dst: Owner | None, slots: frozenset[int]) -> L.Ledger | LedgerError:
    try:
        if src is None:
            assert dst is not None
            return L.allocate(s, dst, slots)
        if dst is None:
            return L.free(s, src, slots)
        return L.transfer(s, src, dst, slots)
    except LedgerError as err:
        return err


@given(st.lists(MOVES, max_size=40))
def test_sparse_ledger_refines_the_spec(moves: list[tuple[Owner | None, Owner | None, frozenset[int]]]) -> None:
    """Each move: the spec's decorated transition and the sparse ledger agree on legal or not (the same
    typed error, the same message), and on the state after; a rejected move changes nothing."""
    spec = L.new_ledger("kv", 9, base=1)
    sparse = SparseLedger("kv", 9, base=1)
    for src, dst, slots in moves:
        if src is None and dst is None:
            continue
        before = sparse.to_ledger()
        want = _spec_move(spec, src, dst, slots)
        got = sparse.apply(src, dst, slots)
        if isinstance(want, LedgerError):
            assert type(got) is type(want) and str(got) == str(want)
            assert sparse.to_ledger() == before  # rejected: untouched
        else:
            assert got is None
            spec = want
        assert sparse.to_ledger() == spec
        assert sparse.num_free == len(spec.free)
        assert all(sparse.owner_of(x) == L.owner_of(spec, x) for x in range(0, 11))


def test_a_huge_pool_costs_what_is_held() -> None:
    """Declaring 2**31 slots allocates nothing: the sparse ledger stores held slots only."""
    big = SparseLedger("kv", 2**31 - 1, base=1)
    assert big.apply(None, request(1), frozenset({5, 2**31 - 1})) is None
    assert big.num_free == 2**31 - 3 and len(big.owner) == 2
    assert 7 in big.view.free and 5 not in big.view.free and 0 not in big.view.free
    err = big.apply(request(2), None, frozenset({5}))
    assert err is not None and "held by req:1" in str(err)
