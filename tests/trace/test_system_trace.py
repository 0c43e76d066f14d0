"""System traces: the whole memory manager recorded and replayed; B2-B4 caught by the general rules."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvledger.contracts.cli import app
from kvledger.contracts.machines.suites import SYSTEM_MODELS
from kvledger.contracts.machines.system import build_manager
from kvledger.contracts.trace.replay import replay, replay_path
from kvledger.contracts.trace.system_recorder import SystemRecorder, record_system_workload
from kvledger.impl import faults
from kvledger.impl.faults import FAULTS
from kvledger.spec.errors import KVLedgerError

runner = CliRunner()


@pytest.mark.parametrize("model", list(SYSTEM_MODELS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_round_trip_holds(model: str, seed: int, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rec = record_system_workload(build_manager(*SYSTEM_MODELS[model]), 300, seed, path)
    assert rec.stopped_by is None
    assert {"admit", "finish", "close_session", "leak_check"} <= set(rec.counts)
    r = replay_path(path)
    assert r.ok, (r.violation, r.error)
    assert r.steps == rec.events


@pytest.mark.parametrize(("fault", "model"), [("B2", "mamba"), ("B3", "mamba"), ("B4", "full"), ("B4", "paged")])
@pytest.mark.parametrize("seed", [0, 3])
def test_fault_fails_replay_with_its_rule(fault: str, model: str, seed: int, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with faults.injected(fault):
        record_system_workload(build_manager(*SYSTEM_MODELS[model]), 300, seed, path, faults=(fault,))
    r = replay_path(path)
    assert r.error is None and r.violation is not None
    assert r.violation.rule in FAULTS[fault].laws
    assert r.violation.history
    assert r.header is not None and r.header.faults == (fault,)


def test_cli_records_memory_manager_faults(tmp_path: Path) -> None:
    bad = tmp_path / "b2.jsonl"
    res = runner.invoke(app, ["record", "--ops", "200", "-o", str(bad), "--fault", "B2"])
    assert res.exit_code == 0, res.output
    assert "memory manager" in res.output
    res = runner.invoke(app, ["replay", str(bad), "--json"])
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert out["violation"]["rule"] == "admission rolls back" and out["violation"]["op"] == "call admit"
    good = tmp_path / "ok.jsonl"
    assert (
        runner.invoke(app, ["record", "--system", "--model", "paged", "--ops", "150", "-o", str(good)]).exit_code == 0
    )
    assert runner.invoke(app, ["replay", str(good)]).exit_code == 0
    assert runner.invoke(app, ["record", "--fault", "B1", "--fault", "B3", "-o", str(bad)]).exit_code == 2
    assert runner.invoke(app, ["record", "--system", "--model", "hybrid", "-o", str(bad)]).exit_code == 2
    # the window kinds are an engine's (--adapter); the reference manager has no sliding-window model
    res = runner.invoke(app, ["record", "--system", "--model", "swa", "-o", str(bad)])
    assert res.exit_code == 2 and "unknown memory-manager model 'swa'" in res.output, res.output
    res = runner.invoke(app, ["record", "--system", "--adapter", "reference", "--model", "swa", "-o", str(bad)])
    assert res.exit_code == 2 and "cannot build the swa model" in res.output, res.output


# ---------------------------------------------------------------- hand-written traces: each rule has teeth

HEADER = json.dumps(
    {
        "kvledger_trace": 1,
        "config": {"page_size": 1},
        "adapter": "hand",
        "version": "1",
        "pools": {"kv": [1, 16], "req_to_token": [0, 2], "mamba": [0, 4]},
    }
)
ADD = '{"op":"call","name":"add_request","req":1,"tokens":[1,2,3]}'
ADMIT_OK = '{"op":"call","name":"admit","req":1,"admitted":true,"prefix_len":0}'
GRANT = [
    '{"op":"own","pool":"kv","slots":[1,2,3],"src":null,"dst":"req:1"}',
    '{"op":"own","pool":"req_to_token","slots":[0],"src":null,"dst":"req:1"}',
    '{"op":"row","row":0,"start":0,"slots":[1,2,3]}',
]
RETURN = [
    '{"op":"own","pool":"kv","slots":[1,2,3],"src":"req:1","dst":null}',
    '{"op":"own","pool":"req_to_token","slots":[0],"src":"req:1","dst":null}',
]


def _run(*events: str) -> tuple[int, str, str]:
    lines = [HEADER]
    for i, e in enumerate(events, 1):
        lines.append(json.dumps({"step": i, **json.loads(e)}))
    r = replay(io.StringIO("\n".join(lines) + "\n"))
    if r.error is not None:
        return 2, "format", str(r.error)
    if r.violation is not None:
        return 1, r.violation.rule, r.violation.message
    return 0, "", ""


def test_a_well_formed_turn_holds() -> None:
    assert _run(ADD, ADMIT_OK, *GRANT, '{"op":"call","name":"finish","req":1}', *RETURN)[0] == 0


def test_a_sessions_first_turn_may_match_the_prefix_cache() -> None:
    """Only a session that saved a turn resumes: its first turn matches the cache like any request (the machine's
    rule); the same match on its second turn, beyond what the first committed, breaks ``resume is append-only``."""
    first = [
        '{"op":"call","name":"open_session","session":1}',
        '{"op":"call","name":"add_request","req":1,"tokens":[1,2,3,4],"session":1}',
        '{"op":"call","name":"admit","req":1,"session":1,"admitted":true,"prefix_len":2}',
    ]
    assert _run(*first) == (0, "", "")
    second = [
        '{"op":"call","name":"finish","req":1,"session":1,"committed_len":1}',
        '{"op":"call","name":"add_request","req":2,"tokens":[1,2,3,4,5],"session":1}',
        '{"op":"call","name":"admit","req":2,"session":1,"admitted":true,"prefix_len":2}',
    ]
    code, rule, message = _run(*first, *second)
    assert (code, rule) == (1, "resume is append-only"), message
    assert "beyond the 1" in message
    # an end that saved the turn (an engine may keep an aborted turn) sets what the next turn may resume
    kept = '{"op":"call","name":"abort","req":1,"session":1,"committed_len":3}'
    resume = '{"op":"call","name":"add_request","req":2,"tokens":[1,2,3,4,5],"session":1}'
    assert _run(*first, kept, resume, second[2].replace('"prefix_len":2', '"prefix_len":3'))[0] == 0
    code, rule, message = _run(*first, kept, resume, second[2].replace('"prefix_len":2', '"prefix_len":4'))
    assert (code, rule) == (1, "resume is append-only"), message
    # an end that left the session nothing (no tokens, no memory) starts it over: its next turn is a first turn
    emptied = '{"op":"call","name":"abort","req":1,"session":1,"committed_len":0}'
    assert _run(*first, emptied, resume, second[2].replace('"prefix_len":2', '"prefix_len":4'))[0] == 0


@pytest.mark.parametrize(
    ("ended", "code", "says"),
    [
        # the engine's step picked no victim: the named request runs on, keeping its memory
        ('"ended":{}', 0, ""),
        # no ``ended``: the named request ended, and must have released everything
        ("", 1, "request 1 after retract"),
        ('"ended":{"retract":[1]}', 1, "request 1 after retract"),
        # the step retracted another request, which kept its memory
        ('"ended":{"retract":[2]}', 1, "request 2 after retract"),
        ('"ended":{"finish":[2]}', 1, "request 2 after finish"),
    ],
)
def test_an_end_call_holds_to_releasing_exactly_the_requests_it_ended(ended: str, code: int, says: str) -> None:
    """An engine's retract is a scheduler step whose policy picks the victims (SGLang's ``retract_decode``): the
    call's ``ended`` names whom it ended, and only those must hold nothing after it."""
    call = '{"op":"call","name":"retract","req":1' + (f",{ended}" if ended else "") + "}"
    got, rule, message = _run(ADD, ADMIT_OK, *GRANT, *ADD2, call)
    assert got == code, message
    if code:
        assert rule == "inv_owners_account" and says in message, message


