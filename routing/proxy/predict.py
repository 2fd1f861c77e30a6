"""Online predictors of an engine's time to first token (TTFT), time per output token (TPOT) and a
request's output length, learnt in the proxy from the requests it completes.

Why online linear models and not the engine's formulas: the proxy sees every engine as a black box
(a vLLM on an H100, a llama.cpp on a CPU, a simulator): what it can know is what it sent and what came
back. At admission it knows the request's prompt tokens and what it has itself in flight on each
engine (requests, and the uncached prompt tokens of those still waiting for their first token: the
prefill queue the request joins) and, when the engine's live record is fresh, its KV-cache usage.
When the request completes it knows the outcome (TTFT, and TPOT from the rest of the stream). Each
engine gets two recursive-least-squares regressions over those features:

    log TTFT = w . [1, ln(1 + uncached prompt/1k), ln(1 + prefill queue/1k),
                    ln(1 + requests in flight)]
    log TPOT = w . [1, ln(1 + requests in flight), ln(1 + prefill queue/10k), KV used fraction]

that is, power laws: TTFT = C (1 + prompt/1k)^a (1 + queued prompt/1k)^b (1 + in flight)^c. The
prefill queue counts a request's prompt only until its first token (`Predictors.first_token`): a
request already decoding no longer delays a newcomer's prefill (the first version counted every
prompt in flight, most of them of streams long past their prefill). In logs
because what matters is the relative error (a 10 ms prefix-cache hit and a 5 s queued long document
are both answers to predict, and a fit of seconds is all about the second: in a first version, a
linear fit in seconds, the mixed benchmark's TTFT error was hundreds of percent), and a slowdown of
the engine is then one shift of the intercept.

"Uncached" is the proxy's guess at the engine's prefix-cache hit: each engine's model remembers the
prefix keys (routing/proxy/scorers.py, the prompt's leading blocks) of the requests it was recently sent
(`PREFIXES_KEPT`), each with the shortest prompt seen with it (the shared part is at most that long);
a request whose key is there counts only the tokens beyond it. So the same request is predicted
faster on the engine that holds its system prompt, and the predicted scorers trade that against load.
When the engine reports its actual hit (`usage.prompt_tokens_details.cached_tokens`: vLLM with
--enable-prompt-tokens-details, the simulator likewise), the fit learns from the actual uncached tokens
rather than the guess, and a reported hit sets the shared length the memory keeps for its key. (A
reported miss does not drop the key: the request that missed has just cached its prefix. A first
version dropped it, so the next requests behind that system prompt were predicted as misses: in the
mixed benchmark its worst engine's TTFT error was 370 %, against 296 % keeping the key.)
A prediction is kept within RANGE_MARGIN of the range of recent observations (its ends forget old
extremes by RANGE_DECAY per observation): a linear fit extrapolates badly, and one wild prediction
sends a request to the wrong engine.

Recursive least squares (RLS) with a forgetting factor is the exact least-squares fit over an
exponentially weighted history, updated in O(d^2) per observation (d = 4: sixteen multiply-adds) and
evaluated in O(d) per decision, with no numpy (whose call overhead alone, a microsecond per small
array, is more than the arithmetic here). The forgetting factor (`FORGET`) weighs an observation
`FORGET**k` after k newer ones: at 0.95 the fit's memory is ~20 requests, so an engine that slows down
(a throttled GPU, a noisy neighbour) is followed within a few dozen of its requests
(tests/routing/test_predict_speed_change.py changes a simulator's speed at run time and measures it).
The update is robust to single outliers (a Huber-style loss): after MIN_SAMPLES updates its residual
(in logs) is clipped to HUBER_K times the recent mean absolute residual (at least HUBER_FLOOR), so one
10 ms prefix hit, or one request stuck behind a burst, does not drag the next twenty predictions after
it; a real change of speed raises the mean absolute residual within a few updates and gets through.
The covariance's diagonal is capped (`P_DIAG_MAX`) so that a stretch of identical features (an idle
engine answering the same prompt length) cannot wind it up and make the next update jump.

Cold start: an engine's model is `warm` after `MIN_SAMPLES` observations; until every candidate is
warm the predicted scorers decide as least-outstanding does (routing/proxy/scorers.py), which spreads
requests and so warms every engine.

Output length: the tokens a request will generate, by (tenant, alias): an exponentially weighted mean
of the share of `max_tokens` used (requests that name it) and of the tokens generated (those that do
not); `max_tokens` bounds it. Without history the request is assumed to run to its bound.

The predictor also keeps what the routing page shows (routing/proxy/predict.py `report`): per engine its
latest predicted and observed TTFT and TPOT and the mean absolute percentage error (MAPE) of each, over
the observations after warm-up, exponentially weighted like the fit.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

# Observations an engine needs before its predictions are used.
MIN_SAMPLES = 16
# Once warm, an engine of a pool routed by another scorer learns from one request in LEARN_EVERY
# (`Predictors.learns`): its model only feeds the routing page and a later switch to a predicted
# scorer, and the fit updates were most of what the predictors cost every pool. Measured with
# benchmarks/proxy_app_cpu.py (stream, 2026-12-07): the predictors as first built added about 55 us
# of CPU per stream (235 against 180 us); with the loop-written update, the first-token hook in
# place of a wrapped `send`, decisions' parts computed when read (`stale`) and this sampling, 19 us.
LEARN_EVERY = 4
# Weight of an observation after each newer one (memory ~ 1 / (1 - FORGET) observations).
FORGET = 0.95
# The initial covariance (a weak prior: the first observations move the weights at once) and its cap.
P_INIT = 100.0
P_DIAG_MAX = 1_000.0
# Residuals (in logs) beyond HUBER_K x the recent mean absolute residual (HUBER_FLOOR at least) are
# clipped in the update; that mean moves by SCALE_ALPHA per update (see the module docstring).
HUBER_K = 3.0
HUBER_FLOOR = 0.1
SCALE_ALPHA = 0.1
# The weight of the newest observation in the error means and the output-length means.
ERROR_ALPHA = 0.05
OUTPUT_ALPHA = 0.1
# Output length assumed for a request with no `max_tokens` and no history.
DEFAULT_OUTPUT_TOKENS = 256
# Bounds on the keys the output-length predictor keeps (tenants x aliases come from requests).
OUTPUT_KEYS_MAX = 10_000
# Throughput: tokens generated per second, over windows of RATE_WINDOW_S; the peak decays by
# PEAK_DECAY per window so that a slower engine's old peak does not make it look cheap for ever.
RATE_WINDOW_S = 2.0
PEAK_DECAY = 0.98
# Prefix keys each engine's model remembers (least recently sent dropped first).
PREFIXES_KEPT = 512
# A prediction is kept within RANGE_MARGIN times the range of recent observations, whose ends move
# back towards each other by RANGE_DECAY per observation (so the range forgets old extremes).
RANGE_DECAY = 1.005
RANGE_MARGIN = 1.5
# Each proxy process publishes `Predictors.report` to Redis this often, under a key that outlives it
# by PREDICTIONS_TTL_S (routing/proxy/app.py); the console merges them (`merge_reports`).
PREDICTIONS_PUBLISH_S = 2.0
PREDICTIONS_TTL_S = 15.0
# slo_cost's margin under the targets: an engine's prediction times (1 + its recent MAPE, at most this)
# must meet them (`EndpointModel.ttft_margin`); capped so that a model with one bad stretch is not
# ruled out for ever.
SLO_MARGIN_MAX = 1.0


def host_share(gpus_held: int, host_gpus: int) -> float:
    """The share of its host's cost a deployment bears: the GPUs it holds over the host's (the whole
    host on one without GPUs). routing/cost.py spreads costs the same way."""
    return 1.0 if host_gpus == 0 else min(gpus_held, host_gpus) / host_gpus


class Rls:
    """Recursive least squares with exponential forgetting: y ~ w . x."""

    __slots__ = ("n", "p", "scale", "w")

    def __init__(self, dim: int) -> None:
        self.n = 0
        self.scale = 0.0  # recent mean absolute residual (the Huber clip's scale)
        self.w = [0.0] * dim
        self.p = [[P_INIT if i == j else 0.0 for j in range(dim)] for i in range(dim)]

    def predict(self, x: list[float]) -> float:
        w = self.w
        return sum(w[i] * x[i] for i in range(len(w)))

    def update(self, x: list[float], y: float) -> None:
        # Plain loops over locals: this runs twice per answered stream on the proxy's hot path, and
        # comprehensions over zip() cost three times as much here (24 us against 8 us per observation,
        # measured 2026-12-07).
        p, w = self.p, self.w
        d = len(w)
        rng = range(d)
        px = [0.0] * d
        xpx = 0.0
        pred = 0.0
        for i in rng:
            row = p[i]
            acc = 0.0
            for j in rng:
                acc += row[j] * x[j]
            px[i] = acc
            xpx += x[i] * acc
            pred += w[i] * x[i]
        inv = 1.0 / (FORGET + xpx)
        err = y - pred
        if self.n >= MIN_SAMPLES:
            c = HUBER_K * max(self.scale, HUBER_FLOOR)
            self.scale += SCALE_ALPHA * (min(abs(err), 2.0 * c) - self.scale)
            err = c if err > c else -c if err < -c else err
        else:
            self.scale += SCALE_ALPHA * (abs(err) - self.scale)
        step = err * inv
        for i in rng:
            w[i] += px[i] * step
        # P <- (P - P x x' P / (FORGET + x' P x)) / FORGET, in place (P is symmetric, so x' P = (P x)').
        k = 1.0 / FORGET
        for i in rng:
            row = p[i]
            a = px[i] * inv
            for j in rng:
                row[j] = (row[j] - a * px[j]) * k
        # A feature that does not vary (no live KV state, one prompt length) is not learnt about, and
        # its variance grows by 1 / FORGET per update without bound; capping it (D P D with D diagonal,
        # so P stays symmetric positive definite) keeps the next update that does vary it sane.
        for i in rng:
            if p[i][i] > P_DIAG_MAX:
                s = math.sqrt(P_DIAG_MAX / p[i][i])
                for j in rng:
                    p[i][j] *= s
                    p[j][i] *= s
        self.n += 1


def ttft_features(prompt: int, inflight: int, inflight_prompt: int) -> list[float]:
    return [1.0, math.log1p(prompt / 1000.0), math.log1p(inflight_prompt / 1000.0), math.log1p(inflight)]


def tpot_features(inflight: int, inflight_prompt: int, kv_used: float) -> list[float]:
    return [1.0, math.log1p(inflight), math.log1p(inflight_prompt / 10_000.0), kv_used]


def _exp(v: float) -> float:
    return math.exp(v if v < 30.0 else 30.0)


@dataclass(slots=True)
class Admission:
    """What one request's prediction was made from (kept from dispatch to completion)."""

    endpoint_id: str
    prompt: int
    inflight: int
    inflight_prompt: int
    kv_used: float
    predicted_ttft: float | None
    predicted_tpot: float | None
    # The whole prompt and its prefix key (to learn the actual cache hit when the engine reports it),
    # and whether it is still in its engine's prefill queue (no first token yet).
    full_prompt: int = 0
    prefix_key: bytes | None = None
    prefilling: bool = True


