"""The control plane: what any process (client or engine) does to runs: start gates, signals,
operator actions, settling writes, onError names.
"""