@pytest.mark.parametrize(
    ("events", "rule", "says"),
    [
        # a finished request that still holds its row
        ([ADD, ADMIT_OK, *GRANT, '{"op":"call","name":"finish","req":1}', RETURN[0]], "inv_owners_account", "still"),
        # the row is cut short while the request still holds the slots it pointed at
        (
            [
                ADD,
                ADMIT_OK,
                *GRANT,
                '{"op":"call","name":"extend","req":1,"n":1}',
                '{"op":"row","row":0,"start":1,"slots":[]}',
            ],
            "inv_owners_account",
            "no row it holds references",
        ),
        # a rejected admission keeps a Mamba slot (B2's shape, with no implementation at all)
        (
            [
                ADD,
                '{"op":"call","name":"admit","req":1,"admitted":false}',
                '{"op":"own","pool":"mamba","slots":[2],"src":null,"dst":"req:1"}',
            ],
            "admission rolls back",
            "keeps",
        ),
        # a rejected admission that keeps a lock handle
        (
            [ADD, '{"op":"call","name":"admit","req":1,"admitted":false,"handles_after":[4]}'],
            "admission rolls back",
            "handles",
        ),
        # a call that raised but changed state
        (
            [
                ADD,
                ADMIT_OK,
                *GRANT,
                '{"op":"call","name":"extend","req":1,"n":1,"error":"OverAllocation"}',
                '{"op":"own","pool":"kv","slots":[4],"src":null,"dst":"req:1"}',
            ],
            "rejected call leaves state unchanged",
            "raised",
        ),
        # a double free
        (
            [ADD, ADMIT_OK, *GRANT, '{"op":"call","name":"abort","req":1}', *RETURN, RETURN[0]],
            "inv_single_owner",
            "DoubleFree",
        ),
        # a slot handed to a request that ended
        (
            [
                ADD,
                ADMIT_OK,
                *GRANT,
                '{"op":"call","name":"abort","req":1}',
                *RETURN,
                '{"op":"call","name":"evict","component":"full","n":1}',
                '{"op":"own","pool":"kv","slots":[5],"src":null,"dst":"req:1"}',
            ],
            "inv_owners_account",
            "ended",
        ),
        # resuming a session beyond what its last turn committed
        (
            [
                '{"op":"call","name":"open_session","session":1}',
                '{"op":"call","name":"add_request","req":1,"tokens":[1,2],"session":1}',
                '{"op":"call","name":"admit","req":1,"session":1,"admitted":true,"prefix_len":0}',
                '{"op":"call","name":"finish","req":1,"session":1,"committed_len":2}',
                '{"op":"call","name":"add_request","req":2,"tokens":[1,2,3,4],"session":1}',
                '{"op":"call","name":"admit","req":2,"session":1,"admitted":true,"prefix_len":3}',
            ],
            "resume is append-only",
            "beyond",
        ),
        # a session closed while it still holds a Mamba state (B3's shape)
        (
            [
                '{"op":"call","name":"open_session","session":1}',
                '{"op":"call","name":"add_request","req":1,"tokens":[1,2],"session":1}',
                '{"op":"call","name":"admit","req":1,"session":1,"admitted":true,"prefix_len":0}',
                '{"op":"own","pool":"mamba","slots":[0],"src":null,"dst":"req:1"}',
                '{"op":"call","name":"finish","req":1,"session":1,"committed_len":2}',
                '{"op":"own","pool":"mamba","slots":[0],"src":"req:1","dst":"session:1"}',
                '{"op":"call","name":"close_session","session":1}',
            ],
            "inv_owners_account",
            "session 1",
        ),
        # a leak checker that reports a leak the ledgers do not show (a false positive)
        (
            [ADD, ADMIT_OK, *GRANT, '{"op":"call","name":"leak_check","ok":false,"leaked":{"kv":[1]}}'],
            "leak checker agrees with the ledgers",
            "ok=False",
        ),
        # a real leak fails the call that made it, before a leak check could miss it (no false negative)
        (
            [
                ADD,
                ADMIT_OK,
                *GRANT,
                '{"op":"call","name":"leak_check","ok":true,"leaked":{}}',
                '{"op":"call","name":"finish","req":1}',
                *RETURN[:1],
            ],
            "inv_owners_account",
            "still",
        ),
    ],
)
def test_each_rule_fails_on_a_broken_trace(events: list[str], rule: str, says: str) -> None:
    code, got_rule, message = _run(*events)
    assert (code, got_rule) == (1, rule), message
    assert says in message


