"""A document's exchange: the submission, idempotency, request-reply, receipts and ids."""
