"""kvledger.contracts: binds any implementation to the spec."""
