"""The OAuth provider of one person's connection to a per_person MCP server (core/mcp_servers/oauth.py keeps its
tokens): a subclass of the `mcp` SDK's OAuthClientProvider, so in a module of its own, imported only when such a
connection is opened (starting the bot imports no SDK)."""

from __future__ import annotations

import time

from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import AuthorizationCodeResult

from core.mcp_servers.config import ServerConfig
from core.mcp_servers.oauth import NeedsAuthorization, TokenStore, metadata
from core.storage.db import Pool
from core.timeutil import Clock


class PersonAuth(OAuthClientProvider):
    """The OAuth of one person's connection: their stored tokens (refreshed by the SDK); a server that wants a new
    authorization is refused (`refused` set): that takes the person, with /mcp connect."""

    def __init__(self, pool: Pool, config: ServerConfig, account_id: int, clock: Clock, callback_url: str) -> None:
        """The provider for `account_id` at `config`'s server."""
        self.refused = False
        self._store = TokenStore(pool, config.name, account_id, clock)
        super().__init__(
            config.url or "",
            metadata(callback_url),
            self._store,
            redirect_handler=self._refuse,
            callback_handler=self._none,
        )

    async def _initialize(self) -> None:
        """The SDK's loading of the stored tokens, and when the access token expires (the SDK keeps no expiry of
        stored tokens): one that expired while unused is refreshed first, not sent to be refused."""
        await super()._initialize()
        if self._store.seconds_left is not None:
            self.context.token_expiry_time = time.time() + self._store.seconds_left

    async def _refuse(self, url: str) -> None:
        """No authorization in the middle of a turn."""
        self.refused = True
        raise NeedsAuthorization("the account needs connecting again (/mcp connect)")

    async def _none(self) -> AuthorizationCodeResult:
        """Never reached (the redirect is refused first)."""
        raise NeedsAuthorization("the account needs connecting again (/mcp connect)")
