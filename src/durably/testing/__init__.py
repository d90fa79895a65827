"""Testing aids for programs built on durably."""
