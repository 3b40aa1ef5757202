"""Bearer tokens with roles. Secrets are random (256 bits) and stored only as sha256 digests."""

from __future__ import annotations

import hashlib
import secrets
from enum import StrEnum

TOKEN_PREFIX = "cg_"


class Role(StrEnum):
    SUBMITTER = "submitter"
    POLICY_AUTHOR = "policy-author"  # a submitter who may also send inline policies (marked "inline")
    OPERATOR = "operator"
    AUDITOR = "auditor"
    ADMIN = "admin"


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    """High-entropy random secrets need no slow hash: sha256 makes the stored value useless to a thief."""
    return hashlib.sha256(secret.encode()).hexdigest()


# Who may call what. Submitters (and policy authors) see and cancel only their own verifications
# (enforced in the endpoints).
OWN_ONLY = frozenset({Role.SUBMITTER, Role.POLICY_AUTHOR})
READ_ANY = frozenset({Role.OPERATOR, Role.AUDITOR, Role.ADMIN})
SUBMIT = frozenset({Role.SUBMITTER, Role.POLICY_AUTHOR, Role.ADMIN})
READ_OWN_OR_ANY = READ_ANY | OWN_ONLY
CANCEL = frozenset({Role.SUBMITTER, Role.POLICY_AUTHOR, Role.OPERATOR, Role.ADMIN})
OPERATE = frozenset({Role.OPERATOR, Role.ADMIN})
AUDIT = frozenset({Role.AUDITOR, Role.ADMIN})  # the access log
# Thresholds are the operator's: anything but a configured policy needs one of these roles, and the
# verdict is marked "inline" wherever it is shown.
AUTHOR_POLICIES = frozenset({Role.POLICY_AUTHOR, Role.ADMIN})
