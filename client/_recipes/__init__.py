"""The recipes: locks, semaphore permits and election campaigns, acquired and released the same way.
"""
