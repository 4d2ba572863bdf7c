"""The recipes: locks, semaphore permits and election campaigns, acquired and released the same way.

- :mod:`.holds`: :class:`~.holds.Holds`, the one acquire loop and the one release of every kind of
  hold, and the lease calls (LeaseGrant, LeaseRevoke);
- :mod:`.recipe`: :class:`~.recipe.Recipe`, what a kind of hold plugs into them (its calls, names, words);
- :mod:`.lock`, :mod:`.semaphore`, :mod:`.election`: the recipes (Acquire, AcquirePermit, Campaign and
  their release and withdrawal), with the semaphore's and the election's public objects.
"""
