"""The synchronous client, :class:`~fencepost.client.LockClient`: the asyncio client on a private loop thread.

- :mod:`.loop`: the loop thread and the one blocking helper every sync method uses;
- :mod:`.client`: LockClient and Semaphore, each method its asyncio twin's;
- :mod:`.handle`: LockHandle and SyncLeadership over an asyncio handle;
- :mod:`.observe`: following an election's leader (an iterator, or a thread calling back).
"""
