"""The asyncio client, :class:`~fencepost.client.AsyncLockClient`: the one implementation of the API.
"""
