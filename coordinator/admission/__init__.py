"""Who may call and how much: the caller's identity, the access policy, lease ownership, limits,
overload (the event loop's lag), capacity and the drain before a stop."""
