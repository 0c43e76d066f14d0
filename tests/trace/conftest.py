"""The trace tests use pytester to run the kvledger pytest plugin in a child suite."""

pytest_plugins = ["pytester"]
