"""API key material: generation, the stored digest, the display prefix and the check.

A key is 32 random bytes, so a plain (unsalted, fast) sha256 digest is enough: there is nothing
to brute-force, unlike a password, and the digest can be the indexed lookup column.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_SCHEME = "lpx-"
PREFIX_CHARS = 8  # of the random part: 48 bits shown, ~208 bits stay secret
MAX_KEY_CHARS = 256  # longer bearer strings are not ours; refuse before hashing them


def new_id(kind: str) -> str:
    """`ten_...` / `key_...`: random, so ids leak neither counts nor creation order."""
    return f"{kind}_{secrets.token_hex(8)}"


def generate_key() -> str:
    return KEY_SCHEME + secrets.token_urlsafe(32)


def key_prefix(key: str) -> str:
    """The non-secret part shown in listings, so people can tell their keys apart."""
    return key[: len(KEY_SCHEME) + PREFIX_CHARS]


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_matches(key: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_key(key).encode("ascii"), stored_hash.encode("ascii"))
