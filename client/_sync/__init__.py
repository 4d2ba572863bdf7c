"""The synchronous client, :class:`~fencepost.client.LockClient`: the asyncio client on a private loop thread.
"""
