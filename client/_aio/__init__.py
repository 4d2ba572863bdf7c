"""The asyncio client, :class:`~fencepost.client.AsyncLockClient`: the one implementation of the API.

Built in layers: :mod:`.core` (its parts and lifecycle), :mod:`.queries` (the calls that make no
hold), :mod:`.multilocks` (multi-locks), :mod:`.client` (locks, semaphores, elections).
"""
