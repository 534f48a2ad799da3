"""Drift reporting: the event schema, the durable outbox and the sender."""
