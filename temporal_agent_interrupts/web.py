"""The web front ends as one ASGI app: AG-UI, the approvals API and the inbox page
(``agents_app``), its rules (``Access``, ``Authorize``, ``Forbidden``, ``IdentityFunction``),
the login it sits behind (``LoginExchange``, ``Login``, ``LoginHook``, ``jwt_login``), Slack's
interactivity endpoint (``SlackInteractivity``), and ``serve``.

Public: every name in ``__all__`` is kept stable through 0.1.x (see CHANGELOG.md)::

    from temporal_agent_interrupts.web import LoginExchange, agents_app, serve

A namespace of its own because serving approvers over HTTP is a deployment's choice, not every
team's; the names live in ``client.web`` and ``client.login`` (starlette, uvicorn, PyJWT) and
are read on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporal_agent_interrupts._lazy import exports

if TYPE_CHECKING:
    from temporal_agent_interrupts.client.login import Login, LoginExchange, LoginHook, jwt_login
    from temporal_agent_interrupts.client.mcp_server import agents_mcp_app
    from temporal_agent_interrupts.client.slack import SlackInteractivity
    from temporal_agent_interrupts.client.web import (
        Access,
        Authorize,
        Forbidden,
        IdentityFunction,
        agents_app,
        serve,
    )

_HOME = {
    "agents_app": "client.web",
    "agents_mcp_app": "client.mcp_server",
    "serve": "client.web",
    "Access": "client.web",
    "Authorize": "client.web",
    "Forbidden": "client.web",
    "IdentityFunction": "client.web",
    "LoginExchange": "client.login",
    "Login": "client.login",
    "LoginHook": "client.login",
    "jwt_login": "client.login",
    "SlackInteractivity": "client.slack",
}

__all__ = [
    "Access",
    "Authorize",
    "Forbidden",
    "IdentityFunction",
    "Login",
    "LoginExchange",
    "LoginHook",
    "SlackInteractivity",
    "agents_app",
    "agents_mcp_app",
    "jwt_login",
    "serve",
]

# Hidden from type checkers, which read the imports above (see the package root).
if not TYPE_CHECKING:
    __getattr__, __dir__ = exports(__name__, _HOME)