@dataclass(slots=True)
class EndpointModel:
    """One engine's learnt TTFT and TPOT, what it has in flight, and its error and throughput."""

    endpoint_id: str
    ttft: Rls = field(default_factory=lambda: Rls(4))
    tpot: Rls = field(default_factory=lambda: Rls(4))
    # This process's requests in flight on it, and the uncached prompt tokens of those among them
    # still waiting for their first token (the prefill queue).
    inflight: int = 0
    inflight_prompt: int = 0
    # Exponentially weighted absolute percentage errors after warm-up (None: none yet).
    ttft_ape: float | None = None
    tpot_ape: float | None = None
    # 1 + those errors, at most 1 + SLO_MARGIN_MAX: slo_cost's margin (kept here so a decision reads it).
    ttft_margin: float = 1.0
    tpot_margin: float = 1.0
    last: dict[str, float | None] = field(default_factory=dict)
    # Throughput: tokens generated in the current window, the window's start, the decayed peak rate.
    window_tokens: int = 0
    window_start: float | None = None
    peak_tokens_per_s: float = 0.0
    warm: bool = False
    # Requests dispatched here (`Predictors.learns` samples by it).
    dispatched: int = 0
    # The parts of both predictions that do not depend on the request, so a decision costs two
    # multiply-adds per candidate: log TTFT = ttft_base + ttft_per_kprompt * ln(1 + prompt/1k),
    # log TPOT = tpot_base + tpot_per_kv * kv. Computed when read (`refresh`, by the scorers) after the
    # weights or what is in flight changed (`stale`), not at each change: a request changes what is in
    # flight three times (dispatch, first token, release), and most pools' decisions never read them.
    stale: bool = True
    ttft_base: float = 0.0
    ttft_per_kprompt: float = 0.0
    tpot_base: float = 0.0
    tpot_per_kv: float = 0.0
    # Prefix key -> the shortest prompt sent here with it (see the module docstring).
    prefixes: dict[bytes, int] = field(default_factory=dict)
    # The range of recent observations (see RANGE_DECAY) and, RANGE_MARGIN wider, what predictions are
    # kept within.
    ttft_seen: tuple[float, float] = (0.0, math.inf)
    tpot_seen: tuple[float, float] = (0.0, math.inf)
    ttft_lo: float = 0.0
    ttft_hi: float = math.inf
    tpot_lo: float = 0.0
    tpot_hi: float = math.inf

    def uncached(self, prompt: int, prefix_key: bytes | None) -> int:
        """The prompt tokens this engine likely has to compute (its cache holds the shared prefix)."""
        if prefix_key is None:
            return prompt
        shared = self.prefixes.get(prefix_key)
        return prompt if shared is None else prompt - min(shared, prompt) + 1

    def remember(self, prompt: int, prefix_key: bytes | None) -> None:
        if prefix_key is None:
            return
        prefixes = self.prefixes
        shared = prefixes.pop(prefix_key, None)
        prefixes[prefix_key] = prompt if shared is None else min(shared, prompt)
        if len(prefixes) > PREFIXES_KEPT:
            del prefixes[next(iter(prefixes))]

    def clamp_ttft(self, v: float) -> float:
        return self.ttft_lo if v < self.ttft_lo else self.ttft_hi if v > self.ttft_hi else v

    def clamp_tpot(self, v: float) -> float:
        return self.tpot_lo if v < self.tpot_lo else self.tpot_hi if v > self.tpot_hi else v

    def refresh(self) -> None:
        self.warm = self.ttft.n >= MIN_SAMPLES and self.tpot.n >= MIN_SAMPLES
        t, p = self.ttft.w, self.tpot.w
        n, queued = math.log1p(self.inflight), self.inflight_prompt
        self.ttft_base = t[0] + t[2] * math.log1p(queued / 1000.0) + t[3] * n
        self.ttft_per_kprompt = t[1]
        self.tpot_base = p[0] + p[1] * n + p[2] * math.log1p(queued / 10_000.0)
        self.tpot_per_kv = p[3]
        self.stale = False

    def _fitted(self) -> None:
        """A fit was updated: it may be warm now, and the parts kept for decisions are stale."""
        self.warm = self.ttft.n >= MIN_SAMPLES and self.tpot.n >= MIN_SAMPLES
        self.stale = True

    def ttft_for(self, prompt: int) -> float:
        """Predicted TTFT of a prompt of `prompt` uncached tokens, joining what is in flight now."""
        if self.stale:
            self.refresh()
        return self.clamp_ttft(_exp(self.ttft_base + self.ttft_per_kprompt * math.log1p(prompt / 1000.0)))

    def tpot_for(self, kv_used: float) -> float:
        """Predicted TPOT of a request joining what is in flight now, at this KV-cache use."""
        if self.stale:
            self.refresh()
        return self.clamp_tpot(_exp(self.tpot_base + self.tpot_per_kv * kv_used))

    def predict_ttft(self, prompt: int, inflight: int, inflight_prompt: int) -> float:
        return self.clamp_ttft(_exp(self.ttft.predict(ttft_features(prompt, inflight, inflight_prompt))))

    def predict_tpot(self, inflight: int, inflight_prompt: int, kv_used: float) -> float:
        return self.clamp_tpot(_exp(self.tpot.predict(tpot_features(inflight, inflight_prompt, kv_used))))

    def _observed(self, ttft: float | None, tpot: float | None) -> None:
        """Take an observation into the range of recent ones (whose ends forget old extremes)."""
        # Called before the observation's update: n == 0 is the first one.
        if ttft is not None:
            lo, hi = self.ttft_seen
            lo, hi = (
                (min(ttft, lo * RANGE_DECAY), max(ttft, hi / RANGE_DECAY)) if self.ttft.n else (ttft, ttft)
            )
            self.ttft_seen = (lo, hi)
            self.ttft_lo, self.ttft_hi = lo / RANGE_MARGIN, hi * RANGE_MARGIN
        if tpot is not None:
            lo, hi = self.tpot_seen
            lo, hi = (
                (min(tpot, lo * RANGE_DECAY), max(tpot, hi / RANGE_DECAY)) if self.tpot.n else (tpot, tpot)
            )
            self.tpot_seen = (lo, hi)
            self.tpot_lo, self.tpot_hi = lo / RANGE_MARGIN, hi * RANGE_MARGIN

    def cost_per_token(self, cost_per_hour: float) -> float | None:
        """Its cost per output token at the best rate it has shown recently (None: no rate yet)."""
        if self.peak_tokens_per_s <= 0.0:
            return None
        return cost_per_hour / 3600.0 / self.peak_tokens_per_s

    def _count_tokens(self, tokens: int, now: float) -> None:
        if self.window_start is None:
            self.window_start = now
        elapsed = now - self.window_start
        if elapsed >= RATE_WINDOW_S:
            rate = self.window_tokens / elapsed
            windows = int(elapsed / RATE_WINDOW_S)
            self.peak_tokens_per_s = max(self.peak_tokens_per_s * PEAK_DECAY**windows, rate)
            self.window_tokens = 0
            self.window_start = now
        self.window_tokens += tokens


