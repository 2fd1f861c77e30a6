"""The simulated engine core: vLLM V1's continuous-batching scheduler over a paged KV cache, in model time.

One asyncio task runs engine steps back to back. Each step schedules, within max_num_batched_tokens and
max_num_seqs, one token for every decoding sequence and prefill chunks for the others (running ones
first, then waiting ones in FCFS order); it sleeps for the step time that profiles.step_time_s models
(divided by --sim-time-scale) and then applies the step: KV computed, one token sampled for every
sequence whose tokens are all computed, finished sequences freed.

KV memory is a pool of blocks of block_size tokens. A sequence holds ceil(tokens/block_size) blocks;
when a running sequence needs a block and none is free, the most recently admitted running sequence
is preempted (its blocks freed, its computed tokens dropped, recomputed later), as vLLM V1 does.
With prefix caching, full prompt blocks are content-addressed by a chained hash, stay cached after
they are freed until the block is reused (LRU), and a new request starting with the same blocks takes
them instead of recomputing them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_sim import model
from vllm_sim.metrics import EngineMetrics
from vllm_sim.profiles import EngineShape, pipeline_occupancy, step_time_s


@dataclass(eq=False)
class Sequence:
    """One generated sequence (one choice of one request) as the scheduler sees it."""

    prompt_ids: list[int]
    max_tokens: int
    key: int  # (prompt, seed) of the request: the sampler's randomness
    mean_len: int  # the model ends a sequence after a token with probability 1/mean_len (model.ends_here)
    drift: float
    greedy: bool = False  # temperature 0: always the most likely token
    keep_contexts: bool = False  # record out_contexts (the request asked for logprobs)
    ignore_eos: bool = False
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    notify: Callable[[], None] | None = None
    stream: bool = True  # notify on every token (streaming) or only when finished
    # logit_bias / allowed_token_ids as output-vocabulary indices (model.constrained_token)
    bias: dict[int, float] | None = None
    allowed: frozenset[int] | None = None
    # Beam search: the first token is the model's choice of this rank (0: its best), the rest greedy, so
    # the n beams of a request differ and each is a likely continuation.
    first_rank: int = 0
    # scheduler state
    num_tokens: int = 0
    num_computed: int = 0
    num_cached_prompt_tokens: int = 0  # prefix-cache hit of the first admission (usage details)
    recomputed_last: bool = False  # the whole prompt was cached; its last token was computed again
    context: int = 0  # model context hash of prompt + output so far (model.extend_context)
    blocks: list[int] = field(default_factory=list)
    hashes_registered: int = 0
    block_hashes: list[int] = field(default_factory=list)
    # VOCAB indices of the generated tokens (model.FOREIGN + token id for a token outside them)
    out: list[int] = field(default_factory=list)
    out_contexts: list[int] = field(default_factory=list)  # context hash before each token (keep_contexts)
    finish_reason: str | None = None
    stop_reason: str | None = None
    tail: str = ""
    # times (wall, loop clock)
    arrival: float = 0.0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float = 0.0
    done_at: float | None = None

    def __post_init__(self) -> None:
        self.num_tokens = len(self.prompt_ids)
        self.context = model.context_hash(self.prompt_ids)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class BlockPool:
    """Fixed pool of KV blocks with reference counts and an LRU queue of free (evictable) blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.free: collections.OrderedDict[int, None] = collections.OrderedDict(
            (b, None) for b in range(num_blocks)
        )
        self.cached: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b, _unused = self.free.popitem(last=False)
            h = self.block_hash[b]
            if h is not None:
                # Evicting a cached block: its content is gone.
                if self.cached.get(h) == b:
                    del self.cached[h]
                self.block_hash[b] = None
            self.ref[b] = 1
            out.append(b)
        return out

    def touch(self, b: int) -> None:
        """Take one more reference to a cached block (a prefix-cache hit)."""
        if self.ref[b] == 0:
            del self.free[b]
        self.ref[b] += 1

    def release(self, blocks: list[int]) -> None:
        # Tail blocks go to the free queue first so they are evicted before the shared head blocks.
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None

    def register(self, b: int, h: int) -> None:
        if h not in self.cached:
            self.cached[h] = b
            self.block_hash[b] = h

    def reset_cache(self) -> None:
        self.cached.clear()
        for b in range(self.num_blocks):
            self.block_hash[b] = None


@dataclass
class StepPlan:
    """What one engine step computes."""

    items: list[tuple[Sequence, int]]
    num_tokens: int
    context_tokens: int
    attention_pairs: float


