"""Evaluation suites: named sets of cases, in numbered versions that freeze once a run has used them.

A suite (EvalSuite) has versions (EvalSuiteVersion, numbered 1, 2, ... per suite); a version holds
its cases (EvalCase). A JSONL upload always makes a new version. A version is a draft, whose cases may
still be added, edited or removed, until the first evaluation run uses it: the run sets `locked_at`
(EvalSuiteVersion.lock(), in the run's transaction) and from then on the version and its cases refuse
every change (save/delete raise SuiteVersionLocked; the API answers 409). Runs will point at the
version with on_delete=PROTECT, so a used version cannot be deleted either; to change a used suite,
copy its version into a new draft. docs/evaluations.md, "Suites", says the same for users.

These models are registered through models_registry.models, which imports them; they import nothing of
the registry's other models.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from models_registry.evaluation.rules import MatchRule


class SuiteVersionLocked(Exception):
    """A change to a suite version (or its cases) that a run has already used."""

    def __init__(self, version: EvalSuiteVersion) -> None:
        super().__init__(
            f"{version} is used by an evaluation run and can no longer change; copy it into a new version."
        )
        self.version = version


class EvalSuite(models.Model):
    """A named set of evaluation cases, e.g. "basic-facts"; its content lives in numbered versions."""

    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True, default="")
    # Shipped with inferchain (loaded by seed_builtin_suites) rather than made by a user.
    builtin = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class EvalSuiteVersion(models.Model):
    """One numbered version of a suite's cases; frozen once a run has used it (locked_at is set)."""

    suite = models.ForeignKey(EvalSuite, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    note = models.TextField(blank=True, default="")
    # "upload", "copy", "builtin" or "api": how the version was made.
    source = models.CharField(max_length=16, default="upload")
    case_count = models.PositiveIntegerField(default=0)
    # sha256 over the canonical JSONL of the cases (see suites.cases_digest): same cases, same digest.
    digest = models.CharField(max_length=64, blank=True, default="")
    # Set by the first evaluation run that uses this version; never cleared.
    locked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["suite__name", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["suite", "number"], name="eval_suite_version_number_unique")
        ]

    def __str__(self) -> str:
        return f"{self.suite.name} v{self.number}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.assert_unlocked()
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        self.assert_unlocked()
        return super().delete(*args, **kwargs)

    @property
    def locked(self) -> bool:
        return self.locked_at is not None

    def lock(self) -> None:
        """Freeze this version (an evaluation run is about to use it). Idempotent."""
        if self.locked_at is None:
            now = timezone.now()
            EvalSuiteVersion.objects.filter(pk=self.pk, locked_at__isnull=True).update(locked_at=now)
            self.refresh_from_db(fields=["locked_at"])

    def assert_unlocked(self) -> None:
        """Raise SuiteVersionLocked if a run has used this version (read from the database, not memory)."""
        if (
            self.pk is not None
            and EvalSuiteVersion.objects.filter(pk=self.pk, locked_at__isnull=False).exists()
        ):
            raise SuiteVersionLocked(self)


class EvalCase(models.Model):
    """One case: a prompt (or a chat message list), optionally an expected answer with its match rule."""

    version = models.ForeignKey(EvalSuiteVersion, on_delete=models.CASCADE, related_name="cases")
    # The case's id inside its suite ("capital-france"); stable across versions so runs can be compared.
    case_id = models.CharField(max_length=200)
    # Order in the suite (the JSONL line order).
    position = models.PositiveIntegerField(default=0)
    # Exactly one of prompt (a completion-style user prompt, sent as one user message) or messages.
    prompt = models.TextField(blank=True, default="")
    messages = models.JSONField(null=True, blank=True)
    expected = models.TextField(null=True, blank=True)
    match_rule = models.CharField(
        max_length=16, choices=[(rule.value, rule.value) for rule in MatchRule], blank=True, default=""
    )
    tags = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["version", "position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["version", "case_id"], name="eval_case_id_unique_per_version"),
            models.CheckConstraint(
                condition=(models.Q(messages__isnull=True) & ~models.Q(prompt=""))
                | (models.Q(messages__isnull=False) & models.Q(prompt="")),
                name="eval_case_prompt_xor_messages",
            ),
            models.CheckConstraint(
                condition=(models.Q(expected__isnull=True) & models.Q(match_rule=""))
                | (models.Q(expected__isnull=False) & ~models.Q(match_rule="")),
                name="eval_case_expected_has_rule",
            ),
        ]

    def __str__(self) -> str:
        return self.case_id

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.version.assert_unlocked()
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        self.version.assert_unlocked()
        return super().delete(*args, **kwargs)

    def chat_messages(self) -> list[dict[str, str]]:
        """What the case sends to a chat endpoint: its messages, or its prompt as one user message."""
        if self.messages:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.prompt}]


