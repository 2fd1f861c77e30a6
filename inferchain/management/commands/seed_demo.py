"""Demo data for `make run`: accounts for each role, a tenant with quotas, and a fresh demo API key."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

from console.choices import Role
from console.models import ApiKey, Tenant, User
from console.services import issue_api_key, revoke_api_key
from models_registry.demo import seed_registry
from nodes.demo import seed_demo_evaluation, seed_demo_fleet
from routing.demo import seed_demo_quota, seed_demo_routing, seed_demo_traffic

DEMO_PASSWORD = "inferchain-demo"
DEMO_USERS = (("admin", Role.ADMIN), ("evaluator", Role.EVALUATOR), ("viewer", Role.VIEWER))
DEMO_KEY_NAME = "demo key (make run)"


class Command(BaseCommand):
    help = "Create demo users, a demo tenant and a fresh demo API key (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            for username, role in DEMO_USERS:
                user, created = User.objects.get_or_create(username=username, defaults={"role": role})
                if created:
                    user.set_password(DEMO_PASSWORD)
                    user.is_staff = role == Role.ADMIN
                    user.save()
            tenant, _ = Tenant.objects.get_or_create(
                name="demo", defaults={"description": "Demo tenant created by make run"}
            )
            seed_demo_quota(tenant)
            # A raw key is never stored, so each run rotates the demo key and shows the new one once.
            for old in ApiKey.objects.filter(tenant=tenant, name=DEMO_KEY_NAME, revoked_at__isnull=True):
                revoke_api_key(old, actor=None)
            issued = issue_api_key(tenant=tenant, name=DEMO_KEY_NAME)
            self.extra_seed()
        # Outside the transaction: the run is executed by the runner (its own transactions, a Redis lock).
        for line in seed_demo_evaluation():
            self.stdout.write(line)
        self.stdout.write(f"demo users: admin, evaluator, viewer (password: {DEMO_PASSWORD})")
        self.stdout.write(f"demo API key for tenant 'demo' (shown once): {issued.raw_key}")

    def extra_seed(self) -> None:
        """Each app's demo data: models, then the fleet that serves them, then the routing over it and the
        demo-traffic tenant whose key the demo_traffic process reads."""
        for seed in (seed_registry, seed_demo_fleet, seed_demo_routing, seed_demo_traffic):
            for line in seed():
                self.stdout.write(line)
