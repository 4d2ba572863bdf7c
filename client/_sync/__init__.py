"""The synchronous client, :class:`~fencepost.client.LockClient`: the asyncio client on a loop thread of its own.

- :mod:`.shared`: the one event loop thread every sync client of the process runs on, and a call handed to it;
- :mod:`.loop`: a client on that thread, and the one blocking helper every sync method uses;
- :mod:`.client`: LockClient and Semaphore, each method its asyncio twin's;
- :mod:`.handle`: LockHandle and SyncLeadership over an asyncio handle;
- :mod:`.observe`: following an election's leader (an iterator, or a thread calling back).
"""