def _ape(old: float | None, predicted: float, observed: float) -> float:
    ape = abs(predicted - observed) / max(observed, 1e-6)
    return ape if old is None else old + ERROR_ALPHA * (ape - old)


class Predictors:
    """Every engine's model and the output-length means of one proxy process."""

    def __init__(self) -> None:
        self.models: dict[str, EndpointModel] = {}
        # (tenant id, alias) -> [share of max_tokens used, tokens generated without a bound]
        self.outputs: dict[tuple[int, str], list[float | None]] = {}

    def model(self, endpoint_id: str) -> EndpointModel:
        m = self.models.get(endpoint_id)
        if m is None:
            m = self.models[endpoint_id] = EndpointModel(endpoint_id)
        return m

    # ---- output length -----------------------------------------------------------------------------

    def output_tokens(self, tenant_id: int, alias: str, max_tokens: int | None) -> int:
        """The tokens a request is expected to generate, at most `max_tokens`."""
        means = self.outputs.get((tenant_id, alias))
        if max_tokens:
            share = means[0] if means is not None else None
            return max(1, round(max_tokens * share)) if share is not None else max_tokens
        generated = means[1] if means is not None else None
        return max(1, round(generated)) if generated is not None else DEFAULT_OUTPUT_TOKENS

    def observe_output(self, tenant_id: int, alias: str, max_tokens: int | None, generated: int) -> None:
        key = (tenant_id, alias)
        means = self.outputs.get(key)
        if means is None:
            if len(self.outputs) >= OUTPUT_KEYS_MAX:
                self.outputs.clear()
            means = self.outputs[key] = [None, None]
        slot, value = (0, min(1.0, generated / max_tokens)) if max_tokens else (1, float(generated))
        old = means[slot]
        means[slot] = value if old is None else old + OUTPUT_ALPHA * (value - old)

    # ---- dispatch and completion -------------------------------------------------------------------

    def learns(self, endpoint_id: str) -> bool:
        """Whether the next request to `endpoint_id` is learnt from when its pool's scorer does not
        predict: every one until the engine is warm, then one in LEARN_EVERY."""
        m = self.model(endpoint_id)
        m.dispatched += 1
        return not m.warm or m.dispatched % LEARN_EVERY == 0

    def dispatch(
        self,
        endpoint_id: str,
        prompt: int,
        kv_used: float,
        prefix_key: bytes | None = None,
        predict: bool = True,
    ) -> Admission:
        """A request sent to `endpoint_id`: what it sees there (before counting it), then counted. Its
        prompt counts as the part the engine likely has not cached (`EndpointModel.uncached`).
        `predict`: make the predictions its error is measured by (a request learnt from)."""
        m = self.model(endpoint_id)
        predict = predict and m.warm
        full, prompt = prompt, m.uncached(prompt, prefix_key)
        m.remember(full, prefix_key)
        adm = Admission(
            endpoint_id,
            prompt,
            m.inflight,
            m.inflight_prompt,
            kv_used,
            m.predict_ttft(prompt, m.inflight, m.inflight_prompt) if predict else None,
            m.predict_tpot(m.inflight, m.inflight_prompt, kv_used) if predict else None,
            full,
            prefix_key,
        )
        m.inflight += 1
        m.inflight_prompt += prompt
        m.stale = True
        return adm

    def first_token(self, adm: Admission) -> None:
        """The request's first token has come back: it has left its engine's prefill queue."""
        if adm.prefilling:
            adm.prefilling = False
            m = self.model(adm.endpoint_id)
            m.inflight_prompt = max(0, m.inflight_prompt - adm.prompt)
            m.stale = True

    def release(self, adm: Admission) -> None:
        """The request has left `adm.endpoint_id` (answered, failed or cut short)."""
        m = self.model(adm.endpoint_id)
        m.inflight = max(0, m.inflight - 1)
        if adm.prefilling:
            adm.prefilling = False
            m.inflight_prompt = max(0, m.inflight_prompt - adm.prompt)
        m.stale = True

    def observe(
        self,
        adm: Admission,
        ttft_s: float | None,
        duration_s: float,
        completion_tokens: int | None,
        now: float | None = None,
        cached_tokens: int | None = None,
        learn: bool = True,
    ) -> None:
        """Learn from a completed request: its TTFT (streams only: a whole answer has none), its TPOT
        ((duration - TTFT) / (tokens - 1), two tokens at least) and the tokens it generated.
        `cached_tokens`: the engine's reported prefix-cache hit, when it reports one (the fit then
        learns from the tokens it actually computed, and the prefix memory is corrected). `learn`
        False: only the throughput and the prefix memory take it, not the fits (`learns`)."""
        m = self.model(adm.endpoint_id)
        if completion_tokens:
            m._count_tokens(completion_tokens, time.monotonic() if now is None else now)
        prompt = adm.prompt
        if cached_tokens is not None and adm.full_prompt:
            cached = max(0, min(cached_tokens, adm.full_prompt))
            prompt = max(1, adm.full_prompt - cached)
            key = adm.prefix_key
            # A hit tells how long the shared part is (block-aligned, as the engine shares it). A miss
            # tells nothing about the next request: this one has just put its prefix in the cache.
            if key is not None and cached > 0 and key in m.prefixes:
                m.prefixes[key] = cached
        if not learn or ttft_s is None or ttft_s <= 0.0:
            return
        x = ttft_features(prompt, adm.inflight, adm.inflight_prompt)
        if adm.predicted_ttft is not None:
            m.ttft_ape = _ape(m.ttft_ape, adm.predicted_ttft, ttft_s)
            m.ttft_margin = 1.0 + min(m.ttft_ape, SLO_MARGIN_MAX)
        m._observed(ttft_s, None)
        m.ttft.update(x, math.log(max(ttft_s, 1e-4)))
        m._fitted()
        m.last["ttft_observed"] = ttft_s
        m.last["ttft_predicted"] = adm.predicted_ttft
        if completion_tokens is None or completion_tokens < 2 or duration_s <= ttft_s:
            return
        tpot = (duration_s - ttft_s) / (completion_tokens - 1)
        if adm.predicted_tpot is not None:
            m.tpot_ape = _ape(m.tpot_ape, adm.predicted_tpot, tpot)
            m.tpot_margin = 1.0 + min(m.tpot_ape, SLO_MARGIN_MAX)
        m._observed(None, tpot)
        m.tpot.update(
            tpot_features(adm.inflight, adm.inflight_prompt, adm.kv_used), math.log(max(tpot, 1e-5))
        )
        m._fitted()
        m.last["tpot_observed"] = tpot
        m.last["tpot_predicted"] = adm.predicted_tpot

    def forget(self, keep: set[str]) -> None:
        """Drop the models of endpoints no longer in the snapshot."""
        for ep_id in [k for k in self.models if k not in keep]:
            del self.models[ep_id]

    def report(self) -> list[dict[str, Any]]:
        """Per engine: samples, warm, the last predicted and observed TTFT/TPOT (s), MAPE (%),
        the peak throughput (tokens/s): what the routing page shows."""

        def pct(v: float | None) -> float | None:
            return None if v is None or math.isnan(v) else round(v * 100, 1)

        return [
            {
                "endpoint_id": ep_id,
                "samples": m.ttft.n,
                "warm": m.warm,
                "inflight": m.inflight,
                "ttft_predicted_s": m.last.get("ttft_predicted"),
                "ttft_observed_s": m.last.get("ttft_observed"),
                "tpot_predicted_s": m.last.get("tpot_predicted"),
                "tpot_observed_s": m.last.get("tpot_observed"),
                "ttft_mape_pct": pct(m.ttft_ape),
                "tpot_mape_pct": pct(m.tpot_ape),
                "peak_tokens_per_s": round(m.peak_tokens_per_s, 2),
            }
            for ep_id, m in sorted(self.models.items())
        ]


