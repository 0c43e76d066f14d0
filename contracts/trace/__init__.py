"""Traces: the JSON-lines format, recording, replay against the spec, and the CLI verbs.

* :mod:`kvledger.contracts.trace.format` — the format (header, events), reading and writing;
  the JSON Schema lies beside it (``schema.json``);
* :mod:`kvledger.contracts.trace.recorder` / :mod:`~kvledger.contracts.trace.system_recorder` —
  record a cache adapter's or the whole memory manager's operations;
* :mod:`kvledger.contracts.trace.replay` / :mod:`~kvledger.contracts.trace.system_replay` —
  replay a trace against the spec and report the first broken law;
* :mod:`kvledger.contracts.trace.cli` — ``kvledger record`` and ``kvledger replay``.
"""
