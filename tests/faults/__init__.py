"""Fault-injection tests: the field cases F01-F12 (listed in docs/reliability.md)."""
