"""Fault-injection tests: the field cases F01-F12 (see ../shared/cases/README.md)."""
