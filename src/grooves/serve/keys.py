"""API keys: who is calling. Each key names a tenant; a request without a known key is a 401.

`ApiKeys` maps secret keys to tenant names (read from a TOML file's `[keys]` table, or one key for
one tenant). `KeyCheck` is ASGI middleware: it reads `Authorization: Bearer <key>` before the
body is read, answers 401 in OpenAI's error shape when the key is missing or unknown, and
otherwise runs the request with `caller()` returning the key's tenant. Without keys every request
is the tenant `DEFAULT_TENANT` (a server on a private interface).

The comparison takes the same time whichever key (or part of one) was sent, so a key cannot be
guessed from response times: every configured key is compared in full with `hmac.compare_digest`.
Keys never reach a log, a file or a response; tenant names do (usage records, run folders), so a
tenant name is limited to letters, digits, `_` and `-`.
"""

from __future__ import annotations

import contextvars
import hmac
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from grooves.asgi import bearer, refuse_unauthorized

DEFAULT_TENANT = "default"
"""The tenant of every request to a server without keys, and of the single `--api-key`."""
_TENANT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_caller: contextvars.ContextVar[str] = contextvars.ContextVar("grooves_caller", default=DEFAULT_TENANT)


def caller() -> str:
    """The tenant of the request being handled (`DEFAULT_TENANT` outside `KeyCheck`)."""
    return _caller.get()


class ApiKeys:
    """Secret key -> tenant name."""

    def __init__(self, tenants: Mapping[str, str]):
        """`tenants` maps each tenant name to its key."""
        if not tenants:
            raise ValueError("no API keys: give at least one tenant = key")
        for name, key in tenants.items():
            if not _TENANT.match(name):
                raise ValueError(f"tenant name {name!r}: use 1-64 letters, digits, '_' or '-'")
            if not isinstance(key, str) or len(key) < 8:
                raise ValueError(f"tenant {name!r}: its key must be a string of at least 8 characters")
        keys = list(tenants.values())
        if len(set(keys)) != len(keys):
            raise ValueError("two tenants have the same key; each tenant needs a key of its own")
        self._keys = [(key.encode(), name) for name, key in tenants.items()]

    @classmethod
    def single(cls, key: str) -> ApiKeys:
        """One key, for the tenant `DEFAULT_TENANT`."""
        return cls({DEFAULT_TENANT: key})

    @classmethod
    def from_file(cls, path: str | Path) -> ApiKeys:
        """A TOML file with a `[keys]` table: `alice = "sk-..."`, one line per tenant."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"{path}: no such file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not valid TOML: {exc}") from None
        table = data.get("keys")
        if not isinstance(table, dict) or set(data) != {"keys"}:
            raise ValueError(f'{path}: expected one [keys] table of tenant = "key" lines')
        try:
            return cls(table)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    @property
    def tenants(self) -> list[str]:
        return [name for _, name in self._keys]

    def tenant_of(self, sent: bytes) -> str | None:
        """The tenant whose key is `sent`, or None; compares against every key in full."""
        found = None
        for key, name in self._keys:
            if hmac.compare_digest(sent, key):
                found = name
        return found


class KeyCheck:
    """Answer 401 (`unauthorized(reason)`, a JSON body) to a request without a known `Bearer` key;
    run the others with `caller()` set to their tenant."""

    def __init__(self, app: ASGIApp, *, keys: ApiKeys, unauthorized: Callable[[str], dict[str, Any]]):
        self.app, self.keys, self.unauthorized = app, keys, unauthorized

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header, sent = bearer(scope)
        tenant = self.keys.tenant_of(sent) if sent is not None else None
        if tenant is None:
            reason = "no API key was sent" if not header else "the API key is not one of this server's"
            await refuse_unauthorized(self.unauthorized(reason), scope, receive, send)
            return
        token = _caller.set(tenant)
        try:
            await self.app(scope, receive, send)
        finally:
            _caller.reset(token)
