"""Adapters: the two protocols an implementation is checked through, and the implementations of them.

* :mod:`kvledger.contracts.adapters.protocol` — ``CacheAdapter`` (radix-cache
  operations), the aliases ``kvledger check --adapter`` accepts, capabilities
  and the rules each one gates;
* :mod:`kvledger.contracts.adapters.reference` — kvledger's own radix cache as
  the first ``CacheAdapter``;
* :mod:`kvledger.contracts.adapters.sglang` — SGLang's own code, imported on the CPU.
"""
