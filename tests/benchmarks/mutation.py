"""Mutation testing of ``impl/``: how many small, plausible bugs does the default ``kvledger check`` catch?

Each mutant is one small change of the kind real memory managers have shipped,
made by an AST operator on one ``impl/`` module (here, not a mutation library: mutmut and
cosmic-ray mutate operators and constants everywhere, while the bugs that matter here are
dropped unlinks, frees and rollbacks, swapped owners and off-by-one ranges):

* ``drop-call``: a call statement removed (an unlink, a free, a lock or unlock, a rollback step);
* ``drop-store``: an assignment to an attribute or an item removed (a pointer or counter not reset);
* ``boundary``: ``<`` / ``<=`` and ``>`` / ``>=`` swapped (an off-by-one bound);
* ``slice+1``: a slice bound moved by one (an off-by-one page or row range);
* ``len+1``: a ``len(...)`` made one longer (a counter moved by the wrong length);
* ``aug-sign``: ``+=`` / ``-=`` swapped (a counter moved the wrong way);
* ``swap-owner``: the source and destination of a ``transfer`` swapped (the wrong owner);
* ``negate-if``: an ``if`` condition negated (a branch on the wrong state);
* ``and-or``: ``and`` / ``or`` swapped.

A second family (``--operators new``, issue 19's fourteenth round: kinds of bug the first nine never drew, to
measure the checker on classes it was not tuned on; ``--operators all`` draws from both):

* ``drop-raise``: a ``raise`` removed (a check that no longer refuses: bad input goes on);
* ``negate-cmp``: ``==`` / ``!=``, ``is`` / ``is not``, ``in`` / ``not in`` swapped where the comparison is not an
  ``if``'s whole test (``negate-if`` has those): in a loop's test, a return, an assignment, a compound condition;
* ``swap-args``: a call's first two positional arguments swapped, both names or attributes (arguments in the
  wrong order); never in a ``raise`` (an error's message), never a ``transfer`` (``swap-owner`` has those) and
  never a call whose arguments commute (``min``, ``max``, ``torch.equal``: the same program);
* ``end-index``: ``[0]`` / ``[-1]`` swapped (the wrong end of a list, a stack or a path);
* ``const+1``: an integer constant in arithmetic or a comparison made one larger (a bound, a size or a step off
  by one: ``n - 1``, ``x >= 0``, ``2 ** 31``);
* ``min-max``: ``min`` / ``max`` swapped.

No mutant touches ``faults.py``, ``__repr__`` or ``__str__``. Each mutant is written into a
private copy of the package: the worktree is never edited. Then ``kvledger check`` runs at the
default profile (``DRIVER``: the same machines, profile, contract tier and worker processes, one per
core, with shrinking cut at once, stopping at the first violation), the suite most likely to kill first
(so a mutant's check takes both cores: run one sample at a time); a suite that never
runs the mutated module is skipped (``REACH``). A mutant is *killed* when a suite fails; the
law it names is recorded. A survivor that ``pytest tests/impl`` kills changes behaviour for
sure; the other survivors are judged by hand (``EQUIVALENT``, each with its reason).

The score is ``killed / (mutants - equivalent)``. Usage (the whole population is large: sample it)::

    nice -n 10 python tests/benchmarks/mutation.py --sample 30 --seed 1
    python tests/benchmarks/mutation.py --list            # every mutant id, nothing run
    python tests/benchmarks/mutation.py --only impl/lru.py:196:12:drop-store   # where it is now, or its id
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMPL = ROOT / "impl"
SKIP_FILES = {"__init__.py", "faults.py"}
SKIP_FUNCS = {"__repr__", "__str__"}

POOLS = {"slots", "allocators", "mamba", "req_to_token", "owners", "integrity", "arguments"}
CACHE = POOLS | {"radix", "tree", "lru", "locks", "kvview"}
REACH: dict[str, set[str]] = {"pools": POOLS, "cache": CACHE, "system": CACHE | {"memory", "session", "admission"}}
REACH["pools"] |= {"radix"}  # NOTE: the pool machine's constructor probe builds radix caches over its pools
# NOTE: and its public-call probe (``contracts/machines/calls.py``) drives a live radix cache and memory manager
REACH["pools"] |= CACHE | {"memory", "session", "admission", "requests", "leaks"}
REACH["system"] |= {"requests", "leaks"}
"""Which ``impl`` modules each suite runs (a mutant elsewhere cannot change what that suite sees)."""

EQUIVALENT: dict[str, str] = {
    "impl/arguments.py:check_int:negate-cmp:hi is not None#2": (
        "message text only (new family, seed 79, 2026-12-03): the bound a refusal quotes is swapped (``>= lo`` for "
        "``[lo, hi)``, ``[lo, None)`` for ``>= lo``); the same test refuses the same values with ``InvalidArgument`` "
        "naming the operation, the argument and its value, and nothing else changes"
    ),
    "impl/radix.py:RadixCache.insert:const+1:1": (
        "node ids skip one (new family, seed 76, 2026-12-02): an insert that adds a leaf advances the next id by two; "
        "ids stay unique and increasing, nothing reads them as dense, and the id space (2**56) is out of reach"
    ),
    "impl/slots.py:<module>:const+1:1": (
        "a speed memo's bound (new family, seed 75, 2026-12-02): ``FRESH_MAX`` twice as large lets results of up to "
        "2**18 slots be remembered as known-distinct instead of 2**17; no checked program allocates that many (the "
        "pools hold far fewer), and a remembered result only skips re-proving what the pool proved at its alloc"
    ),
    "impl/owners.py:<module>:const+1:1#5": (
        "the same refusal (new family, seed 73, 2026-12-02): ``_MAX_TAG`` one lower moves only the tag "
        "``2**63 - 1`` from the kind test to the range test, and both refuse it with ``InvalidArgument`` from "
        "``decode`` (its kind code, 7, names no owner)"
    ),
    "impl/slots.py:SlotPool.alloc:const+1:0#3": (
        "a bound no size reaches (new family, seed 72, 2026-12-02): the ``elif 0 < n <= FRESH_MAX`` branch runs only "
        "for sizes the ``0 < n <= HANDED_MAX`` branch above it did not take (n <= 0 or n > 8192), where ``0 < n`` "
        "and ``1 < n`` agree"
    ),
    "impl/slots.py:SlotPool._free_host:end-index:ids[0]": (
        "one element (new family, seed 72, 2026-12-02): the test reads ``ids[0]`` only when ``k == 1``, where "
        "``ids[0]`` and ``ids[-1]`` are the same slot"
    ),
    'impl/lru.py:_repeated:drop-raise:raise AssertionError("_repeated: no node named twice")': (
        "an unreachable guard (new family, seed 70, 2026-12-02): its one caller, LRUList.place, calls it only "
        "after finding a repeat in the order (fewer distinct nodes in the run than nodes, or a node both before and "
        "in the run), so the loop always returns that node; without the raise the function would fall off its end "
        "only on an order with no repeat, which never reaches it"
    ),
    "impl/lru.py:LRUList.insert_behind:drop-raise:"
    'raise AlreadyInList("lru_insert", self.component.value, node.id, "already in the list")': (
        "a check another check repeats (new family, seed 67): without the membership test, a member given as the "
        "node still meets _check_unlinked, which raises the same AlreadyInList naming the same node (a member's "
        "pointers are always set, to a neighbour or the list's head or tail); only the message's reason differs "
        "('still linked' for 'already in the list'), and the misuse probe's 'insert_behind of a member' still gets "
        "the class and the culprit it wants"
    ),
    "impl/slots.py:SlotPool._free_host:const+1:1#2": (
        "a fast path's gate (new family, seed 55, 2026-11-30): with ``k == 2`` for ``k == 1``, one slot takes the "
        "general path (``claim``, the same check), and two slots compare 16 bytes of tags with one tag's 8: never "
        "equal, so the free falls back to the checked path, which frees the same slots or names the same error"
    ),
    "impl/slots.py:run_start:const+1:0": (
        "a speed path (new family, seed 55, 2026-11-30): with ``at >= 1``, a descending run that starts at the "
        "highest id ``_RUNS`` covers is not found as a run (-1); the pop then tags the same ids through a fancy "
        "index instead of a slice, and their free reads them the same way: the same slots, tags and answers"
    ),
    "impl/slots.py:SlotPool.free:end-index:held[0]": (
        "a speed memo (new family, seed 49, 2026-11-30): ``free``'s memo of ``k`` copies of the owner's tag bytes "
        "is tested by its last item (the ``k`` copies, the tag bytes themselves only for ``k == 1``) instead of its "
        "first: it is made again more often, with the same bytes, and every free reads the tags against them alike"
    ),
    "impl/slots.py:SlotPool.claim:negate-cmp:idx.dtype == I64": (
        "a fast path's guard (new family, seed 47, 2026-11-30): host ids of int64 then answer False ('not shown', "
        "which the contract allows at any time: every caller then runs the checked path, with the same tags and "
        "refusals), and host ids of another integer dtype, which no caller passes, are read by value as the same "
        "slots"
    ),
    "impl/slots.py:_tag_bytes:const+1:1": (
        "a speed memo (new family, seed 46, 2026-11-30): with ``1 < n`` made ``2 < n`` the memo of tag runs is not "
        "looked up for two copies; the same bytes are made again (and stored): the same answer"
    ),
    "impl/slots.py:SlotPool._pop_ids:end-index:seen[0]": (
        "a speed memo (new family, seed 46, 2026-11-30): the last owner seen compared with the memo's tag bytes "
        "(``seen[-1]``) instead of its owner is never the same object, so every pop encodes (and checks) the owner "
        "again: the same tag, the same refusals, only the memo unused"
    ),
    "impl/slots.py:SlotPool.check_alloc:const+1:0": (
        "a fast path's guard (new family, seed 44, 2026-11-30): ``n < 0`` made ``n < 1`` sends an alloc of 0 slots "
        "through ``check_int``, which accepts 0 and returns it: the same size, the same owner check, the same answer"
    ),
    "impl/radix.py:RadixCache._check_insert:end-index:torch.nonzero(mixed)[0]": (
        "which true culprit a message names (new family, seed 42, 2026-11-30): with two or more pages only partly "
        "the cache's slots, the SlotConflict names the last such page instead of the first; the same call is "
        "refused with the same type and nothing changed, and the page it names is one that is only partly the "
        "cache's (with one such page, the first and the last are the same)"
    ),
    "impl/owners.py:encode:negate-cmp:kind == _NODE_KIND#2": (
        "an error message's words (new family, seed 8, 2026-11-29): an owner whose component does not fit its kind "
        "is refused with InvalidArgument by the same test either way; only which of the two explanations it gives "
        "changes"
    ),
    'impl/radix.py:RadixCache.evict:negate-cmp:check_int("evict", comp.value, "n", n) == 0': (
        "the same answer by the long way (new family, seed 12, 2026-11-29): n = 0 then goes on to the eviction "
        "loop, which stops before its first node (freed >= 0) and answers 0; every other n <= 0 or non-int is "
        "refused by check_int as before"
    ),
    'impl/session.py:Sessions.unresume:drop-raise:raise InvalidArgument("unresume", "session", (), f"session '
    "{slot.sid} is not lent to request {req.ri": (
        "a guard of a state no call reaches (new family, seed 12, 2026-11-29): a request of an open session holds a "
        "row only while the session is lent to it (one turn at a time: admission refuses a second turn); without "
        "the guard, a request with no row is refused by the row pool's free or transfer of row None, typed, before "
        "anything changes"
    ),
    "impl/allocators.py:PagedAllocator.alloc:swap-args:self.pool.alloc(pages, owner)": (
        "off the CPU only (new family, seed 5, 2026-11-29): the alloc of a paged pool whose device is not the CPU "
        "(a CPU pool allocates through alloc_ids and its host row table below); kvledger check runs on the CPU"
    ),
    "impl/slots.py:SlotPool.free:negate-cmp:held[1] != k": (
        "a speed memo (new family, seed 5, 2026-11-29): the owner's tag bytes times k are rebuilt when k is the "
        "same and kept when it differs; bytes of another length never equal the slots' tags, so the free then "
        "takes the checked path (_held_index), which frees the same slots or names the same error"
    ),
    "impl/slots.py:run_start:const+1:8#4": (
        "a speed proof's offset (new family, seed 5, 2026-11-29): the descending table's index computed from "
        "len(desc) // 9 instead of // 8 points at other ids, so the byte comparison finds no run (it matches only "
        "bytes equal to the ids themselves) and the caller tags the ids through a fancy index: the same tags"
    ),
    "impl/slots.py:SlotPool._pop_ids:negate-cmp:"
    "free_np.item(top - n) - (first := free_np.item(top - 1)) in (n - 1, 1 - n)": (
        "a speed path's test (new family, seed 3): a pop whose ends are n - 1 apart is tagged through its ids "
        "instead of a slice, and any other pop asks run_start, which proves a run by comparing bytes and finds none "
        "there; the same tags either way"
    ),
    "impl/radix.py:RadixCache.insert:negate-cmp:self.mamba is None#2": (
        "an error message's words (new family, seed 3): a Mamba slot offered where none may sit is refused, "
        "ComponentDisabled, either way; the message gives the other of its two reasons"
    ),
    "impl/integrity.py:verify:end-index:torch.nonzero(bad)[0]": (
        "an error message's words (new family, seed 2): the IntegrityError names the last wrong slot, with its "
        "token, position and contents, instead of the first; the same error for the same states"
    ),
    "impl/kvview.py:KVView.take:negate-cmp:owner.kind is OwnerKind.NODE": (
        "a fast path's gate (new family, seed 2): take answers False (ask the general checks) for a request's "
        "insert, whose checks then pass or raise as take's would; a node's insert, which it declined, takes the "
        "claim, which checks that owner's tags as check_held does"
    ),
    "impl/integrity.py:fingerprint_one:end-index:fingerprint_unchecked(torch.tensor([token]), "
    "torch.tensor([position]))[0]": (
        "the wrong end of a one-element result (new family, seed 4): the fingerprint of one token is a "
        "one-element tensor; [0] and [-1] are it"
    ),
    "impl/kvview.py:KVView.take:swap-args:pool.claim(units, owner, dst, distinct=fresh)": (
        "a fast path's gate whose other side runs the same checks (new family, seed 4): claim given an owner "
        "as its ids returns False (not a tensor or int64 array), and take's False sends the insert through "
        "check_fresh and check_held, which accept and refuse exactly what claim would"
    ),
    "impl/locks.py:LockTable.coverage:swap-args:self.covered(op, handle)": (
        "read only by a named fault (new family, seed 4): coverage's one caller is faults.py's B5 re-creation, "
        "which the tool never mutates and the default check never switches on; the reference's own unlock reads "
        "covered"
    ),
    "impl/slots.py:_grow_runs:end-index:_RUNS[0]": (
        "the same length either way (new family, seed 4): _RUNS[0] and _RUNS[1] are always made together from "
        "the same ids, ascending and descending"
    ),
    'impl/radix.py:RadixCache.mamba_copy_on_write:drop-raise:raise OverAllocation("mamba_copy_on_write", '
    '"mamba", (), f"pool full, no unlocked state to evict ({o': (
        "the same refusal by another path (new family, seed 5): with no state to evict, the copy locks its source, "
        "evicts nothing, and the pool's alloc raises OverAllocation; the lock is released, and the cache, its "
        "locks, LRU lists and pools are as they were (measured: _cache_fingerprint equal); only the message differs"
    ),
    "impl/slots.py:SlotPool.code_of:end-index:self._seen[0]": (
        "a speed memo (new family, seed 5): the last owner seen is compared with the memo's bytes, never the same "
        "object, so every call encodes the owner again"
    ),
    "impl/slots.py:SlotPool.free:negate-cmp:self._tags is not None": (
        "a fast path's gate whose other side runs the same checks (new family, seed 5): a CPU pool's free skips "
        "_free_host and takes _held_index, which accepts and refuses what it does; a pool with no host tags "
        "(off the CPU) would try _free_host, which declines a tensor it cannot read"
    ),
    "impl/slots.py:SlotPool.__init__:const+1:1#2": (
        "a resource cap the spec does not state (new family, seed 5): a pool's base (its reserved slots) of 2**40 "
        "or more is refused; the spec's base is any count, and a pool at the cap holds terabytes of tags"
    ),
    "impl/slots.py:run_start:const+1:8#5": (
        "a speed guard made stricter (new family, seed 5): the descending run's slice is longer than its ids, so "
        "no descending run is recognised and its ids are read one by one"
    ),
    "impl/radix.py:RadixCache.mamba_copy_on_write:end-index:pool.alloc(1, owner)[0]": (
        "the wrong end of a one-element result (new family, seed 6): alloc(1) returns one slot; [0] and [-1] are it"
    ),
    "impl/slots.py:SlotPool.free:end-index:seen[0]": (
        "a speed memo (new family, seed 6): the owner is compared with the memo's bytes, never the same object, so "
        "the free encodes the owner again"
    ),
    "impl/slots.py:run_start:const+1:8#3": (
        "a speed guard made stricter (new family, seed 6): the ascending run's slice is longer than its ids, so no "
        "ascending run is recognised and its ids are read one by one"
    ),
    "impl/owners.py:<module>:const+1:1#4": (
        "the same refusal by another check (new family, seed 7): with the top of the tag range at 2**64 - 1, a tag "
        "in [2**63, 2**64) passes the range test, but its kind bits (tag >> 60, 8 to 15) name no owner kind, so "
        "decode refuses it with InvalidArgument all the same"
    ),
    "impl/req_to_token.py:has_duplicates:const+1:256": (
        "a speed cut-off (new family, seed 7): a row write of exactly 256 slots is checked for repeats with a set "
        "rather than a sort; the same answer"
    ),
    "impl/slots.py:SlotPool.__init__:const+1:1#5": (
        "off the CPU only (new family, seed 7): the free stack of a pool whose device is not the CPU"
    ),
    'impl/tree.py:RadixTree.__init__:negate-cmp:self.device.type != "cpu"': (
        "the device path taken on the CPU (new family, seed 7): nodes keep a copy of their slots and the tree "
        "takes its torch path instead of its host path; the same results (every suite holds: the device path "
        "agrees with the host one on the CPU)"
    ),
    "impl/memory.py:MemoryManager._release_owned:min-max:min(req.alloc_len, start)": (
        "a field nothing reads (new family, seed 2): alloc_len is never below start here, so max leaves it as it "
        "was; abort and retract set it to 0 next, and a finished request has no row, so its alloc_len is read by "
        "no view, call or law"
    ),
    "impl/radix.py:RadixCache.mamba_copy_on_write:end-index:pool.alloc(1, owner)[0]#2": (
        "the wrong end of a one-element result (new family, seed 2): alloc(1) returns one slot; [0] and [-1] are it"
    ),
    "impl/slots.py:SlotPool._pop_ids:const+1:0#3": (
        "a speed memo (new family, seed 2): a one-slot alloc is not remembered as known-distinct, so a later free "
        "or hand-over of it proves it distinct the slow way"
    ),
    "impl/tree.py:RadixTree._new_leaf:negate-cmp:new is not None": (
        "off the CPU only (new family, seed 2): the new leaf's device copy of its value; on the CPU no copy is made "
        "either way"
    ),
    "impl/radix.py:RadixCache.insert:const+1:8#2": (
        "a speed memo's test (new family, seed 1): insert reuses the match's slot bytes when they are 8 bytes a hit "
        "token; at 9 it never does (but for an empty hit, the same empty bytes) and reads the same slots along the "
        "path"
    ),
    "impl/slots.py:_grow_runs:const+1:8": (
        "a speed table (new family, seed 1): _RUNS is remade for the asking pool's size a little more often (at "
        "most smaller than the largest pool's); run_start checks the table's length before it trusts a slice of it "
        "and otherwise tags through the ids"
    ),
    "impl/slots.py:run_start:const+1:8": (
        "a speed guard made stricter (new family, seed 1): a run near the table's end is not recognised as one, so "
        "its ids are tagged one by one instead of through a slice; the same tags"
    ),
    "impl/tree.py:key_bytes:min-max:min(array('q', raw))": (
        "an error message's words (new family, seed 1): a key with a negative id is still refused, typed, by "
        "the same test; the message names its largest id instead of its most negative"
    ),
    "impl/tree.py:key_bytes:boundary:len(raw) < _SIGN_LONG": (
        "a speed cut-off (seed 41): a key of exactly 4,096 tokens has its signs checked by the byte-wise isascii "
        "pass instead of numpy's min; both refuse a negative id alike"
    ),
    "impl/slots.py:RecentAllocs.add_short:slice+1:-64:": (
        "a speed memo's key (seed 40): a short alloc result of 64 bytes or more is filed under its last 63 bytes, "
        "which find (looking up the last 64) never meets, so it is proven distinct again by the slow path, as "
        "add_short's drop-store set-aside above; shorter results get the same key either way"
    ),
    "impl/slots.py:SlotPool.release:slice+1:top : top + k#2": (
        "off the CPU only (seed 39): release's push onto the device stack, for a pool whose device is not the CPU; "
        "kvledger check runs on the CPU"
    ),
    "impl/tree.py:RadixTree.prefix:len+1:len(self._nodes)": (
        "a walk's guard one step late where the walk yields nothing (seed 39): prefix collects the keys and, on a "
        "parent cycle, raises the same IntegrityError one step later (a cycle never ends the walk); on a tree "
        "without one no path is that long"
    ),
    "impl/slots.py:_grow_runs:negate-if:if 8 * size > len(_RUNS[0]):": (
        "a speed table (seed 38): _RUNS not grown (or regrown shorter) only makes run_start's one byte comparison "
        "fail for ids past the table, and the caller then takes the general path: the same tags, slower"
    ),
    "impl/slots.py:_tag_bytes:drop-call:_TAG_RUNS.clear()": (
        "a memo's bound (seed 38): the table of uniform tag runs is not emptied past 64 entries; only memory grows"
    ),
    "impl/tree.py:RadixTree._as_tokens:and-or:not t.is_meta and t.device == self.device": (
        "off the CPU only (seed 38): the fast check's branch for a tree whose device is not the CPU; kvledger check "
        "runs on the CPU"
    ),
    "impl/req_to_token.py:ReqToTokenPool.write:boundary:end - start > 1": (
        "a shortcut's bound (seed 37): a write of one slot is also checked for a slot named twice, which one slot "
        "cannot be; the same answer"
    ),
    "impl/allocators.py:PagedAllocator.pages_of:and-or:uniq.numel() * self.page_size != idx.numel() or "
    "bool((counts != self.page_size).any())": (
        "equivalent since seed 38's fix: pages_of now refuses a token named twice first, and with distinct tokens "
        "no page holds more than page_size of them, so whole pages by count (uniq * page_size == n) means every "
        "page's count is page_size; on the tree seed 38 was drawn on, this mutant survived and changed behaviour"
    ),
    "impl/slots.py:SlotPool.claim:negate-if:if tags is None:": (
        "a fast path turned off on the CPU (seed 36): claim answers False ('ask the general checks') on every CPU "
        "call, and the insert then runs check_fresh, check_held and transfer, which accept what claim accepts with "
        "the same result; the other branch (no host tags) is a device pool's, which kvledger check never builds"
    ),
    "impl/session.py:Sessions.check:negate-cmp:slot.lent_to is not None": (
        "diagnostic text only (new family, seed 9): the place a session's self-check names says 'lent to request "
        "None' for a session lent to none, and nothing for one that is lent; the check, its law and its error class "
        "are the same"
    ),
    "impl/slots.py:SlotPool.claim:const+1:8": (
        "a fast path turned off (new family, seed 9): claim compares the slots' tags with 9 bytes a slot of its iota "
        "instead of 8, never equal, so it puts back the tags it read (all the owner's) and answers False ('ask the "
        "general checks'), which then accept or refuse the call as the fast path would have"
    ),
    "impl/slots.py:SlotPool.alloc:const+1:0": (
        "a fast path's bound (new family, seed 9): an alloc of one slot takes _pop_ids instead of the inline pop, "
        "which pops the same top slot, tags, stamps and remembers it alike (as the set-aside of its upper bound)"
    ),
    "impl/slots.py:SlotPool.free:negate-cmp:mine[0] is indices": (
        "a fast path turned off (new family, seed 9): the memo of alloc results holds each result itself, so a "
        "tensor found under its id is always that result; negated, the free never takes the memo and the checked "
        "path frees the same slots with the same refusals"
    ),
    "impl/tree.py:RadixTree._as_tokens:negate-cmp:t.device == self.device": (
        "off the CPU only (new family, seed 20): the fast check's branch for a tree whose device is not the CPU (as "
        "seed 38's and-or there); kvledger check runs on the CPU"
    ),
    "impl/memory.py:MemoryManager.event:negate-cmp:step % keep == 0": (
        "when the event log is pruned (new family, seed 20): at every step but each keep-th once the log is past "
        "keep, not at each keep-th; a prune forgets only events no slot's provenance points at (the one reader, the "
        "leak report, looks up a slot's origin), so only its cost changes"
    ),
    "impl/memory.py:MemoryManager.event:const+1:0": (
        "when the event log is pruned (new family, seed 6): once the log is past keep, at the step after each "
        "keep-th (step % keep == 1) instead of at it; a prune forgets only events no slot's provenance points at, "
        "so only its cost changes (as seed 20's negation there)"
    ),
    "impl/slots.py:SlotPool.claim:const+1:1#3": (
        "a speed path's bound (new family, seed 2): a claim of exactly two ids no longer asks the memo of recent "
        "alloc results whether they are one; the general path after it proves them distinct, in range and the "
        "owner's itself (scattered positions read back), so the answer is the same"
    ),
    'impl/slots.py:SlotPool.transfer:swap-args:self.claim(indices, src, code, op="transfer")': (
        "a speed path's arguments (new family, seed 6): claim given the owner as the ids answers False at once "
        "(no tensor, no host ids), so every transfer takes the checked path after it (_held_index, retag_code), "
        "which gives the same tags and the same refusals"
    ),
    "impl/radix.py:RadixCache.insert:negate-cmp:raw_key is None": (
        "a memo's test (new family, seed 10): with it negated, an insert of an int64 array key always checks its ids "
        "and walks the tree again instead of reusing the walk of the last match of the same bytes, and any other "
        "key's memo never matches a raw key of None: the same walk, slots and refusals, only the cost changes"
    ),
    "impl/slots.py:_tag_bytes:const+1:4096": (
        "a memo's bound (new family, seed 20): the table of one tag's bytes is cleared past 4,097 entries instead of "
        "4,096; the bytes returned are the same"
    ),
    "impl/memory.py:MemoryManager.event:slice+1::-1": (
        "diagnostic text only (seed 35): the stack a manager made with debug=True keeps for a leak report loses its "
        "frames; no state, result or error type changes, and kvledger check runs with debug off"
    ),
    "impl/slots.py:SlotPool._mark_owned:and-or:self._tags is not None and self._origins is not None": (
        "an assertion made weaker (seed 35): _mark_owned runs for CPU pools only, where both host arrays exist, so "
        "the assertion holds either way"
    ),
    "impl/kvview.py:KVView.take:and-or:int(lo) < pool.base or int(hi) >= pool.size": (
        "off the CPU only (seed 36): take's range check on the tensor path, for a pool whose device is not the CPU; "
        "on the CPU take claims through the pool's host ids; kvledger check runs on the CPU"
    ),
    "impl/slots.py:SlotPool.alloc:boundary:n < self._inline_below": (
        "a fast path's bound (seed 34): an alloc of exactly run_min slots (or HANDED_MAX + 1) pops the same top n ids "
        "inline as _pop_ids would, tags and stamps them alike and remembers them in the same verified memos"
    ),
    "impl/slots.py:SlotPool._pop_ids:boundary:lo >= 0": (
        "a run found at slot 0 (seed 34) is tagged through the ids instead of the slice lo:lo + n: the same slots"
    ),
    "impl/slots.py:SlotPool.retag_code:negate-if:if self._stamped:": (
        "off the CPU only (seed 34): retag_code's branch for a pool with no host tags (a device pool); kvledger check "
        "runs on the CPU"
    ),
    "impl/slots.py:RecentAllocs.add_short:drop-store:items[raw[-64:]] = (raw, value)": (
        "a speed memo: a short alloc result not remembered is proven distinct again by the slow path when it is "
        "inserted or freed (the same answer, one scan more)"
    ),
    "impl/slots.py:SlotPool.__init__:drop-store:self.owner_tag[:base] = RESERVED_TAG": (
        "the slots below a pool's base are in no call's range (as_index and check_id take [base, size) except "
        "owner_of, which answers None for a free and a reserved tag alike), and every other reader of the tags "
        "(the abstraction, the SWA held count) starts at the base or treats FREE and RESERVED alike"
    ),
    "impl/admission.py:_acquire:slice+1:: len(key) - len(key) % mm.cache.page_size": (
        "the key is one token longer only when it is unaligned or past its end; match_prefix matches whole "
        "pages and a slice past the end is the whole key, so the match is the same"
    ),
    "impl/admission.py:_acquire:len+1:len(key)": (
        "the match key made one token longer (the aligned length + 1, or past the key's end): match_prefix matches "
        "whole pages and a slice past the end is the whole key, so the match is the same (as the slice+1 above)"
    ),
    "impl/radix.py:RadixCache.dec_lock_ref:boundary:(held := x.refs[I_FULL if c is FULL else SLOT[c]]) <= 0": (
        "a defensive check: a live handle's covered counters are at least 1 in every reachable state (only "
        "releasing a handle lowers them, and a released handle is refused before the loop), so held is never 0"
    ),
    (
        "impl/allocators.py:SWATokenAllocator.transfer:drop-call:"
        'self.swa.pool.check_held("transfer", live, swa_owner(src))'
    ): (
        "a defensive check: the SWA slots of full slots held by src are tagged swa_owner(src) in every "
        "reachable state (the full check just before passed), so it can never fail"
    ),
    "impl/allocators.py:check_kv_write:boundary:s.numel() > 1": (
        "s.numel() > 1 made >= 1: a one-slot write cannot name a slot twice, so the duplicate check it guards"
        " answers no for one slot either way"
    ),
    "impl/memory.py:MemoryManager.round_up:const+1:0": (
        "a fast path's bound (new family, seed 19): 0 <= n made 1 <= n sends n == 0 to check_int, which takes 0 "
        "(its range starts there) and answers it: round_up(0) is 0 either way, every other n unchanged"
    ),
    "impl/slots.py:run_start:const+1:8#2": (
        "a speed proof's slice (new family, seed 19): the descending run is compared with 8 * (at + n) made 9 * "
        "(at + n) bytes of the table, longer than the 8 * n of raw unless the table ends there (then the same "
        "bytes): a descending run is then found only at the table's end, else -1, and the caller tags the ids "
        "through a fancy index instead of a slice: the same tags"
    ),
    'impl/owners.py:encode:drop-raise:raise InvalidArgument(op, where, (), f"owner {owner!r}: id must be an int, '
    "got {type(ident).__name__": (
        "an error message's words (new family, seed 20): with the raise for an id that is not an int dropped, the "
        'next line raises InvalidArgument for the same owner, operation and pool ("outside [0, MAX_IDENT]")'
    ),
    "impl/slots.py:SlotPool.claim:const+1:0": (
        "a fast path's guard (new family, seed 20): ids.min() < 0 made < 1, so a claim naming slot 0 (a pool based "
        "at 0: Mamba states) answers False, which means 'ask the checks', and the checked path gives the same tags and "
        "refusals"
    ),
    "impl/slots.py:SlotPool._pop_ids:const+1:1#4": (
        "a speed path's test (new family, seed 20): the ends of a pop n - 1 apart downwards (1 - n made 2 - n) are no "
        "longer taken for a possible run, so the pop is tagged through its ids, not a slice (as seed 3's negate-cmp "
        "of the same test): the same tags"
    ),
    "impl/slots.py:SlotPool._pop_ids:const+1:1#5": (
        "a speed path's test (new family, seed 32): the other bound of the same test (1 - n made 2 - n, as #4 makes "
        "n - 1 into n - 2): a pop it no longer takes for a possible run is tagged through its ids, and one it takes "
        "for one wrongly is proved no run by run_start's byte comparison: the same tags"
    ),
    "impl/slots.py:SlotPool.release:negate-cmp:type(idx) is np.ndarray": (
        "a conversion skipped (new family, seed 32): a CPU pool's release given a tensor indexes its tag column and "
        "fills its free stack with the tensor itself, which numpy reads through __array__ as the same int64 ids; an "
        "ndarray is taken as it is either way"
    ),
    "impl/slots.py:SlotPool._free_host:end-index:self._seen[0]": (
        "a memo's test (new family, seed 34): the owner compared with the last field of the last-seen record (its "
        "tag's bytes, never an owner) instead of the first, so every one-slot free re-encodes its owner through "
        "_seen_for, which builds the same record: the same tags and refusals"
    ),
    "impl/slots.py:SlotPool.__init__:const+1:1#6": (
        "a device pool's free stack (new family, seed 20; a CPU pool never runs this line): arange down to base - 2 "
        "makes the stack one id longer below its bottom, at index capacity, and no read or push reaches past _top, "
        "which never exceeds capacity: the same pops and pushes"
    ),
    "impl/kvview.py:_repeats:const+1:1": (
        "grain == 1 made grain == 2 (new family, seeds 19 and 20): a token pool's repeat is then found by "
        "torch.unique and a page-2 pool's by has_duplicates over its token slots, which is exact for any in-range "
        "ids, as the negate-if mutant of the same test: the same answer (checked on 60,000 drawn values), another cost"
    ),
    "impl/kvview.py:_repeats:negate-if:if grain == 1:": (
        "both branches answer whether value names a slot twice (has_duplicates's scratch marks take any in-"
        "range id, a token slot of a paged pool included; torch.unique otherwise): only the cost differs"
    ),
    "impl/memory.py:MemoryManager.write_kv:slice+1:start:end#2": (
        "every caller of write_kv passes end == len(req.tokens) (admission, resume, extend), where a slice "
        "one past the end is the same slice"
    ),
    "impl/arguments.py:_what:len+1:len(text)": (
        "message text only: a repr of exactly 40 characters is shown cut to 37 and '...' instead of whole; no"
        " state, result or error type changes"
    ),
    "impl/owners.py:<module>:const+1:63#2": (
        "message text only (new family, seed 25, 2026-11-30): with the int64 bound one bit wider, ``decode`` of a "
        "tag in [2**63, 2**64) passes the range test and is refused by the next one (its top bits name no owner "
        "kind): the same class, operation and pool, another sentence"
    ),
    "impl/slots.py:SlotPool.run_min:const+1:1": (
        "speed only (new family, seed 24, 2026-11-30): the inline alloc's bound is min(run_min, 8194), not 8193: "
        "it differs only when run_min is set past 8,193, and then an alloc of 8,193 slots takes the inline pop "
        "(the same slots, tags and memo of what was handed out, keyed as the general pop keys it)"
    ),
    "impl/slots.py:SlotPool._pop_ids:const+1:0": (
        "speed only (new family, seed 24, 2026-11-30): an alloc of 0 goes through ``check_alloc`` first, which "
        "takes 0 and the owner as the inline test does; the same empty result"
    ),
    "impl/slots.py:_grow_runs:end-index:_RUNS[0]#2": (
        "the two tables of ``_RUNS`` (ascending and descending ids) are always grown together to one length: either "
        "one's length says whether they cover a size (new family, seed 24, 2026-11-30)"
    ),
    "impl/slots.py:<module>:const+1:17": (
        "a memo's bound (new family, seed 23, 2026-11-30): alloc results of up to 2**18 slots are remembered, not "
        "2**17; a result remembered only lets a later check skip proving its slots distinct, which it then proves"
    ),
    "impl/kvview.py:KVView.check_fresh:swap-args:_repeats(self.pool, self.grain, value)": (
        "speed only (new family, seed 22, 2026-11-30): with the pool and the page size swapped, ``_repeats`` never "
        "sees a page size of 1 (a pool is no int) and takes its general test, ``torch.unique``, which answers the "
        "same for every tensor of slots"
    ),
    "impl/slots.py:SlotPool.free:const+1:0#2": (
        "speed only (new family, seed 22, 2026-11-30): a remembered run that starts at slot 0 (a pool based at 0) "
        "is freed through its ids, not through a slice: the same tags read and written, the same slots pushed"
    ),
    "impl/kvview.py:KVView.__init__:const+1:1": (
        "speed only (new family, seed 21, 2026-11-30): the power-of-two test ``g & (g - 2) == 0`` holds for the same "
        "page sizes from 2 up and fails for 1, whose shift (0) is then None: page numbers at page 1 are computed by "
        "a division by 1 instead of a shift by 0, the same numbers"
    ),
    "impl/slots.py:SlotPool._free_host:const+1:0": (
        "speed only (new family, seed 21, 2026-11-30): a free of the one slot 0 skips the one-slot shortcut and "
        "takes ``claim``, which answers the same (slot 0 of a pool based at 1 holds the reserved tag: False, then "
        "the checked path's error; of a pool based at 0, its owner's tag: freed)"
    ),
    "impl/req_to_token.py:ReqToTokenPool.alloc:end-index:self.pool.alloc(1, owner)[0]": (
        "the first and the last of a one-slot alloc result are the same row (new family, seed 11, 2026-11-30)"
    ),
    "impl/slots.py:SlotPool.__getstate__:negate-cmp:self._free_np is not None": (
        "off the CPU only (new family, seed 11, 2026-11-30): a CPU pool's copy then carries its own copy of the "
        "stack tensor, which ``_link_host`` replaces at once by a view of the copied host stack (the same copy); "
        "a device pool's copy would lose its stack, a path no CPU run has"
    ),
    'impl/slots.py:SlotPool._free_host:swap-args:self.claim(ids, owner, op="free")': (
        "speed only (new family, seed 14, 2026-11-30): ``claim`` given the owner as its ids answers False at once "
        "(neither a tensor nor host ids), and ``free`` then takes the checked path: same slots freed, same refusals"
    ),
    "impl/slots.py:run_start:const+1:8#6": (
        "a speed proof's bound (new family, seed 14, 2026-11-30): the descending slice ends at 9 * (at + n) bytes, "
        "longer than the ids' bytes, so no descending run is found (the ids are tagged through a fancy index: the "
        "same tags); where the slice is cut short by the table's end it is exactly the ids' run ending at slot 0, "
        "a true run"
    ),
    "impl/slots.py:_tag_bytes:const+1:64": (
        "a memo's bound (new family, seed 18, 2026-11-30): the table of tag runs is cleared at 65 entries, not 64; "
        "the bytes returned are the same"
    ),
    "impl/allocators.py:PagedAllocator.free:end-index:host[0]": (
        "speed only: ``claim`` is handed the known-distinct flag (a bool), not the pages, and answers False at once"
        " for what is neither a tensor nor host ids; the checked path after it frees the same pages with the same"
        " refusals"
    ),
    "impl/allocators.py:PagedAllocator.alloc:drop-call:self._fresh.add(out.tobytes(), ids)": (
        "speed only: the memo of recent alloc results lets a later claim skip its distinctness pass; without it"
        " the pass runs, same result"
    ),
    'impl/session.py:Sessions._slot:drop-call:check_int(op, "session", "session id", sid, 0, MAX_IDENT + 1)': (
        "message text only: a session id that is no open session is refused with InvalidArgument either way (the"
        " range check only names the range first); same class, state unchanged"
    ),
    "impl/slots.py:SlotPool.claim:and-or:k > 1 and not distinct": (
        "speed only: the distinctness pass also runs for one slot or for slots known distinct, where it cannot"
        " fail; same result and tags"
    ),
    'impl/slots.py:SlotPool.__getstate__:drop-store:state["_handed"] = {}': (
        "a copy's alloc-result memo is keyed by the original's tensors and its hit needs the very tensor object"
        " (``mine[0] is indices``): a copied entry holds a copied tensor, so it never hits (speed only)"
    ),
    "impl/radix.py:RadixCache.insert:boundary:hit < n": (
        "a fully cached key also uses up the id it reserved: node ids skip one but stay unique and growing, and"
        " no law or caller reads them as consecutive"
    ),
    "impl/session.py:Sessions.check:len+1:len(slot.tokens)#2": (
        "message text only: the count in the self-check's error message, after the same comparison raised it"
    ),
    "impl/slots.py:SlotPool.release:and-or:type(idx) is np.ndarray or not isinstance(idx, torch.Tensor)": (
        "``release`` takes a tensor or an int64 ndarray (no checks by design, its callers validate): for either the"
        " two conditions pick the same branch; only an ndarray subclass or a list would differ, and no caller"
        " passes one"
    ),
    "impl/slots.py:_grow_runs:len+1:len(_RUNS[0])": (
        "both sides are multiples of 8 (int64 bytes), so ``8 * size > len + 1`` holds exactly when ``8 * size > len``"
    ),
    "impl/slots.py:SlotPool.alloc:aug-sign:self._top -= n": (
        "the device pools' path (no host mirror: a CUDA pool); every pool of a CPU run takes the host path above,"
        " so no check on a CPU machine can reach it"
    ),
    "impl/slots.py:RecentAllocs.add:len+1:len(raw)": (
        "a speed memo: a result of exactly HANDED_MAX ids is filed with the long ones, where ``find`` does not"
        " look for it; the miss takes the slow path, which proves the same"
    ),
    "impl/tree.py:RadixTree.__init__:len+1:len(SLOT)": (
        "one spare counter past the last component's: every reader indexes by ``SLOT[component]``, none sums or"
        " walks the list"
    ),
    "impl/tree.py:key_bytes:len+1:len(raw)": (
        "which of two sign checks runs (bytes scan or numpy min): they answer the same for every key, and a key's"
        " byte length is a multiple of 8, so ``len + 1 < _SIGN_LONG`` picks the same one anyway"
    ),
    'impl/slots.py:SlotPool.__getstate__:drop-store:state["_last"] = None': (
        "a copy keeps a memo that describes the copy exactly: the same tags, and the owner object copied once with"
        " everything that refers to it (a pool copied alone has no caller holding that owner object: no hit)"
    ),
    "impl/slots.py:SlotPool.claim:drop-store:self._last = None": (
        "the scattered pass writes positions into the tags and then restores them or sets the code, and the code"
        " path forgets the memo itself (``_mark_owned``'s reset, killed when dropped, is the one that matters)"
    ),
    "impl/slots.py:SlotPool._pop_ids:drop-store:self._last = None": (
        "a pop takes free slots only, so the memo of the alloc before (held slots, their tags untouched) stays true;"
        " the reset is conservative"
    ),
    "impl/req_to_token.py:has_duplicates:negate-if:if ids.is_cpu:": (
        "speed only on the CPU, where every check runs: a CPU tensor's duplicates are then counted by torch.unique,"
        " the same verdict; the numpy branch it sends a device tensor to is not reached without a GPU"
    ),
    "impl/slots.py:SlotPool.claim:boundary:k > 1#2": (
        "speed only: a single slot also goes through the distinctness pass (its position written into its tag,"
        " read back, the tag then set to code or restored), which cannot fail for one slot; same result and tags"
    ),
    'impl/kvview.py:KVView.check_held:drop-call:self.swa.swa.pool.check_held("insert", live, swa_owner(owner))': (
        "the SWA transfer the insert makes next checks the same holder and refuses the same slots, typed (NotOwner),"
        " changing nothing (probed: the SWA prober hands some of its SWA slots to another holder); only the"
        " operation its message names differs ('transfer' for 'insert')"
    ),
    "impl/arguments.py:_what:slice+1::37": (
        "message text only: a long repr is cut after 38 characters instead of 37; no state, result or error type"
        " changes"
    ),
    "impl/kvview.py:KVView.take:negate-if:"
    "if not torch.equal(tags, torch.full_like(tags, encode(owner))) or pool.has_duplicates(new):": (
        "off the CPU only: take reaches this check when its pool is not on the CPU (_fast is the CPU path, an SWA "
        "allocator returns earlier), and kvledger check runs on the CPU; there take goes through SlotPool.claim, "
        "which the cache machine's insert_foreign rule holds to refusing slots the request does not hold"
    ),
    "impl/kvview.py:KVView.take:and-or:"
    "not torch.equal(tags, torch.full_like(tags, encode(owner))) or pool.has_duplicates(new)": (
        "the same off-CPU branch of take as its negate-if: unreachable on the CPU, where kvledger check runs"
    ),
    "impl/slots.py:SlotPool.__init__:drop-store:self._free_np = None": (
        "off the CPU only: the branch of a pool whose device is not the CPU; kvledger check runs on the CPU"
    ),
    "impl/slots.py:SlotPool.alloc:drop-call:self.origin.index_fill_(0, out, self._stamp)": (
        "off the CPU only: alloc's branch for a pool whose device is not the CPU (a CPU pool pops through _pop_ids);"
        " kvledger check runs on the CPU"
    ),
    "impl/slots.py:SlotPool.release:drop-store:self._stack[top : top + k] = idx": (
        "off the CPU only: release's branch for a pool whose device is not the CPU; kvledger check runs on the CPU"
    ),
    "impl/slots.py:SlotPool.__init__:drop-call:_grow_runs(self.size)": (
        "speed only: without the id table grown to this pool's size, run_start answers -1 (it checks the table's "
        "length) and the pool tags and frees those slots through a fancy index, with the same result"
    ),
    "impl/lru.py:LRUList.order:len+1:len(self._members)": (
        "a defensive bound: on a list whose links are whole the walk from the head meets exactly len(members) "
        "nodes before the tail, so neither bound fires; only a list a second bug corrupted (a node linked twice) "
        "walks past it, and then the mutant raises one node later (the cache machine's inv_lru_* laws see that "
        "corruption on their own)"
    ),
    "impl/tree.py:RadixTree.recompute_sizes:aug-sign:out[c][int(n.refs[SLOT[c]] > 0)] += _size(n, c)": (
        "recompute_sizes is the slow contract tier's oracle (sizes() == recompute_sizes()) and tests/impl's; no "
        "cache path reads it, and kvledger check runs at tier on (as _size below)"
    ),
    "impl/tree.py:_size:len+1:len(n)": (
        "only recompute_sizes calls _size: the slow contract tier's oracle (sizes() == recompute_sizes(), "
        "--contracts slow) and tests/impl; no cache or memory-manager path reads it, so the cache's state and "
        "results are the same (pytest tests/impl and the slow tier kill it)"
    ),
    "impl/slots.py:SlotPool._pop_ids:drop-call:self._fresh.add(ids.tobytes() if raw is None else raw, None)": (
        "a speed memo, as add_short's store: an alloc result not remembered is proven distinct by the slow path "
        "when it is inserted or freed (every answer the same)"
    ),
    "impl/slots.py:SlotPool._pop_ids:negate-if:if remember and 0 < n <= FRESH_MAX:": (
        "the same memo's gate: remembered or not, a result is a run of distinct ids (every alloc result is), and "
        "a hit is confirmed by comparing every byte; so a memo of more or fewer results changes only speed"
    ),
    "impl/admission.py:_commit:and-or:req.prefix_len and a.prefix_slots is not None": (
        "made `or`: a request that matched nothing (prefix_len 0) has the empty match's indices as its prefix "
        "slots (a non-session admission always sets them), and writing no slots into the row changes nothing"
    ),
    "impl/slots.py:run_start:slice+1:8 * first : 8 * (first + n)": (
        "run_start only proves a fast path: a slice one byte longer never equals the 8n bytes of the ids, so every "
        "ascending run reads as no run and the ids are indexed one by one (the same tags, origins and result)"
    ),
    "impl/slots.py:run_start:slice+1:8 * at : 8 * (at + n)": (
        "the same for descending runs: a slice one byte longer never equals the ids' bytes, so the slow path "
        "indexes them one by one (the same tags, origins and result)"
    ),
    "impl/tree.py:RadixTree.__init__:len+1:len(SLOT)#2": (
        "the protected counters one entry longer: every reader indexes them by SLOT[c] (< len(SLOT)), so the extra "
        "entry is never read or written"
    ),
    "impl/session.py:Sessions.save:and-or:slot.lent_to != req.rid or req.row is None": (
        "made `and`: it differs only for a request whose session is lent to another request while it holds a row, "
        "or one lent its session without a row; a session's second turn is refused at resume while the first "
        "runs (`session N is in use by request M`), and a lent turn holds the session's row until save or release"
    ),
    "impl/session.py:Sessions.save:and-or:req.row is not None and slot.lent_to == req.rid": (
        "an assert right after the check that refuses the opposite: it cannot fail either way"
    ),
    "impl/admission.py:_commit:boundary:need > 0": (
        "made `>=`: at need == 0 it calls alloc_kv(owner, 0), which gives the same empty tensor before any check "
        "that could fail (no failure is injected at 0) and changes nothing"
    ),
    "impl/kvview.py:KVView.take:boundary:int(lo) < pool.base": (
        "take is insert's fast path: made `<=`, a value whose lowest slot is the pool's base declines it (False) "
        "and the insert takes the general checks, which accept the same valid slots and hand them over the same way"
    ),
    "impl/slots.py:SlotPool.claim:slice+1:: 8 * k": (
        "claim is a fast path: a slice one byte longer never equals the 8k bytes, so a scattered claim always puts "
        "the tags back and declines (False), and the caller takes the general checks (the same result)"
    ),
    "impl/slots.py:SlotPool._free_host:boundary:ids[0] >= 0": (
        "made `> 0`: a free of the one slot 0 takes claim's check instead of the one-slot check; both compare the "
        "slot's tag with the owner's and decline the same inputs, so the free is the same"
    ),
    "impl/slots.py:RecentAllocs.add:negate-if:if len(items) > keep:": (
        "the memo's size bound negated: it keeps one result instead of the last 64, and a result not remembered is "
        "proven distinct by the slow path (speed and memory only, every answer the same)"
    ),
    "impl/kvview.py:_repeats:boundary:pool.base <= int(lo)": (
        "made `<`: a value whose lowest slot is the pool's base takes the sort instead of the pool's O(n) check; "
        "both answer whether a slot is named twice, so only the speed changes"
    ),
    "impl/leaks.py:check_leaks:drop-store:count.waiting += 1": (
        "a request that is neither running nor ended holds nothing in any reachable state of the manager (retract "
        "and a refused admission release everything), so no expected owner is counted as waiting and the count "
        "is 0 with the line or without it"
    ),
    "impl/slots.py:SlotPool.alloc_ids:negate-if:if 0 < n <= HANDED_MAX:": (
        "the bound of a speed memo negated (the last alloc's ids and owner, so their free reads no tags back): set "
        "for an empty or a long result instead of a short one; every tag write clears it, so it is as true for any "
        "length, and a short result not remembered has its tags read and compared (the same answer, one read more)"
    ),
    "impl/session.py:<module>:negate-if:if TYPE_CHECKING:": (
        "an import block for annotations only: made at run time it imports modules the package has already "
        "imported (no cycle arises), and with postponed annotations nothing reads the names"
    ),
    "impl/lru.py:LRUList._move_run:and-or:prev is not None and nxt is not None": (
        "an assertion weakened: a stretch of members always has both neighbours (a member, or a sentinel), so "
        "neither form of the assertion fails in a reachable state"
    ),
    "impl/slots.py:SlotPool.claim:negate-if:elif isinstance(idx, np.ndarray) and idx.dtype == I64 and idx.ndim == 1:": (
        "a fast path that declines: claim is given a tensor (its own branch) or the pool's own int64 host ids; "
        "negated, host ids decline (False) and the caller takes the general checks (the same result). A caller's "
        "non-tensor never reaches it: transfer refuses one first (seed 21's finding)"
    ),
    "impl/kvview.py:KVView.take:negate-if:if units is None:": (
        "a fast path that declines: recent pages are proven whole again by whole_pages (the same pages), and pages "
        "that are not recent reach claim as None, which declines (False), so the insert takes the general checks "
        "(the same result)"
    ),
    "impl/slots.py:SlotPool.alloc:drop-store:self._last = (raw, ids, owner)": (
        "a speed memo (the last alloc result, so its free reads no tags back): not set, the free reads the tags "
        "and compares them with the owner's (the same answer, one read more); a stale memo is never taken, since "
        "it names the ids object of an older result, which no later result is"
    ),
    "impl/slots.py:SlotPool.free:drop-store:held = self._held_k = (seen[3], k, seen[3] * k)": (
        "a speed memo (k copies of the owner's tag bytes): without it the bytes compared are the initial empty "
        "ones, which never equal k >= 1 tags, so every free takes the general checked path (the same answer)"
    ),
    "impl/kvview.py:KVView.check_swa_live:and-or:self.swa is not None and idx.numel()": (
        "its one caller runs it only on a cache with a window, which RadixCache builds only over an "
        "SWATokenAllocator (its SWA view is set), so `or` differs only for an empty index, whose translate is "
        "empty and raises nothing"
    ),
    "impl/memory.py:MemoryManager._make_room:boundary:short <= 0": (
        "made `< 0`: at short == 0 it asks the cache to evict 0, which evicts nothing and returns 0 (the count is "
        "checked first), so the manager is the same"
    ),
    "impl/slots.py:SlotPool.alloc:boundary:len(items) > FRESH_KEEP": (
        "a speed memo's size bound made `>=`: it keeps one result fewer, and a result not remembered is proven "
        "distinct by the slow path (the same answer, one scan more)"
    ),
    "impl/slots.py:_tag_bytes:len+1:len(_TAG_RUNS)": (
        "a memo's size bound (runs of tag bytes): cleared one entry sooner, it makes the same bytes again"
    ),
    "impl/slots.py:SlotPool.claim:drop-store:tags[ids] = self._host_positions(k)": (
        "claim is a fast path: without writing the positions, the read-back of k >= 2 tags (all the owner's code) "
        "never equals 0 .. k-1, so a scattered claim always puts the tags back and declines (False), and the caller "
        "takes the general checks (the same result)"
    ),
    "impl/allocators.py:PagedAllocator.pages_of:boundary:int(distinct[0]) >= self.pool.base": (
        "pages_of's fast path made `>`: pages starting at the pool's base decline it and take the general path, "
        "which checks the same range and answers the same sorted distinct pages"
    ),
    "impl/allocators.py:PagedAllocator._host_pages:boundary:int(pages.min()) < self.pool.base": (
        "the host fast path made `<=`: ids whose first page is the pool's base decline it (None) and take the "
        "checked path, which accepts the same whole pages and names the same errors (seed 23)"
    ),
    "impl/tree.py:RadixTree._raise_full:len+1:len(self._nodes)": (
        "the cycle guard of the lock walk up: a path to the root has fewer non-root nodes than node_count(), so "
        "the guard made one looser still fires only on a cycle (one step later: the same undo, the same error)"
    ),
    "impl/memory.py:MemoryManager.chunk:boundary:aligned <= req.prefix_len": (
        "made `<`: a chunk with nothing new computed re-inserts its prefix, which is all the tree's already (no "
        "node made, no duplicate freed), locks the same node and drops the old lock: the same lock counts, rows "
        "and pools, only a fresh handle id (checked by hand on a manager, seed 23)"
    ),
    "impl/session.py:Sessions.unresume:and-or:slot.lent_to != req.rid or req.row is None": (
        "made `and`: differs only for a request of an open session that holds a row it was not lent, or the "
        "borrower without a row; no state of the manager has either (a request holds a row only as the borrower "
        "of its session, or with no session, which `_slot` refuses first), and the probe now makes unresume "
        "with every request outside its domain (seed 23)"
    ),
    "impl/allocators.py:PagedAllocator.alloc:boundary:num_tokens < 0": (
        "made `<= 0`: alloc(0) takes the checked branch, whose check_int accepts 0 (its least value is 0) and "
        "returns it, so the same empty allocation follows (seed 22)"
    ),
    "impl/lru.py:Linked.__init__:len+1:len(SLOT)": (
        "one pointer slot more than there are components: no component indexes it and it stays None, so every "
        "walk, link and detachment check reads the same pointers (seed 22)"
    ),
    "impl/slots.py:RecentAllocs.add:slice+1:-64:": (
        "the memo of recent alloc results keyed by one byte less than find looks up: a long result is never "
        "found and the free takes the checked path (find compares the whole bytes before trusting a hit): a "
        "speed memo, the same answers (seed 22)"
    ),
    "impl/kvview.py:KVView.take:boundary:int(hi) >= pool.size": (
        "the same off-CPU branch of take as its negated test below: a CPU pool returns through claim above it "
        "and an SWA allocator declines first, so no check on a CPU machine reaches it (seed 25; no GPU lent)"
    ),
    "impl/memory.py:MemoryManager.event:len+1:len(self.events)": (
        "the event log is pruned when it holds exactly events_keep events, not only past it: pruning forgets "
        "only events no slot's provenance points at, so every leak report names the same events (seed 25)"
    ),
    "impl/allocators.py:PagedAllocator._host_pages:negate-if:if int(pages.min()) < self.pool.base:": (
        "the host fast path negated: valid pages decline it (the checked path, the same result); pages below the "
        "base go on to the row lookup, where the reserved page's row can match, but claim then finds it not the "
        "caller's (its tag is reserved) and declines, so the checked path refuses it as before (seed 26)"
    ),
    "impl/slots.py:SlotPool.alloc:negate-if:if self._stamped:#2": (
        "the provenance stamp of alloc's off-CPU path: a CPU pool returns through its host stack above it, so no "
        "check on a CPU machine reaches it (seed 26; no GPU lent)"
    ),
    "impl/slots.py:run_start:boundary:base <= lo": (
        "made `<`: a descending run that starts at the pool's base is not proven a run and the caller takes the "
        "gathers of the general path (the same checks, the same answer): a declining fast path (seed 26)"
    ),
    "impl/slots.py:RecentAllocs.add:drop-store:items[raw[-64:]] = (raw, value)": (
        "the memo of recent long alloc results never filled: the free of one takes the checked path (find "
        "compares the whole bytes before trusting a hit): a speed memo, the same answers (seed 26)"
    ),
    "impl/tree.py:common_prefix:boundary:hi <= 0": (
        "made `< 0`: hi is 0 only for an empty node key or a walk at the key's end, and both callers walk only "
        "while pos < len(key) into children, whose keys are never empty: no state reaches it (seed 26)"
    ),
    "impl/radix.py:RadixCache.evict:boundary:n <= 0": (
        "made `< 0`: evict of 0 goes on to the eviction loop, which stops before taking anything (freed 0 >= 0) "
        "and returns 0, as the early return does"
    ),
    "impl/tree.py:RadixTree.prefix:len+1:len(parts)": (
        "the cycle guard of the walk up: a path to the root has at most node_count() - 1 parts (the root is "
        "counted), so the guard made one tighter still fires only on a cycle (one step sooner: the same error)"
    ),
    "impl/slots.py:SlotPool.alloc:drop-store:self._top -= n": (
        "only a pool on a device other than the CPU takes that path (a CPU pool pops through its host stack and "
        "returns before it); no check on a CPU machine reaches it, and this task had no GPU lent"
    ),
    "impl/kvview.py:KVView.take:negate-if:if int(lo) < pool.base or int(hi) >= pool.size:": (
        "take's general branch runs only off the CPU (a CPU pool returns through claim above it, and an SWA "
        "allocator declines first): no check on a CPU machine reaches it, and this task had no GPU lent"
    ),
    "impl/slots.py:SlotPool.release:drop-call:self.owner_tag.index_fill_(0, _long(idx), FREE_TAG)": (
        "the device pools' release (a CPU pool frees through its host mirror above): no check on a CPU machine "
        "reaches it, and this task had no GPU lent"
    ),
    "impl/slots.py:RecentAllocs.find:slice+1:-64:": (
        "a speed memo's lookup key made one byte shorter than the stored key: every lookup misses, and the caller "
        "proves the result distinct by the slow path (the same answer, one scan more)"
    ),
    "impl/slots.py:_tag_bytes:boundary:len(_TAG_BYTES) > 4096": (
        "a memo's size bound (one tag's bytes per code) made `>=`: cleared one entry sooner, it makes the same bytes "
        "again"
    ),
    "impl/slots.py:SlotPool.__init__:slice+1::0": (
        "the initial positions view is only a length: it holds one element instead of none, and every reader asks "
        "for k >= 2 positions (shorter calls return before), which regrows it to an arange before anything is read"
    ),
    "impl/slots.py:RecentAllocs.find:len+1:len(raw)": (
        "a speed memo's lookup: a result exactly at the short bound is looked up among the long ones and missed, "
        "and the caller proves it distinct by the slow path (the same answer, one scan more)"
    ),
    "impl/memory.py:MemoryManager.event:boundary:len(self.events) > keep": (
        "the event log is pruned when it holds exactly events_keep events (as the len+1 mutant above): pruning "
        "forgets only events no slot's provenance points at, so every leak report names the same events (seed 27)"
    ),
    "impl/memory.py:MemoryManager.write_kv:boundary:end > start": (
        "an empty write (start == end) is then refused, typed and changing nothing, when the request holds no row "
        "or start is past its slots: write_kv's documented domain is a request holding a row and start <= end <= "
        "alloc_len, so it refuses only calls outside it (an untyped crash there is caught: the manager's probe "
        "makes every state-changing call on a copy; seed 27)"
    ),
    "impl/req_to_token.py:has_duplicates:negate-if:if n <= 256:": (
        "swaps the two ways of finding a repeated id (a set of a short tensor's values, a sort of a long one's): "
        "each answers exactly whether a value repeats, for every length (seed 27)"
    ),
    "impl/slots.py:SlotPool.claim:and-or:not distinct and int(ids.min()) < 0": (
        "claim is a fast path that may decline: made `or`, it declines every set of slots not already known "
        "distinct, and each caller (free, transfer, the cache's hand-over) then runs the precise checks, with the "
        "same answer (seed 29)"
    ),
    "impl/slots.py:SlotPool.alloc:drop-store:handed[id(out)] = (out, ids, raw, -1)": (
        "a speed memo (alloc results remembered by tensor identity) never stored: a free of the result reads its "
        "ids by the slow path (the same answer, one conversion more; seed 30)"
    ),
    "impl/slots.py:SlotPool.alloc:negate-if:if len(handed) > FRESH_KEEP:#2": (
        "the same memo's bound negated: it forgets its oldest entry while small (often the one just stored), so "
        "frees take the slow path more often (the same answer; seed 30)"
    ),
    "impl/slots.py:RecentAllocs.add:boundary:len(raw) <= _SHORT_BYTES": (
        "a speed memo's length classes: a result exactly at the short bound is stored among the long ones and "
        "missed by find, and the caller proves it distinct by the slow path (as RecentAllocs.find's len+1; seed 30)"
    ),
    "impl/slots.py:_tag_bytes:negate-if:if not 1 < n <= HANDED_MAX:": (
        "swaps which lengths' tag bytes are remembered: every call still returns n copies of the tag's bytes "
        "(memory, not behaviour; at most 64 remembered; seed 30)"
    ),
    "impl/slots.py:run_start:boundary:first < size": (
        "run_start reads only ids an alloc popped off its pool's free stack, which holds ids in [base, size) "
        "(inv_free_stack), so a descending run from first == size never reaches it (seed 28)"
    ),
    "impl/slots.py:SlotPool.alloc:boundary:len(handed) > FRESH_KEEP#2": (
        "a speed memo's size bound (alloc results remembered by identity) made `>=`: one fewer is remembered, and "
        "a free of the forgotten one reads its ids by the slow path (the same answer, one conversion more; seed 27)"
    ),
    "impl/slots.py:_tag_bytes:drop-call:_TAG_BYTES.clear()": (
        "a memo's bound dropped: the table of one tag's bytes per code is never cleared, so it grows with the "
        "codes seen; every lookup still answers the same bytes (memory, not behaviour; seed 27)"
    ),
    # NOTE: seed 31 (2026-11-27)
    'impl/integrity.py:verify:drop-call:check_range("verify", what, "slot", idx, 0, stored.numel())': (
        "every caller checks the slots first (the allocators' verify: check_kv_write, [base, size) of the pool; "
        "the SWA copies: ids its own translate table gives), so the range check here never refuses anything "
        "(calls.NOT_PROBED_FUNCTIONS: a helper on checked values)"
    ),
    "impl/kvview.py:KVView.check_held:negate-if:if live.numel():": (
        "the SWA twin of a live full slot is always held by the full holder's SWA twin owner (alloc, transfer and "
        "free move both halves, free_swa unmaps the twin), so once the full slots' holder check passed, the SWA "
        "holder check cannot refuse: skipping it for live twins changes nothing"
    ),
    'impl/allocators.py:SWATokenAllocator.free:drop-call:self.swa.pool.check_held("free", live, swa_owner(owner))': (
        "seed 32; as check_held's SWA check above: the full slots' holder check passed, so their live SWA twins "
        "are held by that holder's SWA twin owner and the SWA check cannot refuse"
    ),
    "impl/radix.py:RadixCache.match_prefix:drop-store:self._walked = Walk(raw, q, up, bytes(slots))": (
        "a speed memo: without it the only walk remembered is a miss's (an empty path), so the insert of a "
        "matched key starts from the root and walks the key itself (the same tree, one walk more)"
    ),
    "impl/slots.py:SlotPool.check_alloc:boundary:n < 0": (
        "a fast path's guard: n == 0 then goes through check_int(lo=0), which returns it unchanged"
    ),
    "impl/slots.py:SlotPool.alloc:negate-if:if len(handed) > FRESH_KEEP:": (
        "a speed memo (free of a tensor alloc returned needs no conversion): negated, each entry is dropped as it "
        "is added, so every free takes the converting path (the same answer, one conversion more)"
    ),
    "impl/slots.py:run_start:boundary:base <= first": (
        "a proof that ids are a run, for a slice instead of a gather: a run starting at the base is no longer "
        "proven (answer -1, the general path) or, for one id, proven by the descending test: the same slots"
    ),
    # NOTE: seed 33 (2026-11-28)
    "impl/slots.py:SlotPool.alloc:drop-store:items[raw[-64:]] = (raw, None)": (
        "a speed memo (RecentAllocs.add_short inline): a short alloc result not remembered is proven distinct "
        "again by the slow path when it is inserted or freed (the same answer, one scan more)"
    ),
    "impl/slots.py:SlotPool.__init__:drop-store:self._stack = "
    "torch.arange(self.size - 1, base - 1, -1, dtype=torch.int64, device=self.device)": (
        "the free stack of a pool on a device other than the CPU (a CPU pool builds its stack over a host mirror "
        "above): no check on a CPU machine reaches it, and this task had no GPU lent"
    ),
    # NOTE: new family, seed 8 (2026-11-28)
    "impl/arguments.py:not_ids:negate-cmp:t.layout != torch.strided#2": (
        "an error message's words (new family, seed 8): a sparse or meta tensor is refused by the same test, "
        "InvalidArgument, either way; the reason given swaps 'a sparse tensor' and 'a meta or quantized tensor'"
    ),
    "impl/radix.py:RadixCache._check_insert:const+1:1": (
        "an error message's words (new family, seed 8): a page only partly the cache's slots is refused, "
        "SlotConflict, by the same test; the message names the end of the page after it"
    ),
    "impl/session.py:Sessions._slot:const+1:1": (
        "which of two words for one refusal (new family, seed 8): a session id one past the id range is refused "
        "InvalidArgument 'not open' instead of InvalidArgument 'out of range'; the same class, nothing changed"
    ),
    # NOTE: new family, seed 9 (2026-11-28)
    "impl/allocators.py:PagedAllocator.alloc:const+1:0": (
        "a fast path's gate (new family, seed 9): a size of 0 goes through check_int, which returns it unchanged "
        "(0 is in its range); the same pages either way"
    ),
    "impl/kvview.py:KVView.check_fresh:end-index:torch.nonzero(cached)[0]": (
        "an error message's words (new family, seed 9): an insert offering cached slots as new positions is "
        "refused, SlotConflict, by the same test; the message names the last such slot instead of the first"
    ),
    "impl/req_to_token.py:has_duplicates:negate-cmp:torch.unique(ids).numel() != ids.numel()": (
        "off the CPU only (new family, seed 9): the CPU paths answer above; a pool on the meta device cannot "
        "compare values, and this task had no GPU lent"
    ),
    "impl/slots.py:SlotPool.alloc:end-index:seen[0]": (
        "a speed memo (new family, seed 9): the owner is compared with the memo's code, never itself, so every "
        "alloc encodes its owner again (the same code, the same check)"
    ),
    "impl/slots.py:SlotPool.alloc:const+1:0#2": (
        "a speed memo (new family, seed 9): a one-slot alloc result is not remembered for the free's fast path, "
        "which then takes the general path (the same checks, the same answer)"
    ),
    "impl/slots.py:SlotPool._pop_ids:negate-cmp:raw is None": (
        "a speed memo (new family, seed 9): the result is remembered under None (no bytes match it) instead of its "
        "bytes, so the insert or free that meets it proves it distinct again (the same answer, one scan more)"
    ),
    "impl/slots.py:SlotPool.free:end-index:mine[0]": (
        "a speed memo (new family, seed 9): the memo entry's start index is compared with the tensor, never the "
        "tensor itself, so every free takes the general path (the same checks, the same answer)"
    ),
    # NOTE: new family, seed 10 (2026-11-28)
    "impl/radix.py:RadixCache.insert:swap-args:self._kv.take(value, hit, owner, node_tag(ident), raw)": (
        "a fast path's gate whose other side runs the same checks (new family, seed 10): take given the hit count "
        "as its slots answers False, and the insert takes _check_insert, which accepts and refuses what take would"
    ),
    "impl/slots.py:SlotPool._free_host:negate-cmp:ids.dtype != I64": (
        "a fast path's gate (new family, seed 10): int64 ids are sent to the checked path, and ids of another "
        "integer dtype take the host path, which reads them as the same slots and checks them the same way"
    ),
    # NOTE: new family, seed 11 (2026-11-28)
    "impl/slots.py:SlotPool.run_min:min-max:min(value, HANDED_MAX + 1)": (
        "a speed setting (new family, seed 11): allocations up to the larger bound take the inline pop (tags through "
        "a fancy index, not a slice; the result remembered for the free's fast path): the same slots, tags and checks"
    ),
    # NOTE: new family, seed 12 (2026-11-28)
    "impl/kvview.py:KVView.__init__:negate-cmp:self.swa is None": (
        "a fast path's gate (new family, seed 12): a token or paged pool on the CPU takes take's tensor path (a "
        "paged one the general checks), an SWA one still returns False first: the same slots accepted and refused"
    ),
    "impl/slots.py:SlotPool.claim:const+1:1#2": (
        "a fast path's gate (new family, seed 12): host ids (an int64 array) answer False, and the caller runs "
        "as_index and check_held, which accept and refuse what claim would"
    ),
    # NOTE: new family, seed 13 (2026-11-28)
    "impl/arguments.py:check_tokens:min-max:min(ids)#2": (
        "an error message's words (new family, seed 13): a negative token id is refused, InvalidArgument, by the "
        "same test; the message names the largest id instead of the least"
    ),
    "impl/slots.py:SlotPool.__init__:const+1:40#2": (
        "a bound no public call reaches (new family, seed 12): every constructor builds its SlotPool with base 0 "
        "or 1, so a larger cap on base is never met"
    ),
    "impl/slots.py:SlotPool.claim:end-index:last[0]": (
        "a speed memo (new family, seed 12): the last alloc's ids are compared with its owner, never equal, so the "
        "claim reads the tags as for any other ids: the same answer"
    ),
    # NOTE: new family, seed 14 (2026-11-28)
    "impl/radix.py:RadixCache.evict:const+1:0": (
        "a fast path's gate whose other side runs the same checks (new family, seed 14): an evict of 1 also takes "
        "the gate, where check_int returns 1 (not 0), so it goes on to evict exactly as before"
    ),
    # NOTE: new family, seed 15 (2026-11-28)
    "impl/allocators.py:PagedAllocator.alloc:const+1:0#2": (
        "a speed memo (new family, seed 15): a one-page result (page size 1) is not remembered as fresh, so an "
        "insert of it finds its pages through whole_pages and claims them with the distinctness check, which one "
        "page passes: the same answer"
    ),
    "impl/memory.py:MemoryManager.add_request:const+1:1": (
        "the same refusal by another check (new family, seed 15): a session id one past the range passes the range "
        "check and is refused, InvalidArgument, as not open (no session that large can be opened)"
    ),
    "impl/slots.py:SlotPool.alloc:swap-args:self.check_alloc(n, owner)": (
        "off the CPU only (new family, seed 15): the alloc path of a pool whose device is not the CPU (a CPU pool "
        "takes the host path above it); kvledger check runs on the CPU"
    ),
    # NOTE: new family, seed 16 (2026-11-28)
    'impl/lru.py:LRUList.insert_mru:drop-raise:raise AlreadyInList("lru_insert_mru", self.component.value, node.id, '
    '"already in the list (use touch': (
        "the same refusal by another check (new family, seed 16): a member always holds its pointers (the sentinels "
        "bound the list), so _check_unlinked refuses it with AlreadyInList naming the same node"
    ),
    "impl/slots.py:SlotPool.claim:negate-cmp:raw is None": (
        "a speed memo (new family, seed 16): the last alloc's memo is compared with the ids' own bytes where the "
        "caller gave them (the same bytes) and with None where it did not (never equal), so such a claim reads "
        "the tags as for any other ids: the same answer"
    ),
    "impl/slots.py:SlotPool.alloc_ids:const+1:0": (
        "a speed memo (new family, seed 16): a one-slot alloc_ids result is not kept as the last alloc, so its "
        "claim or free reads the tags instead of trusting the memo: the same answer"
    ),
    "impl/slots.py:_long:negate-cmp:idx.dtype == torch.int64": (
        "an intermediate's dtype (new family, seed 16): int64 ids are copied to int64, ids of another dtype kept; "
        "every caller on the CPU passes as_index's int64 ids, and index_select reads int32 ids as the same slots"
    ),
    "impl/kvview.py:KVView.take:swap-args:pool.retag_code(new, dst)": (
        "off the CPU only (new family, seed 17): take's hand-over for a pool on another device (a CPU pool returns "
        "through claim above); kvledger check runs on the CPU"
    ),
    "impl/slots.py:SlotPool.claim:negate-cmp:idx.ndim == 1": (
        "a fast path's gate whose other side runs the same checks (new family, seed 17): every caller passes the "
        "pool's own 1-D int64 host ids (np.frombuffer, a tensor's numpy view); negated they decline (False) and the "
        "caller takes as_index and check_held, the same result (as the negated elif's set-aside above)"
    ),
    "impl/slots.py:SlotPool._pop_ids:const+1:0#2": (
        "a speed path (new family, seed 17): a popped run is tagged through a slice when it starts at slot 0 or "
        "later, through its ids when it starts at 1 or later; the same tags either way, and the run's start is "
        "returned as before (the free's slice reads it)"
    ),
    "impl/slots.py:_tag_bytes:const+1:1#2": (
        "a speed memo (new family, seed 18): a run of two tags is made without being kept in the table of runs "
        "(it is still looked up there first); the same bytes either way"
    ),
    "impl/session.py:common_prefix:swap-args:zip(a, b, strict=False)": (
        "a symmetric walk (new family, seed 19): the common prefix of a and b is that of b and a"
    ),
    "impl/slots.py:<module>:const+1:8": (
        "a speed memo's split (new family, seed 19): results of up to 9 * HANDED_MAX bytes go to the table of short "
        "results instead of 8 * HANDED_MAX; both tables are looked up by the result's last 64 bytes and compared "
        "whole, so what is found is the same"
    ),
    "impl/arguments.py:_what:const+1:40": (
        "an error message's words (new family, seed 19): a refused value's repr is cut at 41 characters, not 40; "
        "the same error class, slot, owner and operation"
    ),
    'impl/lru.py:LRUList.insert_ahead_of:drop-raise:raise AlreadyInList("lru_insert", self.component.value, '
    'node.id, "already in the list")': (
        "the same refusal by another check (new family, seed 19): a member always holds its pointers, so "
        "_check_unlinked refuses it with AlreadyInList naming the same node (as insert_mru's set-aside); with the "
        "anchor not a member either, the anchor's NotInList comes first: a typed refusal of the same call, and "
        "the spec orders neither precondition first"
    ),
    "impl/radix.py:RadixCache.evict:const+1:0#2": (
        "outside the domain only (new family, seed 19): the compare runs for an n that is not exactly an int; "
        "for a bool, a float or a negative one check_int raises first, so only an int subclass reaches it, and "
        "spec.domains.is_amount puts an int subclass outside evict's domain (the reference accepting one, and "
        "evicting, is a discrepancy left in issue 19's notes)"
    ),
    "impl/tree.py:<module>:const+1:8": (
        "a speed threshold (new family, seed 64, 2026-12-01): ``9 * 4096`` bytes for ``8 * 4096``, so keys of 4,096 "
        "to 4,607 ids check their signs by isascii instead of numpy's min: the same answer (as ``const+1:4096``)"
    ),
    "impl/tree.py:<module>:const+1:4096": (
        "a speed threshold (new family, seed 17): keys of exactly 4,096 ids check their signs by isascii instead "
        "of numpy's min: the same answer (as key_bytes' boundary set-aside above)"
    ),
    "impl/slots.py:SlotPool._free_host:negate-cmp:k == 1": (
        "a fast path's test negated (new family, seed 26): one slot then takes claim's check, and k > 1 slots "
        "compare k tags' bytes with one tag's, which never match, so the free takes the checked path (the same "
        "answer; an index out of the pool is caught as IndexError there and declines too)"
    ),
    'impl/memory.py:MemoryManager._path_slots:drop-raise:raise self.cache.revisit("chunk", n)': (
        "a cycle guard dropped (new family, seed 61): the walk up from a node has at most node_count() parts on a "
        "tree without a parent cycle, and only another fault makes one (the tree's own link and unlink keep parents "
        "acyclic), so the guard never fires alone; the checker's walks keep their own cycle detection "
        "(inv_tree_acyclic)"
    ),
}
"""Mutant id -> why it cannot change behaviour (set aside by hand after reading the survivor). Ids name the function,
the operator and the mutated source line, not its line number: an edit elsewhere in the file keeps them."""


@dataclass(frozen=True)
class Mutant:
    """One change: ``file`` (relative to the repo), the node's position, the operator, and where it is by name.

    ``line`` and ``col`` find the node in this version of the file; the ``id`` does not use them (an edit above
    a mutant must not rename it, or a set-aside in ``EQUIVALENT`` would silently stop matching): it is the file,
    the enclosing function's qualified name, the operator and the mutated node's first source line (``before``),
    with ``#k`` when the same text and operator occur ``k`` times in one function.
    """

    file: str
    line: int
    col: int
    op: str
    before: str
    where: str = "<module>"
    nth: int = 1

    @property
    def id(self) -> str:
        again = f"#{self.nth}" if self.nth > 1 else ""
        return f"{self.file}:{self.where}:{self.op}:{self.before}{again}"

    @property
    def at(self) -> str:
        """Where the mutant is in this version of the file (``file:line:col``; changes when lines move)."""
        return f"{self.file}:{self.line}:{self.col}"


@dataclass
class Outcome:
    """What ``kvledger check`` said about one mutant."""

    id: str
    before: str
    status: str  # "killed", "survived", "equivalent", "invalid" (the mutant does not compile), "timeout" (no verdict)
    law: str = ""
    suite: str = ""
    seconds: float = 0.0
    pytest_kills: bool | None = None
    phase: str = ""  # what killed it: the ``kept`` programs replayed first, or the ``search``
    suites_run: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- operators


_NEGATED: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_TYPE_CALLS = {"isinstance", "issubclass", "getattr", "setattr", "hasattr", "cast"}
"""Calls whose swapped arguments only crash at once (a type where a value goes): no bug anyone ships."""


_SYMMETRIC_CALLS = {"min", "max", "torch.equal"}
"""Calls whose first two arguments commute (on the ints and tensors ``impl/`` gives them): their swap is the same
program, an equivalent mutant by construction (four were set aside by hand before, seeds 4, 18, 27, 49; seed 71's
``min(hi, s)`` was a fifth)."""

_MESSAGE_ARGS = {"op", "where", "name", "what"}
"""The names a check passes first only to word its error (the operation, the pool): swapped, only a message's
words change."""


def _magic(k: int) -> bool:
    """A hash's or a mixer's constant (at least 2**16, and neither a power of two nor one less): one more is just
    another hash, written and checked alike, so ``const+1`` leaves it alone."""
    k = abs(k)
    return k >= 1 << 16 and k & (k - 1) != 0 and k & (k + 1) != 0


def _int_of(node: ast.AST) -> int | None:
    """The value of an integer literal (``-1`` included), else ``None`` (``True`` is no integer here)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_of(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _calls_transfer(node: ast.Call) -> bool:
    return isinstance(node.func, ast.Attribute) and node.func.attr == "transfer" and len(node.args) >= 3


class _Sites(ast.NodeVisitor):
    """Every place an operator applies, in source order, skipping ``__repr__`` and ``__str__``."""

    def __init__(self) -> None:
        self.sites: list[tuple[ast.AST, str]] = []
        self.where: dict[int, str] = {}  # id(node) -> the qualified name of the function or class around it
        self._scope: list[str] = []
        self._if_tests: set[int] = set()  # NOTE: an ``if``'s whole test (``negate-if``, not ``negate-cmp``)
        self._consts: set[int] = set()  # NOTE: integer constants in arithmetic or a comparison (``const+1``)
        self._raising = 0

    def _enter(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self._scope.append(node.name)
        self.generic_visit(node)
        self._scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name not in SKIP_FUNCS:
            self._enter(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        if node.name not in SKIP_FUNCS:
            self._enter(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._enter(node)

    def visit(self, node: ast.AST) -> None:
        n = len(self.sites)
        super().visit(node)
        for site, _ in self.sites[n:]:
            self.where.setdefault(id(site), ".".join(self._scope) or "<module>")

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Call):
            self.sites.append((node, "drop-call"))
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if any(isinstance(t, ast.Attribute | ast.Subscript) for t in node.targets):
            self.sites.append((node, "drop-store"))
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.Add | ast.Sub):
            self.sites.append((node, "aug-sign"))
        if isinstance(node.target, ast.Attribute | ast.Subscript):
            self.sites.append((node, "drop-store"))
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if len(node.ops) == 1 and isinstance(node.ops[0], ast.Lt | ast.LtE | ast.Gt | ast.GtE):
            self.sites.append((node, "boundary"))
        if len(node.ops) == 1 and type(node.ops[0]) in _NEGATED and id(node) not in self._if_tests:
            self.sites.append((node, "negate-cmp"))
        self._mark_consts(node.left, *node.comparators)
        self.generic_visit(node)

    def visit_Slice(self, node: ast.Slice) -> None:
        if node.lower is not None or node.upper is not None:
            self.sites.append((node, "slice+1"))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id == "len":
            self.sites.append((node, "len+1"))
        if _calls_transfer(node):
            self.sites.append((node, "swap-owner"))
        elif (
            not self._raising
            and len(node.args) >= 2
            and all(isinstance(a, ast.Name | ast.Attribute) for a in node.args[:2])
            and ast.dump(node.args[0]) != ast.dump(node.args[1])
            and not all(isinstance(a, ast.Name) and a.id in _MESSAGE_ARGS for a in node.args[:2])
            and not (isinstance(node.func, ast.Name) and node.func.id in _TYPE_CALLS)
            and ast.unparse(node.func) not in _SYMMETRIC_CALLS
        ):
            self.sites.append((node, "swap-args"))
        if isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            self.sites.append((node, "min-max"))
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        self.sites.append((node, "negate-if"))
        self._if_tests.add(id(node.test))
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        self.sites.append((node, "drop-raise"))
        self._raising += 1  # NOTE: no ``swap-args`` inside a raise: an error's message arguments
        self.generic_visit(node)
        self._raising -= 1

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _int_of(node.slice) in (0, -1):
            self.sites.append((node, "end-index"))
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        self._mark_consts(node.left, node.right)
        self.generic_visit(node)

    def _mark_consts(self, *sides: ast.expr) -> None:
        for side in sides:
            k = _int_of(side)
            if k is not None and not _magic(k):  # NOTE: ``-k``'s constant is ``k``: made ``-(k + 1)``
                self._consts.add(id(side.operand if isinstance(side, ast.UnaryOp) else side))

    def visit_Constant(self, node: ast.Constant) -> None:
        if id(node) in self._consts:
            self.sites.append((node, "const+1"))

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        self.sites.append((node, "and-or"))
        self.generic_visit(node)


def _apply(node: ast.AST, op: str) -> ast.AST | None:
    """The mutated replacement of ``node`` (``None``: the operator does not fit after all)."""
    one = ast.Constant(1)
    if op in ("drop-call", "drop-store"):
        return ast.Pass()
    if op == "aug-sign" and isinstance(node, ast.AugAssign):
        return ast.AugAssign(node.target, ast.Sub() if isinstance(node.op, ast.Add) else ast.Add(), node.value)
    if op == "boundary" and isinstance(node, ast.Compare):
        swap = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
        return ast.Compare(node.left, [swap[type(node.ops[0])]()], node.comparators)
    if op == "slice+1" and isinstance(node, ast.Slice):
        if node.upper is not None:
            return ast.Slice(node.lower, ast.BinOp(node.upper, ast.Add(), one), node.step)
        assert node.lower is not None
        return ast.Slice(ast.BinOp(node.lower, ast.Add(), one), node.upper, node.step)
    if op == "len+1" and isinstance(node, ast.Call):
        return ast.BinOp(node, ast.Add(), one)
    if op == "swap-owner" and isinstance(node, ast.Call):
        args = list(node.args)
        args[1], args[2] = args[2], args[1]
        return ast.Call(node.func, args, node.keywords)
    if op == "negate-if" and isinstance(node, ast.If):
        return ast.If(ast.UnaryOp(ast.Not(), node.test), node.body, node.orelse)
    if op == "and-or" and isinstance(node, ast.BoolOp):
        return ast.BoolOp(ast.Or() if isinstance(node.op, ast.And) else ast.And(), node.values)
    if op == "drop-raise":
        return ast.Pass()
    if op == "negate-cmp" and isinstance(node, ast.Compare):
        return ast.Compare(node.left, [_NEGATED[type(node.ops[0])]()], node.comparators)
    if op == "swap-args" and isinstance(node, ast.Call):
        args = list(node.args)
        args[0], args[1] = args[1], args[0]
        return ast.Call(node.func, args, node.keywords)
    if op == "end-index" and isinstance(node, ast.Subscript):
        index = ast.UnaryOp(ast.USub(), ast.Constant(1)) if _int_of(node.slice) == 0 else ast.Constant(0)
        return ast.Subscript(node.value, index, node.ctx)
    if op == "const+1" and isinstance(node, ast.Constant) and type(node.value) is int:
        return ast.Constant(node.value + 1)
    if op == "min-max" and isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return ast.Call(ast.Name("max" if node.func.id == "min" else "min", ast.Load()), node.args, node.keywords)
    return None


CLASSIC = frozenset(
    {"drop-call", "drop-store", "boundary", "slice+1", "len+1", "aug-sign", "swap-owner", "negate-if", "and-or"}
)
"""The first nine operators: every sample of issue 19's first thirteen rounds drew from these alone."""
NEW = frozenset({"drop-raise", "negate-cmp", "swap-args", "end-index", "const+1", "min-max"})
"""The second family (fourteenth round): bug kinds the checker was never tuned on."""
OPERATORS = {"classic": CLASSIC, "new": NEW, "all": CLASSIC | NEW}


def _sites(tree: ast.Module) -> list[tuple[ast.AST, str]]:
    finder = _Sites()
    finder.visit(tree)
    return finder.sites


def mutants_of(file: str, source: str) -> Iterator[Mutant]:
    """Every mutant of one module's ``source`` (``file``: its path in the repo), in source order."""
    finder = _Sites()
    finder.visit(ast.parse(source))
    seen: Counter[tuple[str, str, str]] = Counter()
    for node, op in finder.sites:
        seg = ast.get_source_segment(source, node) or ""
        first = seg.strip().splitlines()[0] if seg.strip() else ""
        where = finder.where.get(id(node), "<module>")
        seen[(where, op, first[:100])] += 1
        pos = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        yield Mutant(file, pos[0], pos[1], op, first[:100], where, seen[(where, op, first[:100])])


def mutants(ops: frozenset[str] = CLASSIC) -> Iterator[Mutant]:
    """Every mutant of every ``impl/`` module by the operators ``ops`` (the first nine unless told: a seed's
    sample stays the one recorded), in a stable order."""
    for path in sorted(IMPL.glob("*.py")):
        if path.name in SKIP_FILES:
            continue
        yield from (m for m in mutants_of(f"impl/{path.name}", path.read_text()) if m.op in ops)


def mutated_source(m: Mutant) -> str | None:
    """The module's source with ``m`` applied (``None`` if it no longer applies)."""
    return mutate((ROOT / m.file).read_text(), m)


def mutate(source: str, m: Mutant) -> str | None:
    """``source`` with ``m`` applied, unparsed (``None`` if it does not apply)."""
    tree = ast.parse(source)

    class Swap(ast.NodeTransformer):
        done = False

        def generic_visit(self, node: ast.AST) -> ast.AST:
            if (
                not self.done
                and getattr(node, "lineno", None) == m.line
                and getattr(node, "col_offset", None) == m.col
                and any(n is node and op == m.op for n, op in sites)
            ):
                new = _apply(node, m.op)
                if new is not None:
                    self.done = True
                    return ast.copy_location(new, node)
            return super().generic_visit(node)

    sites = _sites(tree)
    swap = Swap()
    out = swap.visit(tree)
    if not swap.done:
        return None
    return ast.unparse(ast.fix_missing_locations(out))


# ---------------------------------------------------------------- running


def make_view(root: Path, checker: Path = ROOT) -> Path:
    """``root/kvledger``: a private copy of ``spec``, ``impl`` and ``contracts`` (edits to the worktree during a
    run change nothing); ``spec`` and ``contracts`` (the checker) come from ``checker``, ``impl`` from this tree."""
    pkg = root / "kvledger"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Mutation view of kvledger."""\n')
    for name in ("spec", "impl", "contracts"):
        shutil.copytree(
            (ROOT if name == "impl" else checker) / name, pkg / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    return root


def suites_for(m: Mutant) -> list[str]:
    """The suites that run ``m``'s module, the likeliest killer first (a module ``REACH`` does not list yet: every
    suite, so a new module is never skipped)."""
    mod = Path(m.file).stem
    return [s for s in ("pools", "cache", "system") if mod in REACH[s]] or ["pools", "cache", "system"]


DRIVER = """
import json, os, sys
from kvledger.contracts.machines.profiles import PROFILES
profile, suites = sys.argv[1], sys.argv[2:]


def verdict(suite, model, rule, message):
    phase = "kept" if "(kept program:" in message else "search"
    print(json.dumps({"suite": suite, "model": model, "rule": rule, "phase": phase}), flush=True)


if "check" in PROFILES:  # NOTE: a checker whose kvledger check spreads the models over one worker per core
    import multiprocessing
    from kvledger.contracts.machines.campaign import Job, RunSpec, run_campaign
    from kvledger.contracts.machines.suites import SUITES

    jobs = [Job(suite, model, None) for suite in suites for model in SUITES[suite].models]
    workers = max(1, min(len(os.sched_getaffinity(0)), len(jobs)))

    def first(p):
        if p.last is not None and p.last.violation is not None:
            verdict(p.last.suite, p.last.model, p.last.violation.rule, p.last.violation.message)
            for child in multiprocessing.active_children():  # NOTE: the verdict is in: stop the other workers
                child.terminate()
            os._exit(1)

    run_campaign(RunSpec(profile=profile, contracts="on", shrink_for=0.01), jobs, workers, on_progress=first)
else:
    from hypothesis import Phase, settings
    from kvledger.contracts import bindings
    from kvledger.contracts.machines.profiles import register_profiles
    from kvledger.contracts.machines.runner import run_machine
    from kvledger.contracts.machines.suites import SUITES
    try:
        from kvledger.contracts.machines.kept import kept_for
    except ImportError:  # NOTE: a tree before the regression-first phase
        kept_for = lambda suite, model: ()
    register_profiles()
    bindings.install("on")
    base = settings.get_profile("ci" if profile == "check" else profile)
    find = settings(base, phases=[p for p in base.phases if p not in (Phase.shrink, Phase.explain)])
    for suite in suites:
        for model, make in SUITES[suite].models.items():
            kept = kept_for(suite, model)
            extra = {"kept": kept} if kept else {}
            r = run_machine(suite, model, make(), list(SUITES[suite].rules), find, None, **extra)
            if r.violation is not None:
                verdict(suite, model, r.violation.rule, r.violation.message)
                sys.exit(1)
print(json.dumps({"ok": True}))
"""
"""``kvledger check`` as the CLI runs it: the suites' models spread over one worker process per core, each at the
profile's settings (``check``: the ``ci`` settings at 100 examples per model), contracts ``on``, the kept programs
first, then the search; but a violation shrinks for at most 0.01 s and the first one ends the run (the other
workers are stopped): whether a mutant is killed, and by which law, is decided when the first failing example is
found; shrinking only makes the report short. A checker tree from before the ``check`` profile (``--checker``) runs
its models in one process at the ``ci`` profile, without shrinking, as its own ``kvledger check`` did."""


TIMEOUT = "no verdict within --timeout"


def run_check(view: Path, suites: list[str], timeout: float, profile: str = "check") -> tuple[str, str, float, str]:
    """The check of ``suites`` on the view at Hypothesis ``profile`` (``check``: ``kvledger check``'s default): (the
    suite that failed or "", the law, seconds, the phase that killed: ``kept`` programs or the ``search``)."""
    env = {**os.environ, "PYTHONPATH": str(view), "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", DRIVER, profile, *suites],
            env=env,
            cwd=view,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        # NOTE: not a kill: the check's own watchdog reports a step that hangs (law ``hang``) within its budget;
        # this is the tool's budget for every suite together, which a slow machine can use up on a survivor
        return "", TIMEOUT, time.perf_counter() - start, ""
    took = time.perf_counter() - start
    if proc.returncode == 0:
        return "", "", took, ""
    try:
        payload = json.loads(proc.stdout.strip().splitlines()[-1])
        return payload["suite"], payload["rule"], took, payload.get("phase", "search")
    except (json.JSONDecodeError, KeyError, IndexError):
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return suites[0], f"kvledger check crashed: {tail[:100]}", took, ""


def baseline_fails(view: Path, timeout: float, profile: str = "check") -> str:
    """The check of every suite on the unmutated view: "" when it holds, else what failed (a suite and its law, or
    no verdict in time). A checker that fails on the unmutated implementation names a law on every mutant whose
    suites reach the failure first, so its kills would be no measure."""
    suite, law, _, _ = run_check(view, ["pools", "cache", "system"], timeout, profile)
    return f"{suite}: {law}" if suite or law else ""


def pytest_kills(view: Path, timeout: float) -> bool:
    """Whether the project's own ``tests/impl`` fail on the mutant (then it surely changes behaviour)."""
    env = {**os.environ, "PYTHONPATH": str(view), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "tests" / "impl"), "-x", "-q", "-p", "no:cacheprovider"]
    cmd += ["-n", "0"]  # NOTE: one process: mutants may run side by side
    try:
        proc = subprocess.run(cmd, env=env, cwd=view, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return True
    return proc.returncode != 0


def judge(view: Path, m: Mutant, timeout: float, classify: bool, profile: str = "check") -> Outcome:
    """Apply ``m`` in the view, run the suites (at Hypothesis ``profile``) until one fails, restore the module."""
    if m.id in EQUIVALENT:
        return Outcome(m.id, m.before, "equivalent", law=EQUIVALENT[m.id])
    src = mutated_source(m)
    target = view / "kvledger" / m.file
    if src is None:
        return Outcome(m.id, m.before, "invalid")
    original = target.read_text()
    target.write_text(src)
    out = Outcome(m.id, m.before, "survived", suites_run=suites_for(m))
    try:
        suite, law, out.seconds, out.phase = run_check(view, out.suites_run, timeout, profile)
        if suite:
            out.status, out.law, out.suite = "killed", law, suite
        elif law == TIMEOUT:
            out.status, out.law = "timeout", law
        if out.status == "survived" and classify:
            out.pytest_kills = pytest_kills(view, timeout)
    finally:
        target.write_text(original)
    return out


def report(outcomes: list[Outcome]) -> dict[str, object]:
    """Score, kills per law (and the checked laws that killed no mutant), survivors and time per kill."""
    killed = [o for o in outcomes if o.status == "killed"]
    survived = [o for o in outcomes if o.status == "survived"]
    changing = len(killed) + len(survived)
    laws = Counter(o.law for o in killed)
    from kvledger.contracts.machines.suites import SUITES

    checked = sorted({law for suite in SUITES.values() for law in suite.rules})
    return {
        "mutants": len(outcomes),
        "behaviour_changing": changing,
        "killed": len(killed),
        "score": round(len(killed) / changing, 3) if changing else None,
        "equivalent": [o.id for o in outcomes if o.status == "equivalent"],
        "invalid": [o.id for o in outcomes if o.status == "invalid"],
        "timeout": [o.id for o in outcomes if o.status == "timeout"],  # no verdict: neither killed nor survived
        "seconds_per_kill": round(sum(o.seconds for o in killed) / len(killed), 1) if killed else None,
        "kills_per_law": dict(laws.most_common()),
        "kills_by_kept_programs": sum(o.phase == "kept" for o in killed),
        "laws_that_killed_none": [law for law in checked if law not in laws],
        "survivors": [
            {"id": o.id, "code": o.before, "pytest_kills": o.pytest_kills, "suites": o.suites_run} for o in survived
        ],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", type=int, default=30, help="how many mutants to draw (0: all)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the draw")
    ap.add_argument("--only", action="append", default=[], help="run just this mutant id (repeatable)")
    ap.add_argument("--list", action="store_true", help="print every mutant id and stop")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds the check may run on one mutant")
    ap.add_argument("--no-classify", action="store_true", help="do not run pytest tests/impl on survivors")
    ap.add_argument("--out", type=Path, help="write the outcomes and the report here as JSON")
    ap.add_argument(
        "--checker",
        type=Path,
        default=ROOT,
        help="a tree whose spec/ and contracts/ do the checking (default: this one): to score an older or newer "
        "checker on the same mutants of this impl/",
    )
    ap.add_argument(
        "--profile",
        choices=["check", "ci", "thorough"],
        default="check",
        help="the Hypothesis profile of the check: check (kvledger check's default), ci (the checker before issue 19's "
        "thirteenth round) or thorough (for survivors)",
    )
    ap.add_argument(
        "--operators",
        choices=sorted(OPERATORS),
        default="classic",
        help="which operators make the population: classic (the first nine, every recorded seed's), new (the second "
        "family) or all",
    )
    ap.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the check of the unmutated tree (made first: a checker that fails there kills every mutant)",
    )
    args = ap.parse_args(argv)
    population = list(mutants(OPERATORS[args.operators]))
    if args.list:
        for m in population:
            print(m.id, "|", f"{m.at}:{m.op}")
        print(f"{len(population)} mutants", file=sys.stderr)
        return 0
    if args.only:
        only = set(args.only)  # NOTE: an id, or where a mutant is in this version of the file (file:line:col:op)
        chosen = [m for m in population if m.id in only or f"{m.at}:{m.op}" in only]
    elif args.sample:
        chosen = sorted(random.Random(args.seed).sample(population, min(args.sample, len(population))), key=str)
    else:
        chosen = population
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="kvledger-mutation-") as tmp:
        view = make_view(Path(tmp), args.checker)
        if chosen and not args.no_baseline:
            failed = baseline_fails(view, args.timeout, args.profile)
            if failed:
                print(
                    f"the checker fails on the unmutated tree ({failed}): no mutant's kill would mean anything",
                    file=sys.stderr,
                )
                return 2
        for i, m in enumerate(chosen, 1):
            o = judge(view, m, args.timeout, not args.no_classify, args.profile)
            outcomes.append(o)
            tail = (
                f"{o.law} ({o.suite}, {o.phase}, {o.seconds:.0f} s)" if o.status == "killed" else f"{o.seconds:.0f} s"
            )
            print(f"[{i}/{len(chosen)}] {o.status:10s} {m.id}  ({m.at})  {tail}", flush=True)
    summary = report(outcomes)
    print(json.dumps(summary, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps({"outcomes": [asdict(o) for o in outcomes], "report": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
