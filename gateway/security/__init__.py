"""Security that spans the gateway's listeners: the server secret, partner key digests, failed-authentication
throttling and the operators' lockout (docs/security.md)."""
