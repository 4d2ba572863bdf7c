"""Who may call and how much: the caller's identity, the access policy, lease ownership, limits and
overload (the event loop's lag)."""
