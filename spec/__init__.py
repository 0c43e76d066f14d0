"""kvledger.spec: the executable specification (pure Python, no torch)."""