class SimEngine:
    """The scheduler loop and KV cache of one simulated vLLM engine."""

    def __init__(
        self,
        shape: EngineShape,
        metrics: EngineMetrics,
        *,
        enable_prefix_caching: bool = True,
        time_scale: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.shape = shape
        self.metrics = metrics
        self.enable_prefix_caching = enable_prefix_caching
        self.time_scale = time_scale
        # Modelled step times are multiplied by this (POST /sim/slowdown): the hardware got slower (a
        # throttled GPU, a noisy neighbour) while the engine runs, for tests of what learns its speed.
        self.slowdown = 1.0
        self.pool = BlockPool(shape.num_gpu_blocks)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.hung = False
        self.dead = False  # the engine core died (EngineDeadError): /health answers 503
        self.asleep: set[str] = set()  # parts put to sleep by /sleep: "weights", "kv_cache"
        self.sleep_level = 0  # the level of the last /sleep while any part still sleeps
        self.num_preemptions = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # (wall end time, wall busy seconds, tokens in step) of recent steps, for the modelled GPU's
        # utilisation and power.
        self.recent_steps: collections.deque[tuple[float, float, int]] = collections.deque()
        self.total_steps = 0
        # Wall seconds the engine fell behind its modelled clock (the CPU could not keep up).
        self.lost_wall_s = 0.0
        self.busy_model_s = 0.0

    # lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # requests ----------------------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        seq.arrival = self.clock()
        if self.enable_prefix_caching:
            seq.block_hashes = self._block_hashes(seq.prompt_ids)
        self.waiting.append(seq)
        self._wake.set()

    def abort(self, seq: Sequence) -> None:
        """Stop a sequence whose client went away; frees its KV blocks."""
        if seq.finished:
            return
        self._finish(seq, "abort", self.clock())
        if seq in self.running:
            self.running.remove(seq)
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(seq)

    @property
    def sleeping(self) -> bool:
        return bool(self.asleep)

    def abort_all(self, reason: str = "abort") -> None:
        now = self.clock()
        for seq in [*self.running, *self.waiting]:
            if not seq.finished:
                self._finish(seq, reason, now)
        self.running = []
        self.waiting.clear()

    def sleep(self, level: int, *, abort: bool = True) -> None:
        """vLLM's sleep mode: the engine stops scheduling (new requests wait in the queue until
        /wake_up); mode "abort" ends the requests in flight. Level 0 only pauses; levels 1 and 2 both
        discard the KV cache's contents (prefix cache included): level 1 keeps the weights in host
        memory, level 2 drops them too (vLLM docs/features/sleep_mode.md, "Sleep levels")."""
        if abort:
            self.abort_all()
        self.sleep_level = max(0, level)
        self.asleep = {"weights", "kv_cache"} if level >= 1 else {"scheduling"}
        if level >= 1:
            self.pool.reset_cache()

    def waking(self, tags: list[str] | None) -> frozenset[str]:
        """The parts a /wake_up with `tags` restores (all sleeping ones when none are given)."""
        return frozenset(self.asleep & set(tags)) if tags else frozenset(self.asleep)

    def wake_up(self, tags: list[str] | None) -> None:
        self.asleep -= set(tags) if tags else set(self.asleep)
        # Scheduling resumes once the memory is back (is_sleeping stays true until then).
        if self.asleep == {"scheduling"}:
            self.asleep = set()
        if not self.asleep:
            self.sleep_level = 0
        self._wake.set()

    def kill(self) -> None:
        """The engine core dies: its loop stops and every request in flight ends with an error."""
        self.dead = True
        if self._task is not None:
            self._task.cancel()
        self.abort_all("error")

    def _block_hashes(self, ids: list[int]) -> list[int]:
        bs = self.shape.block_size
        out = []
        parent = 0
        for i in range(0, len(ids) - bs + 1, bs):
            parent = hash((parent, tuple(ids[i : i + bs])))
            out.append(parent)
        return out

    # the loop ----------------------------------------------------------------------------------------

    async def _run(self) -> None:
        clock = self.clock
        next_start = clock()
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                self._update_gauges()
                await self._wake.wait()
                next_start = clock()
            if self.hung:  # checked after the wake-up too: the request that hangs it must not get a step
                await asyncio.Event().wait()
            if self.asleep:
                # Sleeping: requests queue up and wait for /wake_up.
                self._wake.clear()
                await self._wake.wait()
                next_start = clock()
                continue
            plan, dt = self.plan_step()
            if not plan.items:
                # Nothing fits (a lone sequence larger than the whole cache); wait for a change.
                self._wake.clear()
                await self._wake.wait()
                next_start = clock()
                continue
            now = clock()
            # Steps are laid end to end on a virtual clock, so timer granularity does not accumulate;
            # if the process falls far behind (CPU overloaded), the clock restarts from now and the
            # lost time is counted in lost_wall_s.
            if now - next_start > 0.05:
                self.lost_wall_s += now - next_start
                next_start = now
            end = next_start + dt / self.time_scale
            delay = end - now
            if delay > 0:
                await asyncio.sleep(delay)
            next_start = end
            # Stamp tokens with the step's modelled end, not the wall time the loop woke up: timer jitter
            # and CPU contention would otherwise show up in the latency metrics, multiplied by the
            # time scale.
            self.finish_step(plan, dt, end)

    def plan_step(self) -> tuple[StepPlan, float]:
        """Schedule the next step; returns the plan and its modelled duration in seconds."""
        plan = self._schedule()
        self._update_gauges()
        dt = step_time_s(
            self.shape,
            num_tokens=plan.num_tokens,
            num_seqs=len(plan.items),
            context_tokens=plan.context_tokens,
            attention_pairs=plan.attention_pairs,
        )
        return plan, dt * self.slowdown

    def finish_step(self, plan: StepPlan, dt: float, now: float) -> None:
        """Apply a step that ended at `now` (clock time) after `dt` modelled seconds."""
        # With pipeline stages a GPU computes only its share of the step (the rest is bubble).
        occupancy = pipeline_occupancy(self.shape, len(plan.items))
        wall = dt / self.time_scale * occupancy
        self.total_steps += 1
        self.busy_model_s += dt * occupancy
        self.recent_steps.append((now, wall, plan.num_tokens))
        while self.recent_steps and self.recent_steps[0][0] < now - 1.0:
            self.recent_steps.popleft()
        self._apply(plan, now)

    def _schedule(self) -> StepPlan:
        shape = self.shape
        bs = shape.block_size
        pool = self.pool
        budget = shape.max_num_batched_tokens
        items: list[tuple[Sequence, int]] = []
        context = 0
        pairs = 0.0
        preempted = False
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            need = -(-(seq.num_computed + n) // bs) - len(seq.blocks)
            self_preempted = False
            while need > pool.num_free:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    self_preempted = True
                    break
            if self_preempted:
                break
            if need > 0:
                seq.blocks.extend(pool.allocate(need))
            items.append((seq, n))
            budget -= n
            context += seq.num_computed + n
            pairs += n * (seq.num_computed + n / 2)
            i += 1
        if not preempted:
            waiting = self.waiting
            while waiting and budget > 0 and len(running) < shape.max_num_seqs:
                seq = waiting[0]
                hit_blocks: list[int] = []
                if self.enable_prefix_caching and seq.num_computed == 0:
                    for h in seq.block_hashes:
                        b = pool.cached.get(h)
                        if b is None:
                            break
                        hit_blocks.append(b)
                hit_tokens = len(hit_blocks) * bs
                recompute_last = hit_tokens >= seq.num_tokens
                if recompute_last:
                    # vLLM recomputes the last token so that the step produces logits.
                    hit_tokens = seq.num_tokens - 1
                if self.enable_prefix_caching:
                    # Counted on every admission attempt, also one that then fails for lack of blocks
                    # (vLLM V1 looks the prefix up again each step a request stays waiting).
                    self.metrics.prefix_queries.inc(seq.num_tokens)
                    self.metrics.prefix_hits.inc(hit_tokens)
                n = min(seq.num_tokens - hit_tokens, budget)
                need = -(-(hit_tokens + n) // bs) - len(hit_blocks)
                free_after_touch = pool.num_free - sum(1 for b in hit_blocks if pool.ref[b] == 0)
                if need > free_after_touch:
                    break
                waiting.popleft()
                for b in hit_blocks:
                    pool.touch(b)
                seq.blocks = hit_blocks + pool.allocate(need)
                seq.num_computed = hit_tokens
                seq.hashes_registered = len(hit_blocks)
                if seq.scheduled_at is None:
                    seq.scheduled_at = self.clock()
                    seq.num_cached_prompt_tokens = hit_tokens
                    seq.recomputed_last = recompute_last
                running.append(seq)
                items.append((seq, n))
                budget -= n
                context += hit_tokens + n
                pairs += n * (hit_tokens + n / 2)
        num_tokens = shape.max_num_batched_tokens - budget
        return StepPlan(items, num_tokens, context, pairs)

    def _preempt(self, seq: Sequence) -> None:
        self.pool.release(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0
        seq.hashes_registered = 0
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        self.metrics.preemptions.inc()

    def _apply(self, plan: StepPlan, now: float) -> None:
        scale = self.time_scale
        bs = self.shape.block_size
        pool = self.pool
        m = self.metrics
        gen_tokens = 0
        prompt_computed = 0
        finished_any = False
        itl = m.itl
        for seq, n in plan.items:
            if seq.finished:
                continue
            prompt_computed += max(0, min(n, seq.prompt_len - seq.num_computed))
            seq.num_computed += n
            if self.enable_prefix_caching and seq.hashes_registered < len(seq.block_hashes):
                full = min(seq.num_computed // bs, len(seq.block_hashes))
                for j in range(seq.hashes_registered, full):
                    pool.register(seq.blocks[j], seq.block_hashes[j])
                seq.hashes_registered = max(seq.hashes_registered, full)
            if seq.num_computed < seq.num_tokens:
                continue
            h = seq.context
            if seq.first_rank and not seq.out:
                tok = model.distribution(h, seq.drift).top(seq.first_rank + 1)[seq.first_rank][0]
            elif seq.bias or seq.allowed:
                u = model.sampling_uniform(seq.key, len(seq.out))
                tok = model.constrained_token(h, seq.drift, seq.greedy, u, seq.bias, seq.allowed)
            elif seq.greedy:
                tok = model.greedy_token(h, seq.drift)
            else:
                tok = model.sample_token(h, seq.drift, model.sampling_uniform(seq.key, len(seq.out)))
            seq.context = model.extend_context(h, model.token_id(tok))
            seq.out.append(tok)
            if seq.keep_contexts:
                seq.out_contexts.append(h)
            seq.num_tokens += 1
            gen_tokens += 1
            if seq.first_token_at is None:
                seq.first_token_at = now
                m.ttft.observe(max(0.0, now - seq.arrival) * scale)
                m.record_prompt(seq.prompt_len, seq.num_cached_prompt_tokens, seq.recomputed_last)
            else:
                itl.observe((now - seq.last_token_at) * scale)
            seq.last_token_at = now
            reason = self._check_stop(seq, tok)
            if reason is not None:
                self._finish(seq, reason, now)
                finished_any = True
            elif seq.stream and seq.notify is not None:
                seq.notify()
        if gen_tokens:
            m.generation_tokens.inc(gen_tokens)
        # loggers.py:1205-1208: prompt tokens computed in the step plus tokens generated by it (the step
        # that ends a prefill counts its chunk and the first token).
        m.iteration_tokens.observe(prompt_computed + gen_tokens)
        if finished_any:
            self.running = [s for s in self.running if not s.finished]

    def _check_stop(self, seq: Sequence, tok: int) -> str | None:
        n = len(seq.out)
        matched: str | None = None
        if seq.stop:
            # Keep enough recent text for the longest stop string to be seen across token boundaries.
            piece = model.piece(tok)
            keep = 2 * max(len(x) for x in seq.stop) + 16
            seq.tail = (seq.tail + piece)[-keep:]
            # Only a match that ends inside the new token counts (vLLM searches the newly decoded
            # characters plus the stop string's length back), so one seen during min_tokens is ignored.
            tail = seq.tail
            matched = next((x for x in seq.stop if x in tail[-(len(piece) + len(x) - 1) :]), None)
        if n < seq.min_tokens:
            return "length" if n >= seq.max_tokens else None
        if matched is not None:
            seq.stop_reason = matched
            return "stop"
        if n >= seq.max_tokens:
            return "length"
        if not seq.ignore_eos and model.ends_here(seq.context, seq.mean_len):
            return "stop"
        return None

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        seq.finish_reason = reason
        seq.done_at = now
        self.pool.release(seq.blocks)
        seq.blocks = []
        m = self.metrics
        scale = self.time_scale
        m.request_success[reason].inc()
        if reason != "abort":
            m.e2e.observe((now - seq.arrival) * scale)
            m.request_prompt_tokens.observe(seq.prompt_len)
            m.request_generation_tokens.observe(len(seq.out))
            sched = seq.scheduled_at if seq.scheduled_at is not None else seq.arrival
            m.queue_time.observe((sched - seq.arrival) * scale)
            m.inference_time.observe((now - sched) * scale)
            first = seq.first_token_at if seq.first_token_at is not None else now
            m.prefill_time.observe((first - sched) * scale)
            m.decode_time.observe((now - first) * scale)
            if len(seq.out) > 1:
                m.tpot.observe((now - first) * scale / (len(seq.out) - 1))
        if seq.notify is not None:
            seq.notify()

    def _update_gauges(self) -> None:
        m = self.metrics
        m.num_running.set(len(self.running))
        m.num_waiting.set(len(self.waiting))
        # Every waiting request waits for capacity here: the simulator defers none (no structured
        # output grammars or LoRA adapters to wait for).
        m.waiting_by_reason["capacity"].set(len(self.waiting))
        m.kv_usage.set(self.kv_cache_usage)

    @property
    def kv_cache_usage(self) -> float:
        return 1.0 - self.pool.num_free / self.pool.num_blocks

    def busy_fraction(self, now: float | None = None) -> float:
        """Fraction of the last second of wall time during which the modelled GPU was running a step."""
        now = self.clock() if now is None else now
        busy = sum(d for end, d, _ in self.recent_steps if end >= now - 1.0)
        return min(1.0, busy)
