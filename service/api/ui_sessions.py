"""The pages' sign-in cookie: a signed reference to a token, never the token itself.

A cookie lives in a browser (its storage, its devtools, a profile backup); the bearer token it came from
authorises the JSON API and every write. So the cookie holds the token's sha256 (what the database
already keeps), an expiry the server enforces, and an HMAC over both. Whoever copies the cookie can read
the pages until it expires or the token is revoked (each request still looks the token up), but cannot
call the API, and a copy of the database's digests cannot forge one. The HMAC key is derived from the
attestation signing key, the one secret every replica already shares.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable

from service.attestations.keys import active_signing_key
from service.auth import digest
from service.config import Settings

VERSION = "v1"
SESSION_SECONDS = 8 * 3600


class UiSessions:
    """Issues and reads cookies; the key is derived on first use (a missing key fails the sign-in, not
    the server's start)."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self._settings = settings
        self._clock = clock
        self._key: bytes | None = None

    def _mac(self, body: str) -> str:
        if self._key is None:
            private = active_signing_key(self._settings).private_pem()
            self._key = hashlib.sha256(b"convgate ui session key\0" + private).digest()
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()

    def issue(self, secret: str) -> str:
        body = f"{VERSION}.{digest(secret)}.{int(self._clock()) + SESSION_SECONDS}"
        return f"{body}.{self._mac(body)}"

    def token_sha256(self, cookie: str) -> str | None:
        """The token digest a cookie vouches for, or None (malformed, forged or expired)."""
        parts = cookie.split(".")
        if len(parts) != 4 or parts[0] != VERSION or not parts[2].isdigit():
            return None
        body = ".".join(parts[:3])
        if not hmac.compare_digest(parts[3], self._mac(body)) or int(parts[2]) < self._clock():
            return None
        return parts[1]
