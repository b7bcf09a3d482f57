"""Outbound delivery: documents pushed to partners' endpoints, with retries, a dead-letter lane and a timeline."""