# -- runs -------------------------------------------------------------------------------------------------


class RunState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED_STATES = (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)


# What "greedy" means for each engine kind, sent with every generation of a run and shown with it
# (docs/evaluations.md, "Greedy, per engine"). vLLM: temperature 0 is greedy sampling, but penalties
# still apply, and by default (--generation-config auto) a model's generation_config.json may set a
# repetition_penalty; so every penalty is made neutral, and top-p/top-k off. llama-cpp-python's server:
# temperature 0 picks the top token after its default repeat penalty of 1.1 (and min_p 0.05, top_k 40,
# top_p 0.95), so those are sent neutral too. An engine of unknown kind gets vLLM's names.
GREEDY_VLLM: dict[str, Any] = {
    "temperature": 0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
GREEDY_LLAMACPP: dict[str, Any] = {
    "temperature": 0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


# The order the fields are shown in (a recorded set comes back from PostgreSQL's jsonb, which keeps its
# own key order).
GREEDY_ORDER = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "repeat_penalty")


def greedy_params(engine: str | None) -> dict[str, Any]:
    """The sampling parameters that make `engine` (a deployment's engine kind) decode greedily."""
    return dict(GREEDY_LLAMACPP if engine == "llamacpp" else GREEDY_VLLM)


class EvalRun(models.Model):
    """One suite version run through a reference and a candidate engine, case by case.

    Each side is an OpenAI-compatible endpoint: a fleet deployment (`*_deployment_id`, resolved to a base
    URL and its engine key at every start through evaluation.endpoints; the key is never stored) or a
    plain base URL of a keyless engine. `*_info` snapshots what was behind the side when the run was
    created (deployment name, model version, engine, launch arguments), and the sampling fields fix the
    decoding, so the run records everything needed to repeat it. docs/evaluations.md, "Runs".
    """

    name = models.CharField(max_length=200, blank=True, default="")
    suite_version = models.ForeignKey(EvalSuiteVersion, on_delete=models.PROTECT, related_name="runs")
    reference_deployment_id = models.PositiveIntegerField(null=True, blank=True)
    reference_base_url = models.CharField(max_length=500)
    reference_model = models.CharField(max_length=200)
    reference_info = models.JSONField(default=dict, blank=True)
    candidate_deployment_id = models.PositiveIntegerField(null=True, blank=True)
    candidate_base_url = models.CharField(max_length=500)
    candidate_model = models.CharField(max_length=200)
    candidate_info = models.JSONField(default=dict, blank=True)
    # Sampling: greedy (temperature 0) always; these fix the rest.
    max_tokens = models.PositiveIntegerField(default=256)
    seed = models.BigIntegerField(default=0)
    top_logprobs = models.PositiveSmallIntegerField(default=5)
    # Requests in flight per side, and the timeout of one request, seconds.
    concurrency = models.PositiveSmallIntegerField(default=8)
    request_timeout = models.FloatField(default=120.0)
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.PENDING)
    cancel_requested = models.BooleanField(default=False)
    case_count = models.PositiveIntegerField(default=0)
    done_count = models.PositiveIntegerField(default=0)
    error_count = models.PositiveIntegerField(default=0)
    # How many times the task started on this run (above 1: it resumed).
    attempts = models.PositiveIntegerField(default=0)
    # summarize()'s figures plus latency per side (see runner.run_summary).
    summary = models.JSONField(default=dict, blank=True)
    # Why the candidate could not score the reference's text (teacher forcing), when it could not.
    teacher_forcing_note = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name or f"run {self.pk}"

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    def greedy(self, side: str) -> dict[str, Any]:
        """What greedy means for this side's engine: the set recorded when the run was created, so a
        later change of the tables above does not change what an old run says it sent (a run recorded
        before there was one: its engine kind's set)."""
        info = getattr(self, f"{side}_info") or {}
        recorded = info.get("greedy")
        params = dict(recorded) if isinstance(recorded, dict) else greedy_params(info.get("engine"))
        first = {name: params.pop(name) for name in GREEDY_ORDER if name in params}
        return {**first, **dict(sorted(params.items()))}

    def sampling(self) -> dict[str, Any]:
        return {
            "temperature": 0,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "top_logprobs": self.top_logprobs,
            "greedy": {side: self.greedy(side) for side in ("reference", "candidate")},
        }


