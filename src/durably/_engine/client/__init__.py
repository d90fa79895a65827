"""`durably.Client`: start, signal, cancel, retry and read runs from any process, without the
worker runtime.
"""
