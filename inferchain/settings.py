"""The one settings module. Everything that differs between machines comes from the environment."""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from pathlib import Path

import dj_database_url

from core.env import env_bool, env_float, env_int, env_limit, env_list, env_secret, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_secret("SECRET_KEY", "insecure-dev-key-change-me" if DEBUG else "")
if not SECRET_KEY:
    # A zero-setup demo still needs a key; make it stable per checkout so sessions survive restarts.
    _key_file = BASE_DIR / "var" / "secret_key"
    if not _key_file.exists():
        _key_file.parent.mkdir(parents=True, exist_ok=True)
        _key_file.write_text(secrets.token_urlsafe(50))
    SECRET_KEY = _key_file.read_text().strip()

# HMAC secret for API key hashes; separate from SECRET_KEY so that rotating one does not void the other.
API_KEY_HMAC_SECRET = env_secret("API_KEY_HMAC_SECRET", SECRET_KEY)

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "core",
    "console",
    "models_registry",
    "nodes",
    "routing",
    "alerts",
    "inferchain",
]

MIDDLEWARE = [
    # First: it sees every other layer's answer, and turns error pages under /api/ into JSON.
    "core.api.errors.ApiJsonErrorsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "core.security.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "inferchain.urls"
ASGI_APPLICATION = "inferchain.asgi.application"
WSGI_APPLICATION = "inferchain.wsgi.application"
AUTH_USER_MODEL = "console.User"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# With no DATABASE_URL the console runs on SQLite for a zero-setup demo; tests and CI use PostgreSQL.
DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{BASE_DIR / 'var' / 'db.sqlite3'}")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0))}
# Each test run gets its own database so that parallel runs on one server never collide.
DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME", f"test_inferchain_{os.getpid()}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The zero-setup demo has several writer processes (web, worker, node agents): take the write lock
    # at BEGIN and wait for it, instead of failing with "database is locked" on a read-to-write upgrade.
    DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Every Redis key the product writes starts with this, so test runs and deployments can share a server.
REDIS_KEY_PREFIX = env_str("REDIS_KEY_PREFIX", f"ictest{os.getpid()}:" if "pytest" in sys.modules else "ic:")

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": f"{REDIS_KEY_PREFIX}asgi"},
    }
}

# Evaluation runs that cannot lie (docs/evaluations.md, "Runs that cannot lie"): a run whose failed
# samples exceed this fraction of its cases ends `failed` (resume it once the engines answer), and a
# run is accepted only with at least this many scored samples (both sides answered).
EVAL_MAX_ERROR_FRACTION = env_float("EVAL_MAX_ERROR_FRACTION", 0.05)
EVAL_MIN_SCORED_SAMPLES = env_int("EVAL_MIN_SCORED_SAMPLES", 20)
# The k teacher forcing asks each side for (the largest an engine allows, vLLM's --max-logprobs, when it
# refuses more). 20 is vLLM's default cap; 1,000 (with the engines' --max-logprobs raised to match) holds
# whole distributions and makes the KL exact, at about 50 kB of JSON per token and ~70 ms of scoring per
# 128-token sample; -1 asks for the whole vocabulary, which vLLM sends as 128,256 entries per token.
# docs/evaluations.md, "Exact or top-k".
EVAL_KL_TOP_K = env_int("EVAL_KL_TOP_K", 20)
# How long creating a run waits for a base-URL side's /v1/models before refusing it, seconds.
EVAL_READY_PROBE_SECONDS = env_float("EVAL_READY_PROBE_SECONDS", 3.0)

# How often the beat task evaluates every running canary's gates, seconds.
ROLLOUT_GATE_INTERVAL_SECONDS = env_float("ROLLOUT_GATE_INTERVAL_SECONDS", 10.0)
# Gate values kept per rollout for the console's chart (one per evaluation), and for how long.
ROLLOUT_GATE_SAMPLES = env_int("ROLLOUT_GATE_SAMPLES", 2000)
ROLLOUT_GATE_SAMPLES_TTL_SECONDS = env_float("ROLLOUT_GATE_SAMPLES_TTL_SECONDS", 14 * 86400.0)

