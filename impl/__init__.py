"""kvledger.impl: the torch-backed reference memory manager."""