EXTEND = '{"op":"call","name":"extend","req":1,"n":1}'
ADD2 = [
    '{"op":"call","name":"add_request","req":2,"tokens":[4,5]}',
    '{"op":"call","name":"admit","req":2,"admitted":true,"prefix_len":0}',
    '{"op":"own","pool":"kv","slots":[5,6],"src":null,"dst":"req:2"}',
    '{"op":"own","pool":"req_to_token","slots":[1],"src":null,"dst":"req:2"}',
    '{"op":"row","row":1,"start":0,"slots":[5,6]}',
]


@pytest.mark.parametrize(
    ("events", "says"),
    [
        # a row that points at free KV: a use after free waiting for the next kernel
        ([ADD, ADMIT_OK, *GRANT, EXTEND, '{"op":"row","row":0,"start":3,"slots":[4]}'], "which is free"),
        # the KV a row names is freed, and the row is left as it was (no row event in that call)
        ([ADD, ADMIT_OK, *GRANT, EXTEND, '{"op":"own","pool":"kv","slots":[3],"src":"req:1","dst":null}'], "free"),
        # a row that names another request's KV
        ([ADD, ADMIT_OK, *GRANT, *ADD2, EXTEND, '{"op":"row","row":0,"start":3,"slots":[5]}'], "held by req:2"),
        # a row that names slots outside the KV pool (0 is padding, 99 beyond)
        ([ADD, ADMIT_OK, *GRANT, EXTEND, '{"op":"row","row":0,"start":0,"slots":[0,2,3]}'], "outside the KV pool"),
        ([ADD, ADMIT_OK, *GRANT, EXTEND, '{"op":"row","row":0,"start":3,"slots":[99]}'], "outside the KV pool"),
        # a row that names one slot at two positions
        ([ADD, ADMIT_OK, *GRANT, EXTEND, '{"op":"row","row":0,"start":2,"slots":[2]}'], "earlier position"),
        # a row written that nobody holds
        ([ADD, ADMIT_OK, *GRANT, EXTEND, '{"op":"row","row":1,"start":0,"slots":[1]}'], "nobody holds"),
        # a row handed to another owner who does not hold the KV it names
        (
            [
                ADD,
                ADMIT_OK,
                *GRANT,
                '{"op":"call","name":"open_session","session":1}',
                EXTEND,
                '{"op":"own","pool":"req_to_token","slots":[0],"src":"req:1","dst":"session:1"}',
            ],
            "held by req:1",
        ),
    ],
)
def test_rows_name_only_kv_their_owner_holds(events: list[str], says: str) -> None:
    """``inv_rows_held``: checked on every row event and wherever a row or the KV it names changes owner."""
    code, rule, message = _run(*events)
    assert (code, rule) == (1, "inv_rows_held"), message
    assert says in message