# Alerts in the console (docs/monitoring.md "Alerts in the console"): how often beat evaluates the rules.
ALERT_EVALUATE_INTERVAL_SECONDS = env_float("ALERT_EVALUATE_INTERVAL_SECONDS", 15.0)
# Where firing and resolved messages go ({"text": ...}, Slack's incoming-webhook shape); empty: nowhere.
# A secret (a Slack URL carries its token): never logged; ALERT_WEBHOOK_URL_FILE works as for other secrets.
ALERT_WEBHOOK_URL = env_secret("ALERT_WEBHOOK_URL", "")
ALERT_WEBHOOK_TIMEOUT_SECONDS = env_float("ALERT_WEBHOOK_TIMEOUT_SECONDS", 5.0)
# A failed delivery is tried again after this many seconds, doubling up to the cap, at most this often.
ALERT_WEBHOOK_BACKOFF_SECONDS = env_float("ALERT_WEBHOOK_BACKOFF_SECONDS", 5.0)
ALERT_WEBHOOK_BACKOFF_MAX_SECONDS = env_float("ALERT_WEBHOOK_BACKOFF_MAX_SECONDS", 300.0)
ALERT_WEBHOOK_MAX_ATTEMPTS = env_int("ALERT_WEBHOOK_MAX_ATTEMPTS", 8)

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", "") or None
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# With acks late, a task whose worker died (SIGKILL, OOM, lost host) stays unacknowledged in Redis and is
# delivered again to a live worker once this long has passed since its delivery; every task is
# idempotent, so the rerun finishes the work without doing any of it twice. Longer than any task runs.
CELERY_VISIBILITY_TIMEOUT_S = env_float("CELERY_VISIBILITY_TIMEOUT_S", 3600.0)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "global_keyprefix": REDIS_KEY_PREFIX,
    "visibility_timeout": CELERY_VISIBILITY_TIMEOUT_S,
}
# Every periodic task, in one place (beat reads it); each task is idempotent.
# How often beat looks for engines idle past their sleep threshold (routing/scaling/sleep.py).
SLEEP_CHECK_INTERVAL_SECONDS = env_float("SLEEP_CHECK_INTERVAL_SECONDS", 10.0)
CELERY_BEAT_SCHEDULE = {
    # The bound for "unreachable" is NODE_UNREACHABLE_SECONDS after the last heartbeat plus this period
    # (docs/nodes.md); the sweep is one indexed query.
    "nodes-host-heartbeat-sweep": {"task": "nodes.check_host_heartbeats", "schedule": 2.0},
    # Pool autoscaling (routing/scaling/autoscaler.py; the task keeps the name it had in the nodes app):
    # each policy is evaluated once per its own interval; the tick only bounds how late an evaluation can be.
    "nodes-scaling-evaluate": {"task": "nodes.evaluate_scaling", "schedule": 2.0},
    "routing-request-log-partitions-and-retention": {"task": "routing.prune_request_log", "schedule": 3600.0},
    # Canary gates (routing.rollouts): each running rollout advanced, held, promoted or rolled back.
    "routing-rollout-gates": {"task": "routing.evaluate_rollouts", "schedule": ROLLOUT_GATE_INTERVAL_SECONDS},
    # Console alerts: the rules evaluated, state changes recorded, webhook messages queued and sent.
    "alerts-evaluate": {"task": "alerts.evaluate", "schedule": ALERT_EVALUATE_INTERVAL_SECONDS},
    # Charts' history (routing/rollups/, docs/monitoring.md "History"): one bulk insert of 10 s points per
    # tick, their 1 min and 1 h aggregates a slice every 10 s, pruning past each resolution's retention
    # hourly.
    "routing-history-rollup": {"task": "routing.rollup_history", "schedule": 10.0},
    "routing-sleep-idle-engines": {
        "task": "routing.sleep_idle_engines",
        "schedule": SLEEP_CHECK_INTERVAL_SECONDS,
    },
    # The 1 min and 1 h points a slice a run (HISTORY_*_PER_RUN): a big fleet's minute is in nine runs.
    "routing-history-aggregate": {"task": "routing.aggregate_history", "schedule": 5.0},
    "routing-history-aggregate-hours": {"task": "routing.aggregate_history_hours", "schedule": 10.0},
    "routing-history-prune": {"task": "routing.prune_history", "schedule": 3600.0},
    # The fleet exposition rendered ahead of FLEET_METRICS_MAX_AGE_SECONDS while someone scrapes /metrics,
    # in the worker so that the web processes keep their CPU for the agents' syncs (routing/fleet_metrics.py).
    "routing-fleet-metrics-refresh": {"task": "routing.refresh_fleet_metrics", "schedule": 1.0},
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# WhiteNoise warns at every start when STATIC_ROOT is missing; the SPA is served from FRONTEND_DIST
# through the finders, so an empty directory is all it needs until someone runs collectstatic.
with contextlib.suppress(OSError):
    STATIC_ROOT.mkdir(exist_ok=True)
FRONTEND_DIST = BASE_DIR / "frontend" / "dist"
STATICFILES_DIRS = [FRONTEND_DIST] if FRONTEND_DIST.exists() else []
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Security of the console (docs/security.md). Behind a TLS-terminating proxy (BEHIND_TLS_PROXY=true) Django
# trusts that proxy's X-Forwarded-Proto for request.is_secure(), and the cookies are sent over HTTPS only.
# Only set it when such a proxy overwrites the header: a client could otherwise claim HTTPS.
BEHIND_TLS_PROXY = env_bool("BEHIND_TLS_PROXY", False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if BEHIND_TLS_PROXY else None
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", BEHIND_TLS_PROXY)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
# The SPA reads the CSRF cookie to echo it in X-CSRFToken, so it cannot be HttpOnly (Django's docs: no
# protection is lost, the token is not a secret from the page). Lax: a cross-site POST carries neither.
SESSION_COOKIE_SAMESITE = env_str("SESSION_COOKIE_SAMESITE", "Lax")
CSRF_COOKIE_SAMESITE = SESSION_COOKIE_SAMESITE
# A console session ends this long after sign-in, whatever the activity (then the SPA sends you to sign in).
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE_SECONDS", 12 * 3600)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Failed console sign-ins, counted in Redis so the limit holds across web processes: past the limit per
# username or per source address within the window, sign-in answers 429 until the window ends.
LOGIN_FAILURE_WINDOW_SECONDS = env_int("LOGIN_FAILURE_WINDOW_SECONDS", 900)
LOGIN_MAX_FAILURES_PER_USERNAME = env_int("LOGIN_MAX_FAILURES_PER_USERNAME", 5)
LOGIN_MAX_FAILURES_PER_ADDRESS = env_int("LOGIN_MAX_FAILURES_PER_ADDRESS", 20)
# The header that carries the client's address when a proxy sits in front (e.g. X-Forwarded-For; its
# last entry, the one the nearest proxy appended, is used); empty: the socket's peer address.
LOGIN_CLIENT_ADDRESS_HEADER = env_str("LOGIN_CLIENT_ADDRESS_HEADER", "")
# The bearer token Prometheus sends to read /metrics and the proxy's /metrics (core/metrics_access.py);
# empty: open, for the demo (they show per-tenant counts: keep them off networks tenants reach).
METRICS_TOKEN = env_secret("METRICS_TOKEN", "")
# The fleet exposition (/metrics, routing/fleet_metrics.py) is rendered at most this often for the whole
# control plane and served from Redis: a scrape never gets numbers read longer ago than this (plus the
# agent's tick). 0: rendered on every scrape (18.7 MB of text at 1,000 hosts x 8 GPUs, 5,000 engines).
FLEET_METRICS_MAX_AGE_SECONDS = env_float("FLEET_METRICS_MAX_AGE_SECONDS", 5.0)
# The console's Content-Security-Policy (core/security.py): scripts only from this origin, no inline ones.
CONTENT_SECURITY_POLICY = env_str(
    "CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'",
)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first, so a request without credentials gets 401 with a WWW-Authenticate header.
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["console.permissions.RolePermission"],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
        "rest_framework.filters.SearchFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "core.api.schema.ResponseFieldsAutoSchema",
    "EXCEPTION_HANDLER": "core.api.errors.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "inferchain control plane API",
    "DESCRIPTION": "Nodes, models, deployments, tenants, keys, quotas and routing of an LLM server chain.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # /api/docs/ serves Swagger UI from the pinned drf-spectacular-sidecar package, never from a CDN:
    # the docs page works offline and shows the version that was installed.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # One name per choice set, wherever a field of that set appears (the console's types use these).
    "ENUM_NAME_OVERRIDES": {
        "DeploymentStateEnum": "nodes.choices.DeploymentState",
        "HostStateEnum": "nodes.choices.HostState",
        "VersionStateEnum": "models_registry.choices.VersionState",
        "StoreKindEnum": "models_registry.choices.StoreKind",
        # Names the console's types already use, kept when another serializer has a field of the same name.
        "ActionEnum": "core.choices.AuditAction",
        "KindEnum": "models_registry.choices.ProblemKind",
        "RoleEnum": "console.choices.Role",
        "RolloutStateEnum": "routing.models.RolloutState",
        "AlertStateEnum": "alerts.choices.AlertState",
        "AlertMetricEnum": "alerts.choices.Metric",
        "AlertSeverityEnum": "alerts.choices.Severity",
        "AlertTransitionEnum": "alerts.choices.Transition",
        "AlertDeliveryStatusEnum": "alerts.choices.DeliveryStatus",
    },
}

# Directories under which model files may be registered from a server-side path.
MODEL_ROOTS = [Path(p) for p in env_list("MODEL_ROOTS", [str(BASE_DIR / "var" / "models")])]

# Node agent identity: the host name this process acts for when it runs as an agent.
NODE_NAME = env_str("NODE_NAME", "")
# The demo fleet's engine ports start here (four engines: BASE to BASE+3).
DEMO_ENGINE_PORT_BASE = env_int("DEMO_ENGINE_PORT_BASE", 8101)
# Node agents and their supervision; docs/nodes.md explains each.
NODE_HEARTBEAT_SECONDS = env_float("NODE_HEARTBEAT_SECONDS", 2.0)
# Telemetry and supervision tick of the agent.
NODE_TELEMETRY_SECONDS = env_float("NODE_TELEMETRY_SECONDS", 1.0)
# A host with no heartbeat for this long is unreachable.
NODE_UNREACHABLE_SECONDS = env_float("NODE_UNREACHABLE_SECONDS", 6.0)
# Running or waiting requests but no token progress (or no probe answered) for this long: hung.
NODE_HANG_SECONDS = env_float("NODE_HANG_SECONDS", 30.0)
NODE_STARTUP_TIMEOUT_SECONDS = env_float("NODE_STARTUP_TIMEOUT_SECONDS", 900.0)
NODE_STOP_TIMEOUT_SECONDS = env_float("NODE_STOP_TIMEOUT_SECONDS", 20.0)
# A drain reads the engine's in-flight count only after this long: the time proxies take to drop the
# endpoint (config change over pub/sub, then a snapshot reload), so a request routed just before the
# drain began has reached the engine and is counted, not cut by the stop.
NODE_DRAIN_SETTLE_SECONDS = env_float("NODE_DRAIN_SETTLE_SECONDS", 1.0)
NODE_MAX_RESTARTS = env_int("NODE_MAX_RESTARTS", 5)
NODE_RESTART_BACKOFF_SECONDS = env_float("NODE_RESTART_BACKOFF_SECONDS", 2.0)
NODE_RESTART_BACKOFF_MAX_SECONDS = env_float("NODE_RESTART_BACKOFF_MAX_SECONDS", 60.0)
# Ready for this long resets the failed-restart count.
NODE_STABLE_SECONDS = env_float("NODE_STABLE_SECONDS", 120.0)
# Live values in Redis expire after this, so a dead agent's numbers never look current.
NODE_LIVE_TTL_SECONDS = env_float("NODE_LIVE_TTL_SECONDS", 5.0)
# The object store of each Ray node an agent starts for a deployment spanning hosts (`ray start
# --object-store-memory`; Ray's own default is 30% of the host's memory, and vLLM moves tensors through
# its own channels, not Ray objects). Ray's minimum is 75 MiB.
RAY_OBJECT_STORE_BYTES = env_int("RAY_OBJECT_STORE_BYTES", 256 * 1024 * 1024)
# GPU and engine samples kept in Redis for the console's charts (nodes/history.py).
NODE_HISTORY_SECONDS = env_float("NODE_HISTORY_SECONDS", 3600.0)
# How long the deployment page waits for a remote agent to answer a log request (docs/nodes.md).
AGENT_LOG_TIMEOUT_SECONDS = env_float("AGENT_LOG_TIMEOUT_SECONDS", 5.0)
# How long a host's sync snapshot lets the ingest answer its agent's routine syncs without a full sync,
# at most (nodes/agent_generation.py): the bound on a change whose write forgot to bump the generation.
AGENT_SNAPSHOT_SECONDS = env_float("AGENT_SNAPSHOT_SECONDS", 300.0)
# The largest agent sync body the ingest reads (a host with 1,000 engines sends about 600 KB), and how
# long it waits for the whole body: a slow or hostile agent cannot hold a worker's memory or time.
AGENT_SYNC_MAX_BYTES = env_int("AGENT_SYNC_MAX_BYTES", 4 * 1024 * 1024)
AGENT_SYNC_BODY_SECONDS = env_float("AGENT_SYNC_BODY_SECONDS", 10.0)
# Full agent syncs (Django's view) running at once in one web worker; the others wait their turn. Each
# holds a thread and a database connection while it runs (nodes/agent_ingest.py).
AGENT_FULL_SYNCS = env_int("AGENT_FULL_SYNCS", 4)
# Where `seed_demo` writes the demo hosts' agent tokens (one file per host, mode 0600; Procfile --token-file).
AGENT_TOKEN_DIR = Path(env_str("AGENT_TOKEN_DIR", str(BASE_DIR / "var" / "agent-tokens")))
ENGINE_LOG_DIR = Path(env_str("ENGINE_LOG_DIR", str(BASE_DIR / "var" / "engines")))
ENGINE_LOG_MAX_BYTES = env_int("ENGINE_LOG_MAX_BYTES", 20 * 1024 * 1024)
ENGINE_LOG_KEEP = env_int("ENGINE_LOG_KEEP", 5)
# This host's own model root: versions fetched from the active model store land in
# <NODE_MODEL_ROOT>/<manifest digest>/ (docs/nodes.md, "Model files from the store").
NODE_MODEL_ROOT = Path(env_str("NODE_MODEL_ROOT", str(BASE_DIR / "var" / "model-cache")))
# Bound of that root in bytes, least recently used versions evicted first; 0: no bound.
NODE_MODEL_CACHE_BYTES = env_int("NODE_MODEL_CACHE_BYTES", 0)
# A store that sends nothing is retried this many times (waits doubling) before the launch fails.
NODE_MODEL_FETCH_RETRIES = env_int("NODE_MODEL_FETCH_RETRIES", 5)
NODE_MODEL_FETCH_RETRY_SECONDS = env_float("NODE_MODEL_FETCH_RETRY_SECONDS", 1.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"routine_tasks": {"()": "core.logs.RoutineTaskFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        name: {"filters": ["routine_tasks"]}
        for name in ("celery.beat", "celery.worker.strategy", "celery.app.trace")
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

# The quota a tenant starts with when it is created through the API or the console (whose dialog shows
# these, prefilled); docs/tenants.md. One variable per limit, DEFAULT_TENANT_QUOTA_<LIMIT>: a whole number,
# or "none" for no limit. Changing them changes no existing tenant. The defaults bound one new tenant to
# about a request a second, a few concurrent requests and a day's trial budget, so that a forgotten
# quota cannot let one tenant take a shared fleet; per-request caps are left to the models' context.
DEFAULT_TENANT_QUOTA = {
    "requests_per_minute": env_limit("DEFAULT_TENANT_QUOTA_REQUESTS_PER_MINUTE", 60),
    "tokens_per_minute": env_limit("DEFAULT_TENANT_QUOTA_TOKENS_PER_MINUTE", 100_000),
    "max_concurrent_requests": env_limit("DEFAULT_TENANT_QUOTA_MAX_CONCURRENT_REQUESTS", 8),
    "daily_token_budget": env_limit("DEFAULT_TENANT_QUOTA_DAILY_TOKEN_BUDGET", 2_000_000),
    "max_input_tokens": env_limit("DEFAULT_TENANT_QUOTA_MAX_INPUT_TOKENS", None),
    "max_output_tokens": env_limit("DEFAULT_TENANT_QUOTA_MAX_OUTPUT_TOKENS", None),
}

# The /v1/ proxy (routing/); docs/proxy.md explains each.
PROXY_MAX_BODY_BYTES = env_int("PROXY_MAX_BODY_BYTES", 4 * 1024 * 1024)
# Prompts of at least this many tokens count as "long" in the proxy's per-pool request metrics.
PROXY_LONG_PROMPT_TOKENS = env_int("PROXY_LONG_PROMPT_TOKENS", 2048)
# What admission does while Redis is unreachable: "reject" (503 for keys with counted limits, fail closed);
# the only mode implemented, see docs/proxy.md.
PROXY_LIMITS_ON_REDIS_DOWN = env_str("PROXY_LIMITS_ON_REDIS_DOWN", "reject")
# Extra endpoints outside the fleet, "alias=http://host:port[|engine-key],...", e.g. for benchmarks.
PROXY_STATIC_ENDPOINTS = env_str("PROXY_STATIC_ENDPOINTS", "")
# How long a concurrency lease outlives the last renewal: a killed proxy's in-flight requests stop
# counting against max_concurrent_requests after at most this long. Renewed every third of it.
PROXY_LEASE_MS = env_int("PROXY_LEASE_MS", 30_000)
# How long a proxy process may admit a busy key's requests out of an allowance Redis set aside for it
# (no round trip per request; the limits stay exact across processes). 0: every admission asks Redis.
PROXY_LIMIT_ALLOWANCE_MS = env_int("PROXY_LIMIT_ALLOWANCE_MS", 250)
PROXY_CONFIG_REFRESH_SECONDS = env_float("PROXY_CONFIG_REFRESH_SECONDS", 30.0)
# An engine's live KV sample older than this counts as missing (best_fit and the spill's KV cap then go by
# in-flight counts). A sample is up to one agent telemetry period old before the next, plus the sync and
# the proxy's 0.25 s poll; 2.5 periods let one late sync pass without the state vanishing (dispatches since
# the sample are counted against it in the meantime).
PROXY_LIVE_STALE_SECONDS = env_float("PROXY_LIVE_STALE_SECONDS", 2.5 * NODE_TELEMETRY_SECONDS)
# An integer seeds the `random` scorer's draws (benchmarks repeat a run with it); empty: seeded by the OS.
PROXY_RANDOM_SEED = env_str("PROXY_RANDOM_SEED", "")
# SLO classes (routing.choices.SloClass): each one's targets for TTFT and time per output token, in
# seconds, "ttft/tpot". The `slo_cost` scorer sends a request to the cheapest engine predicted to meet
# its class's; a tenant or key without a class of its own gets PROXY_DEFAULT_SLO_CLASS.
PROXY_SLO_CLASSES = {
    "interactive": env_str("PROXY_SLO_INTERACTIVE", "0.5/0.05"),
    "standard": env_str("PROXY_SLO_STANDARD", "2/0.1"),
    "batch": env_str("PROXY_SLO_BATCH", "30/0.5"),
}
PROXY_DEFAULT_SLO_CLASS = env_str("PROXY_DEFAULT_SLO_CLASS", "standard")
# Failed API-key attempts (malformed or unknown keys) one source address may make per window, counted
# across proxy processes in Redis; beyond it the address gets 429 until the window ends. 0 turns it off.
PROXY_AUTH_FAILURES_PER_WINDOW = env_int("PROXY_AUTH_FAILURES_PER_WINDOW", 60)
PROXY_AUTH_FAILURE_WINDOW_SECONDS = env_float("PROXY_AUTH_FAILURE_WINDOW_SECONDS", 60.0)
REQUEST_LOG_RETENTION_DAYS = env_int("REQUEST_LOG_RETENTION_DAYS", 30)
# How long the charts' history keeps each resolution (routing/rollups/): 10 s points, 1 min, 1 h.
HISTORY_KEEP_10S_HOURS = env_float("HISTORY_KEEP_10S_HOURS", 24.0)
HISTORY_KEEP_1MIN_DAYS = env_float("HISTORY_KEEP_1MIN_DAYS", 7.0)
HISTORY_KEEP_1H_DAYS = env_float("HISTORY_KEEP_1H_DAYS", 90.0)
# ... and at most this much disk (PostgreSQL): past it the oldest 10 s, then 1 min, then 1 h partitions go
# first, down to a floor per resolution (routing/rollups/partitions.py FLOOR; docs/capacity.md).
HISTORY_MAX_GB = env_float("HISTORY_MAX_GB", 5.0)
# The 1 min and 1 h points are written a slice a run (every 5 and 10 s): this many hosts' GPU and engine
# rows (more past 8 slices a minute, 200 an hour), then the pools' and tenants' request rows (an hour's this
# many at a time), so no run combines a whole minute or hour of a big fleet at once
# (routing/rollups/services.py, `aggregate_slice`; docs/benchmarks.md).
HISTORY_MINUTE_HOSTS_PER_RUN = env_int("HISTORY_MINUTE_HOSTS_PER_RUN", 125)
HISTORY_HOUR_HOSTS_PER_RUN = env_int("HISTORY_HOUR_HOSTS_PER_RUN", 10)
HISTORY_HOUR_REQUEST_SUBJECTS_PER_RUN = env_int("HISTORY_HOUR_REQUEST_SUBJECTS_PER_RUN", 15)
REQUEST_LOG_PARTITIONS_AHEAD = env_int("REQUEST_LOG_PARTITIONS_AHEAD", 3)
REQUEST_LOG_SPOOL_DIR = Path(
    env_str("REQUEST_LOG_SPOOL_DIR", str(BASE_DIR / "var" / "spool" / "request_log"))
)
