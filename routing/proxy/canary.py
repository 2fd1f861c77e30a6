"""The canary draw: which requests of a pool go to its active rollout's candidate version.

Each request gets a bucket in [0, 100) from a hash (blake2b, 64 bits) of its sticky key and the
rollout's id, and goes to the candidate when the bucket is below the rollout's share. So:
- one sticky key (a session, or a tenant) always lands on the same side while the share stays put,
  and a conversation does not bounce between versions;
- raising the share only moves buckets from the baseline to the candidate (monotone): a session that
  was on the candidate at 5% is still on it at 25%; lowering it (a rollback to 0) moves them back;
- two rollouts (the id is in the hash) draw independent cohorts, so the same tenants are not always
  the first to see a new version.
The key is the pool's session header when the rollout is sticky by session and the request has one,
else the tenant. A request with neither draws at random.
"""

from __future__ import annotations

import hashlib
import random

from routing.models import StickyBy
from routing.proxy.config import Canary, share_threshold

_SESSION = StickyBy.SESSION.value


def digest(salt: bytes, key: str) -> bytes:
    """The 64-bit digest of `key` for the rollout whose salt is `salt` (stable across processes)."""
    return hashlib.blake2b(salt + key.encode(), digest_size=8).digest()


def bucket(salt: bytes, key: str) -> float:
    """Where `key` falls in [0, 100) for that rollout (for people; the draw compares digests)."""
    return int.from_bytes(digest(salt, key), "big") * 100 / (1 << 64)


def on_candidate(salt: bytes, key: str, share: float) -> bool:
    """What `draw` decides for a request whose sticky key is `key` ("s" + session, "t" + tenant id)."""
    return share >= 100.0 or (share > 0.0 and digest(salt, key) < share_threshold(share))


def draw(canary: Canary, session: str | None, tenant_id: int | None) -> bool:
    """Whether this request goes to the candidate (before asking whether a candidate endpoint is free)."""
    share = canary.share
    if share <= 0.0:
        return False
    if share >= 100.0:
        return True
    if session and canary.sticky_by == _SESSION:
        key = "s" + session
    elif tenant_id is not None:
        key = "t" + str(tenant_id)
    else:
        return random.random() * 100.0 < share
    return hashlib.blake2b(canary.salt + key.encode(), digest_size=8).digest() < canary.threshold
