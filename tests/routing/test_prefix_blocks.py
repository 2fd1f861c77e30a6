"""Prefix affinity keys on the prompt's leading full 16-token blocks, with bounded load."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from routing.proxy.scorers import (
    AFFINITY_EPSILON,
    AFFINITY_SLACK,
    PREFIX_BLOCK_TOKENS,
    PREFIX_TOKENS,
    EndpointLoad,
    ScoreRequest,
    choose,
    prefix_key,
    token_prefix_key,
)
from routing.proxy.tokens import count_prompt_tokens, load_tokenizer
from tests.routing.chat_tokenizer import write_tokenizer_dir
from tests.routing.conftest import REPO


def idle(n: int = 4) -> list[EndpointLoad]:
    return [EndpointLoad(endpoint_id=f"e{i}") for i in range(n)]


def home(key: bytes | None, loads: list[EndpointLoad] | None = None) -> int:
    return choose("prefix_affinity", loads or idle(), ScoreRequest(prefix_key=key))[0]


def test_key_covers_exactly_the_leading_full_blocks() -> None:
    ids = list(range(1000, 1000 + 3 * PREFIX_BLOCK_TOKENS + 5))  # three full blocks and five ids
    key = token_prefix_key(ids)
    assert key is not None
    assert token_prefix_key(ids[: 3 * PREFIX_BLOCK_TOKENS]) == key  # the partial block is left out
    assert token_prefix_key(ids[: 3 * PREFIX_BLOCK_TOKENS - 1]) != key  # two blocks are another key
    changed = list(ids)
    changed[3 * PREFIX_BLOCK_TOKENS - 1] += 1  # the last id of the last full block
    assert token_prefix_key(changed) != key
    assert token_prefix_key(ids[: PREFIX_BLOCK_TOKENS - 1]) is None  # no full block, no key


def test_key_is_the_same_in_every_process() -> None:
    # Proxy processes must agree on a prompt's home, whatever their hash seed.
    code = "from routing.proxy.scorers import token_prefix_key as k; print(k(list(range(300))).hex())"
    keys = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert keys == {(token_prefix_key(list(range(300))) or b"").hex()}


def test_shared_long_prefix_lands_on_one_endpoint() -> None:
    shared = list(range(5, 5 + PREFIX_TOKENS + 40))
    keys = {token_prefix_key([*shared, 7, 8, 9 + i]) for i in range(10)}
    assert len(keys) == 1
    assert len({home(k) for k in keys}) == 1


def test_prompts_differing_inside_the_first_blocks_spread() -> None:
    base = list(range(100, 100 + PREFIX_TOKENS))
    homes: Counter[int] = Counter()
    for i in range(60):
        ids = list(base)
        ids[3 + i % 40] = 50_000 + i  # a difference in the first three blocks
        homes[home(token_prefix_key(ids))] += 1
    assert len(homes) == 4 and max(homes.values()) < 30


def test_only_the_first_blocks_matter() -> None:
    ids = list(range(PREFIX_TOKENS + 100))
    changed_late = ids[:PREFIX_TOKENS] + [1] * 100
    assert token_prefix_key(ids) == token_prefix_key(changed_late)
    changed_early = [9, *ids[1:]]
    assert token_prefix_key(ids) != token_prefix_key(changed_early)


def affinity_bound(total: int, engines: int) -> int:
    """What the affinity scorers let an engine hold after `total` requests: 1.25x the average, and at
    least AFFINITY_SLACK above it."""
    average = total / engines
    return max(math.ceil(average * (1 + AFFINITY_EPSILON)), math.ceil(average) + AFFINITY_SLACK)


def test_load_bound_holds_for_a_hot_prefix() -> None:
    key = token_prefix_key(list(range(PREFIX_TOKENS)))
    loads = idle(4)
    first = home(key, loads)
    for _ in range(200):  # one hot prefix, nothing finishes
        i = home(key, loads)
        loads[i].inflight += 1
        assert max(ld.inflight for ld in loads) <= affinity_bound(sum(ld.inflight for ld in loads), 4)
    assert loads[first].inflight == max(ld.inflight for ld in loads)
    # The floor is a constant, so the relative bound takes over as load grows: every engine is used, and
    # none is more than 1.25x the average (+1 for rounding) once the floor no longer decides.
    assert min(ld.inflight for ld in loads) > 0
    assert max(ld.inflight for ld in loads) <= math.ceil(200 / 4 * (1 + AFFINITY_EPSILON)) + 1


def test_a_warm_home_holds_its_slack_above_the_average_before_a_request_moves() -> None:
    key = token_prefix_key(list(range(PREFIX_TOKENS)))
    first = home(key)
    others = [i for i in range(4) if i != first]

    def at(home_load: int) -> list[EndpointLoad]:
        loads = idle(4)
        for i in others:
            loads[i].inflight = 4
        loads[first].inflight = home_load
        return loads

    # The others hold 4 each; with this request counted the average is (12 + h + 1) / 4, which rounds up
    # to 6 for a home holding h = 8 to 11: the home keeps taking requests while it holds fewer than
    # 6 + AFFINITY_SLACK = 10, where 1.25x the average alone would have moved them from h = 7 (under 8).
    assert AFFINITY_SLACK == 4
    assert home(key, at(9)) == first
    assert home(key, at(10)) != first
    assert home(key, at(12)) != first


def test_counting_hands_the_leading_ids_to_routing(tmp_path: Path) -> None:
    tok = load_tokenizer(str(write_tokenizer_dir(tmp_path)))
    assert tok is not None
    system = "the quick brown fox jumps over the lazy dog " * 40  # 360 tokens, more than 16 blocks
    a = count_prompt_tokens([system, "alpha bravo"], tok, ["system", "user"])
    b = count_prompt_tokens([system, "charlie"], tok, ["system", "user"])
    assert a.leading_ids is not None and len(a.leading_ids) == PREFIX_TOKENS
    assert a.leading_ids == tok.tokenizer.encode(system, add_special_tokens=False).ids[:PREFIX_TOKENS]
    assert token_prefix_key(a.leading_ids) == token_prefix_key(b.leading_ids or [])
    # Short messages: the ids run on across messages.
    c = count_prompt_tokens(["the fox", "lazy dog"], tok, ["user", "user"])
    assert c.leading_ids == tok.tokenizer.encode("the fox lazy dog", add_special_tokens=False).ids


def test_without_a_tokenizer_character_blocks_stand_in() -> None:
    assert count_prompt_tokens(["x" * 400], None).leading_ids is None
    shared = "You are a helpful assistant. " * 40
    assert prefix_key(shared + "question one") == prefix_key(shared + "another question")
    assert prefix_key("y" + shared) != prefix_key(shared)
    assert prefix_key("too short") is None
