"""The admin side's errors (RFC 9457 problems, like the partner API's)."""

from __future__ import annotations

from gateway.errors import AuthenticationError, GatewayError

__all__ = [
    "AdminError",
    "CsrfError",
    "ForbiddenError",
    "InvalidRequestError",
    "OperatorAuthError",
    "PartnerConflictError",
    "TooManyAttemptsError",
]


class AdminError(GatewayError):
    """Base of the errors only the admin side answers (never a partner request)."""

    partner_facing = False


class OperatorAuthError(AdminError, AuthenticationError):
    """Raised when an admin request has no valid operator session or operator credentials (a partner's API
    key never counts)."""

    default_detail = (
        "Log in to the console, or authenticate API calls with HTTP Basic: an operator's name and "
        "secret from the operators: section."
    )


class ForbiddenError(AdminError):
    """Raised when an operator's role does not allow the action (a viewer asked for a change)."""

    status = 403
    code = "forbidden"
    default_detail = "Your role does not allow this action; a viewer can look, an operator can act."


class CsrfError(AdminError):
    """Raised when a change requested through a console session lacks its CSRF token (or has another
    session's), or comes from another site."""

    status = 403
    code = "csrf-failed"
    default_detail = (
        "The request did not carry this session's CSRF token (X-CSRF-Token header or csrf form "
        "field); reload the page and try again."
    )


class TooManyAttemptsError(AdminError):
    """Raised when a client address or an operator name failed to log in too often within the window."""

    status = 429
    code = "too-many-login-attempts"
    default_detail = "Too many failed logins; wait and try again."

    def __init__(self, detail: str | None = None, retry_after: int = 60) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class InvalidRequestError(AdminError):
    """Raised when an admin request's parameters or body are malformed or out of range (the detail says
    which and how)."""

    status = 400
    code = "invalid-request"
    default_detail = "The request's parameters are not valid."


class PartnerConflictError(AdminError):
    """Raised when a partner change clashes with what is served: a partner or key id that exists, a key
    revoked already, a certificate pinned already."""

    status = 409
    code = "partner-conflict"
    default_detail = "The change clashes with the partners served now."