def merge_reports(reports: list[list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Several proxy processes' reports as one per engine: samples and in-flight counts added, the
    errors weighted by each process's samples, the last predicted and observed values of the process
    with the most samples, the highest throughput."""
    out: dict[str, dict[str, Any]] = {}
    for report in reports:
        for row in report:
            ep = str(row.get("endpoint_id", ""))
            n = int(row.get("samples") or 0)
            have = out.get(ep)
            if have is None:
                out[ep] = {**row, "processes": 1}
                continue
            total = have["samples"] + n
            for name in ("ttft_mape_pct", "tpot_mape_pct"):
                a, b = have.get(name), row.get(name)
                if a is None or b is None:
                    have[name] = a if b is None else b
                elif total:
                    have[name] = round((a * have["samples"] + b * n) / total, 1)
            if n > have["samples"]:
                for name in ("ttft_predicted_s", "ttft_observed_s", "tpot_predicted_s", "tpot_observed_s"):
                    have[name] = row.get(name)
            have["samples"] = total
            have["warm"] = bool(have.get("warm")) or bool(row.get("warm"))
            have["inflight"] = int(have.get("inflight") or 0) + int(row.get("inflight") or 0)
            have["peak_tokens_per_s"] = max(
                have.get("peak_tokens_per_s") or 0.0, row.get("peak_tokens_per_s") or 0.0
            )
            have["processes"] += 1
    return out