def test_rows_law_on_a_paged_pool() -> None:
    """Rows name token slots; the KV ledger counts pages (slot // page_size)."""
    header = json.dumps(
        {
            "kvledger_trace": 1,
            "config": {"page_size": 4},
            "adapter": "hand",
            "version": "1",
            "pools": {"kv": [1, 8], "req_to_token": [0, 2]},
        }
    )
    grant = [
        ADD,
        ADMIT_OK,
        '{"op":"own","pool":"kv","slots":[2],"src":null,"dst":"req:1"}',
        '{"op":"own","pool":"req_to_token","slots":[0],"src":null,"dst":"req:1"}',
    ]

    def run(row: str) -> int:
        lines = [header]
        for i, e in enumerate([*grant, row], 1):
            lines.append(json.dumps({"step": i, **json.loads(e)}))
        r = replay(io.StringIO("\n".join(lines) + "\n"))
        assert r.error is None, r.error
        return r.exit_code

    assert run('{"op":"row","row":0,"start":0,"slots":[8,9,10]}') == 0  # page 2, held
    assert run('{"op":"row","row":0,"start":0,"slots":[8,12]}') == 1  # slot 12 lies in page 3: free


def test_round_trip_reports_what_it_checked(tmp_path: Path) -> None:
    """A recorded trace checks the row law (and says so); a trace with no row event says it could not."""
    path = tmp_path / "t.jsonl"
    record_system_workload(build_manager(*SYSTEM_MODELS["paged"]), 120, 0, path)
    r = replay_path(path)
    assert r.ok and r.checked.get("inv_rows_held", 0) > 0
    assert "inv_rows_held" not in dict(r.unchecked)
    bare = replay(io.StringIO(HEADER + "\n" + json.dumps({"step": 1, **json.loads(ADD)}) + "\n"))
    assert (
        bare.ok and "inv_rows_held" in dict(bare.unchecked) and "no row event" in dict(bare.unchecked)["inv_rows_held"]
    )
    assert "leak checker agrees with the ledgers" in dict(bare.unchecked)


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        (['{"op":"own","pool":"kv","slots":[1],"src":null,"dst":"req:1"}'], "a call before"),
        ([ADD, ADMIT_OK, '{"op":"own","pool":"kv","slots":[1,2,1],"src":null,"dst":"req:1"}'], "each item once"),
        ([ADD, '{"op":"call","name":"admit","req":1,"admitted":false,"handles_after":[4,4]}'], "each item once"),
        ([ADD, '{"op":"call","name":"leak_check","ok":true,"leaked":{"kv":[1,1]}}'], "each item once"),
        ([ADD, '{"op":"call","name":"leak_check","ok":true,"leaked":{"gpu":[1]}}'], "a pool of the header"),
        ([ADD, ADMIT_OK, *GRANT, '{"op":"row","row":0,"start":5,"slots":[1]}'], "within the row's live part"),
        ([ADD, '{"op":"call","name":"admit","req":2,"admitted":true}'], "a request added earlier"),
        ([ADD, ADMIT_OK, '{"op":"own","pool":"gpu","slots":[1],"src":null,"dst":"req:1"}'], "a pool of the header"),
        ([ADD, ADMIT_OK, '{"op":"own","pool":"kv","slots":[99],"src":null,"dst":"req:1"}'], "slots of pool 'kv'"),
        ([ADD, ADMIT_OK, '{"op":"own","pool":"kv","slots":[1],"src":null,"dst":"someone"}'], "an owner"),
        ([ADD, '{"op":"call","name":"teleport","req":1}'], "one of add_request"),
        ([ADD, '{"op":"alloc_kv","req":1,"n":1,"slots":[1]}'], "an event of a system trace"),
        (['{"op":"call","name":"admit","req":1,"session":3,"admitted":true}'], "a request added earlier"),
        ([ADD, '{"op":"call","name":"retract","req":1,"ended":{"retract":[2]}}'], "a request added earlier"),
        ([ADD, '{"op":"call","name":"retract","req":1,"ended":{"chunk":[1]}}'], "finish, retract, abort"),
        ([ADD, '{"op":"call","name":"abort","req":1,"ended":{"abort":[1],"finish":[1]}}'], "each item once"),
        ([ADD, '{"op":"call","name":"abort","req":1,"ended":[1]}'], "finish, retract, abort"),
    ],
)
def test_malformed_system_trace_exits_2(events: list[str], expected: str) -> None:
    code, _, message = _run(*events)
    assert code == 2 and expected in message, message


