"""Fencepost client: lock clients, lease handles and the fencepost command line."""
