"""vLLM's v1 KV cache manager as a kvledger adapter (CPU import helper and the request-level adapter)."""
