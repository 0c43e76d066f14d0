"""An int subclass is no count, id or amount (``spec.domains.is_count``/``is_amount`` take ``int`` itself): the
reference refuses one, typed, naming the argument and the operation, and changes nothing."""

from __future__ import annotations

from enum import IntEnum

import pytest

from kvledger.contracts.abstraction import abstract
from kvledger.impl.allocators import TokenAllocator
from kvledger.impl.owners import encode
from kvledger.impl.radix import RadixCache
from kvledger.spec import domains as D
from kvledger.spec.errors import CacheError, InvalidArgument
from kvledger.spec.types import Component, Owner, OwnerKind, request


class Size(IntEnum):
    FOUR = 4


def test_the_spec_puts_an_int_subclass_outside_every_count_domain() -> None:
    assert D.is_count(4) and not D.is_count(Size.FOUR)
    assert D.is_amount(4) and not D.is_amount(Size.FOUR)


def test_an_alloc_of_an_int_subclass_size_is_refused_and_changes_nothing() -> None:
    kv = TokenAllocator(16)
    kv.alloc(3, request(1))
    before = abstract(kv)
    with pytest.raises(InvalidArgument, match=r"alloc .*size must be an int, got .*Size"):
        kv.alloc(Size.FOUR, request(2))
    assert abstract(kv) == before


def test_an_evict_of_an_int_subclass_count_is_refused() -> None:
    cache = RadixCache(TokenAllocator(16))
    with pytest.raises(InvalidArgument, match=r"evict .*n must be an int"):
        cache.evict(Component.FULL, Size.FOUR)


def test_an_owner_whose_id_is_an_int_subclass_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"id must be an int, got Size"):
        encode(Owner(OwnerKind.REQUEST, Size.FOUR, None), "alloc", "kv")


def test_a_cache_whose_page_size_is_an_int_subclass_is_refused() -> None:
    with pytest.raises(CacheError, match="page_size"):
        RadixCache(TokenAllocator(16), page_size=Size.FOUR)
