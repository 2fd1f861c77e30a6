"""The canary draw: which requests of a pool go to its active rollout's candidate version.

Each request gets a bucket in [0, 100) from a hash of its sticky key and the rollout's id, and goes
to the candidate when the bucket is below the rollout's share. So:
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
from routing.proxy.config import Canary

# 64-bit digests mapped to [0, 100).
_SCALE = 100.0 / float(1 << 64)
_SESSION = StickyBy.SESSION.value


def bucket(salt: bytes, key: str) -> float:
    """The bucket of `key` in [0, 100) for the rollout whose salt is `salt` (stable across processes)."""
    digest = hashlib.blake2b(salt + key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") * _SCALE


def draw(canary: Canary, session: str | None, tenant_id: int | None) -> bool:
    """Whether this request goes to the candidate (before asking whether a candidate endpoint is free)."""
    share = canary.share
    if share <= 0.0:
        return False
    if share >= 100.0:
        return True
    if session and canary.sticky_by == _SESSION:
        return bucket(canary.salt, "s" + session) < share
    if tenant_id is not None:
        return bucket(canary.salt, "t" + str(tenant_id)) < share
    return random.random() * 100.0 < share