class EvalSample(models.Model):
    """One case of a run: both outputs, their timings and every per-sample metric.

    Stored once per (run, case), the moment both sides are scored; the unique constraint keeps a resumed
    run from storing a case twice.
    """

    run = models.ForeignKey(EvalRun, on_delete=models.CASCADE, related_name="samples")
    case = models.ForeignKey(EvalCase, on_delete=models.PROTECT, related_name="samples")
    case_key = models.CharField(max_length=200)  # the case's id in its suite
    position = models.PositiveIntegerField(default=0)
    tags = models.JSONField(default=list, blank=True)
    reference_output = models.TextField(blank=True, default="")
    candidate_output = models.TextField(blank=True, default="")
    reference_tokens = models.JSONField(default=list, blank=True)
    candidate_tokens = models.JSONField(default=list, blank=True)
    # Log-probability of each output token as its own side generated it (for shading).
    reference_token_logprobs = models.JSONField(default=list, blank=True)
    candidate_token_logprobs = models.JSONField(default=list, blank=True)
    # KL(reference || candidate) per scored position.
    position_kl = models.JSONField(default=list, blank=True)
    # Denormalised metrics for filtering and ordering; `scores` holds score_sample's whole dict.
    exact_match = models.BooleanField(null=True)
    first_divergence = models.IntegerField(null=True, blank=True)
    token_agreement = models.FloatField(null=True, blank=True)
    chrf = models.FloatField(null=True, blank=True)
    reference_correct = models.BooleanField(null=True)
    candidate_correct = models.BooleanField(null=True)
    flip = models.CharField(max_length=16, blank=True, default="")
    kl_mode = models.CharField(max_length=24, blank=True, default="")
    mean_kl = models.FloatField(null=True, blank=True)
    max_kl = models.FloatField(null=True, blank=True)
    top1_agreement = models.FloatField(null=True, blank=True)
    scores = models.JSONField(default=dict, blank=True)
    # Timings per side: whole request, and tokens per second over it. TTFT is null for non-streamed calls.
    reference_latency_ms = models.FloatField(null=True, blank=True)
    candidate_latency_ms = models.FloatField(null=True, blank=True)
    reference_ttft_ms = models.FloatField(null=True, blank=True)
    candidate_ttft_ms = models.FloatField(null=True, blank=True)
    reference_tokens_per_s = models.FloatField(null=True, blank=True)
    candidate_tokens_per_s = models.FloatField(null=True, blank=True)
    # Set when a side's request failed (the metrics are then null).
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "position", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "case"], name="eval_sample_once_per_case")]
        indexes = [models.Index(fields=["run", "mean_kl"]), models.Index(fields=["run", "flip"])]

    def __str__(self) -> str:
        return f"{self.run_id}:{self.case_key}"


# -- review -----------------------------------------------------------------------------------------------


class SampleMark(models.TextChoices):
    """A reviewer's judgement of one sample's candidate output against the reference's."""

    SAME = "same"  # says the same thing (whatever the wording)
    ACCEPTABLE = "acceptable"  # differs, but no worse for the case
    REGRESSION = "regression"  # the candidate is worse


class EvalReview(models.Model):
    """The review mark of one sample: one per sample; marking it again replaces mark and comment.

    Kept apart from EvalSample so the runner, which writes samples, never touches a reviewer's work.
    `marked_by_name` keeps who marked it readable after the account is gone (as the audit log does).
    """

    sample = models.OneToOneField(EvalSample, on_delete=models.CASCADE, related_name="review")
    mark = models.CharField(max_length=16, choices=SampleMark.choices)
    comment = models.TextField(blank=True, default="")
    marked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    marked_by_name = models.CharField(max_length=150, blank=True, default="")
    marked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["mark"])]

    def __str__(self) -> str:
        return f"{self.sample}: {self.mark}"


class VerdictDecision(models.TextChoices):
    ACCEPT = "accept"
    REJECT = "reject"


class EvalVerdict(models.Model):
    """A run's verdict, signed by an evaluator or admin. A new one supersedes the current one, which is
    kept (superseded_at set): the history of a run's sign-offs is never rewritten.

    `candidate_version` is the model version the run's candidate served when it was signed (from
    `candidate_info`), so a version's page lists the verdicts about it; null for a base-URL candidate.
    """

    run = models.ForeignKey(EvalRun, on_delete=models.CASCADE, related_name="verdicts")
    decision = models.CharField(max_length=8, choices=VerdictDecision.choices)
    comment = models.TextField(blank=True, default="")
    candidate_version = models.ForeignKey(
        "models_registry.ModelVersion",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="eval_verdicts",
    )
    signed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    signed_by_name = models.CharField(max_length=150, blank=True, default="")
    signed_at = models.DateTimeField(default=timezone.now)
    superseded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-signed_at", "-id"]
        constraints = [
            # At most one current verdict per run (signing locks the run row; this is the backstop).
            models.UniqueConstraint(
                fields=["run"],
                condition=models.Q(superseded_at__isnull=True),
                name="eval_verdict_one_current_per_run",
            )
        ]

    def __str__(self) -> str:
        return f"run {self.run_id}: {self.decision}"

    @property
    def current(self) -> bool:
        return self.superseded_at is None