def test_system_op_in_a_cache_trace_is_a_format_error() -> None:
    header = json.dumps({"kvledger_trace": 1, "config": {}, "adapter": "x", "version": "1"})
    r = replay(io.StringIO(header + "\n" + json.dumps({"step": 1, **json.loads(ADD)}) + "\n"))
    assert r.error is not None and "cache trace" in str(r.error)


def test_failed_call_records_no_change(tmp_path: Path) -> None:
    """An allocation that cannot be met fails before evicting anything (all or nothing), and the trace shows it."""
    mm = build_manager(1, False)
    path = tmp_path / "t.jsonl"
    rec = SystemRecorder(mm, path)
    first = rec.add_request(tuple(range(1, 20)))
    assert rec.admit(first, 64)
    rec.end("chunk", first)  # its prefix goes to the tree, locked by the request
    assert rec.admit(rec.add_request(tuple(range(30, 49))), 64)
    last = rec.add_request(tuple(range(60, 68)))
    assert rec.admit(last, 64)
    assert mm.kv.available_size() == 2 and mm.cache.evictable_size() == 0
    with pytest.raises(KVLedgerError, match="evictable"):
        rec.extend(last, 3, 0)  # more than free + evictable: refused before evicting anything
    rec.close()
    assert replay_path(path).ok
    events = [json.loads(x) for x in path.read_text().splitlines()[1:]]
    failed = next(i for i, e in enumerate(events) if "error" in e)
    assert events[failed + 1 :] == [] or events[failed + 1]["op"] == "call"
