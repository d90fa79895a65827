"""Integrations with other projects, each behind its own extra (`durably.contrib.opentelemetry`
needs `durably[otel]`). Nothing here is imported by `import durably`."""
