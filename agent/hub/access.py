"""Who may call the API: a host token posts its own host's events and fetches its policy bundle; a reader token reads
the fleet API, /metrics, the policy bundles and the audit trail; an admin token reads as a reader does and alone may
push and withdraw policy bundles.

No token, or one the registry does not know, is 401 with ``WWW-Authenticate: Bearer``; the wrong kind of token is
403. (The dashboard asks the registry itself: it redirects to its login form instead of refusing.)
"""

from __future__ import annotations

from typing import Optional

from agent.hub.responses import HubHTTPError
from agent.hub.tokens import Principal, TokenRegistry

_UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


def principal_of(registry: TokenRegistry, token: Optional[str]) -> Principal:
    """Whom ``token`` belongs to; 401 without a token or for one the registry does not know."""
    if not token:
        raise HubHTTPError(401, "unauthorized", "missing bearer token (Authorization: Bearer <token>)",
                           headers=_UNAUTHORIZED)
    principal = registry.authenticate_token(token)
    if principal is None:
        raise HubHTTPError(401, "unauthorized", "invalid bearer token", headers=_UNAUTHORIZED)
    return principal


def host_of(registry: TokenRegistry, token: Optional[str]) -> Principal:
    """The host a token belongs to; 401 as ``principal_of``, 403 for a reader token."""
    principal = principal_of(registry, token)
    if principal.role != "host":
        raise HubHTTPError(403, "forbidden", f"{_an(principal)} token cannot do this; use the host's token")
    return principal


def reader_of(registry: TokenRegistry, token: Optional[str]) -> Principal:
    """The reader (or admin) a token belongs to; 401 as ``principal_of``, 403 for a host token."""
    principal = principal_of(registry, token)
    if not principal.can_read:
        raise HubHTTPError(403, "forbidden", "a host token cannot read the fleet API; use a reader token")
    return principal


def admin_of(registry: TokenRegistry, token: Optional[str]) -> Principal:
    """The admin a token belongs to; 401 as ``principal_of``, 403 for a reader or host token."""
    principal = principal_of(registry, token)
    if principal.role != "admin":
        raise HubHTTPError(403, "forbidden", f"{_an(principal)} token cannot change policy bundles; "
                                             "use an admin token (gpuguard hub add-admin NAME)")
    return principal


def _an(principal: Principal) -> str:
    return {"host": "a host", "reader": "a reader", "admin": "an admin"}[principal.role]
