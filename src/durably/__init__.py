"""durably — durable workflows for asyncio Python."""
