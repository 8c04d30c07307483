"""The identity function the MCP-served agent tests give ``agents_mcp_app``, in a module of its
own so a second process of the app (``tests/mcp_served_app.py``) uses the same one."""

from __future__ import annotations

from starlette.requests import Request


def bearer_name(request: Request) -> str | None:
    """The name after ``Bearer``. An application verifies a login here; what the tests show is
    that the identity comes from the request's Authorization header, never from the body."""
    scheme, _, name = request.headers.get("authorization", "").partition(" ")
    return (name.strip() or None) if scheme.lower() == "bearer" else None
