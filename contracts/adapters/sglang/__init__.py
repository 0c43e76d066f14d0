"""kvledger's adapters for SGLang's radix caches. Importing this package does not import SGLang.

Factories (``config -> CacheAdapter``, for ``kvledger check --adapter package.module:factory``):

* ``kvledger.contracts.adapters.sglang.legacy:radix_cache_factory`` — SGLang 0.5.9 ``RadixCache``;
* ``kvledger.contracts.adapters.sglang.legacy:mamba_radix_cache_factory`` — SGLang 0.5.9 ``MambaRadixCache``;
* ``kvledger.contracts.adapters.sglang.legacy_swa:swa_radix_cache_factory`` — SGLang 0.5.9 ``SWARadixCache``;
* ``kvledger.contracts.adapters.sglang.legacy_cpp:radix_cache_cpp_factory`` — SGLang 0.5.9 ``RadixCacheCpp`` (the C++
  tree);
* ``kvledger.contracts.adapters.sglang.unified:unified_python_factory`` — SGLang 0.5.23 ``UnifiedRadixCache``,
  Python core;
* ``kvledger.contracts.adapters.sglang.unified:unified_rust_factory`` — SGLang 0.5.23 ``UnifiedRadixCache``, Rust core.

The 0.5.23 factories build the tree components the config names: FULL, plus
SWA with a window, plus MAMBA with Mamba (pools in
:mod:`~kvledger.contracts.adapters.sglang.unified_pools`).

:mod:`~kvledger.contracts.adapters.sglang.cpu_import` imports SGLang on CPU;
:mod:`~kvledger.contracts.adapters.sglang.common` holds what the adapters share and
:func:`~kvledger.contracts.adapters.sglang.common.check`, which runs the conformance
machine and lists the laws an adapter cannot express as skipped.
"""
