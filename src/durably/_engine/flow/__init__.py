"""Flow control: queues, step concurrency limits, start quotas and singletons."""
