"""The Hypothesis conformance machines and what runs them.

* :mod:`kvledger.contracts.machines.pool` — allocators against ``spec.ledger``;
* :mod:`kvledger.contracts.machines.cache` — any ``CacheAdapter`` against the spec;
* :mod:`kvledger.contracts.machines.system` — the whole memory manager (requests,
  admission, sessions, the leak checker);
* :mod:`kvledger.contracts.machines.suites` — the suites and models ``kvledger check`` runs;
* :mod:`kvledger.contracts.machines.runner` — runs one machine and shrinks what it finds;
* :mod:`kvledger.contracts.machines.regression` — prints a counterexample as a pytest file;
* :mod:`kvledger.contracts.machines.profiles` — the Hypothesis profiles.
"""
