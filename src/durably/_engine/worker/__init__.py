"""The worker runtime of one process: dispatching, driving and polling runs, deliveries, fleet
links.
"""
