"""The trust package's errors (each a :class:`gateway.errors.GatewayError`)."""

from __future__ import annotations

from gateway.errors import AuthenticationError

__all__ = ["KeyExpiredError"]


class KeyExpiredError(AuthenticationError):
    """Raised when a valid API key is used outside its ``not_before`` / ``not_after`` window. The detail says
    that the key is expired or not yet valid, never whose it is."""

    code = "key-expired"
    default_detail = (
        "This API key is outside its validity period (expired or not yet valid); use the current "
        "key agreed for your partner account."
    )
