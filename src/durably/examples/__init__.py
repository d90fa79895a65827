"""Bundled examples. `durably demo` runs `durably.examples.orders`."""
