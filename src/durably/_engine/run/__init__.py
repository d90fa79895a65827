"""One run's turn in this process: its execution, the ctx primitives, steps, fans, children and
sagas.
"""
