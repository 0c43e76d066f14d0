"""Found by `kvledger check --suite system --model mamba` while building it (no fault on).

A session request whose resume failed (no Mamba slot left) was rolled back as
if the resume had happened: ``Sessions.unresume`` asserted on a request that
had no row. Fixed by recording in the admission attempt whether the session's
memory was lent (``Attempt.resumed``).
"""

from kvledger.contracts.machines.suites import SUITES


def test_rollback_of_a_session_request_whose_resume_failed() -> None:
    state = SUITES["system"].models["mamba"]()()
    for _ in range(2):
        state.add_request(prompt=0, sid=None, suffix=[], budget=16)
        state.inv_all_laws()
    state.add_request(prompt=0, sid=None, suffix=[], budget=2)
    state.add_request(prompt=0, sid=1, suffix=[], budget=16)
    state.admit(pick=0, budget=16)
    state.admit(pick=0, budget=2)
    state.inv_all_laws()
    state.teardown()
