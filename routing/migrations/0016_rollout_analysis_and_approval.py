"""Rollouts: each step's analysis (limits, dry-run gates, the step's measurement counts) and approval steps.

`analysis`, `approval_steps` and `analysis_state` are new JSON columns with empty defaults, so existing
rollouts keep their behaviour (failure limit 0: the first failed measurement rolls back; no inconclusive
limit: hold until the data decides; no approval steps). The new state `awaiting_approval` is an active
state, so the one-active-rollout-per-alias constraint is made again with it.
"""

from django.db import migrations, models

ACTIVE = ["running", "paused", "holding", "awaiting_approval"]


class Migration(migrations.Migration):
    dependencies = [
        ("routing", "0015_request_log_lookup_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="rollout",
            name="analysis",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="rollout",
            name="approval_steps",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="rollout",
            name="analysis_state",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AlterField(
            model_name="rollout",
            name="state",
            field=models.CharField(
                choices=[
                    ("running", "Running"),
                    ("paused", "Paused"),
                    ("holding", "Holding"),
                    ("awaiting_approval", "Awaiting Approval"),
                    ("promoted", "Promoted"),
                    ("rolled_back", "Rolled Back"),
                    ("cancelled", "Cancelled"),
                ],
                default="running",
                max_length=20,
            ),
        ),
        migrations.AlterField(
            model_name="rolloutdecision",
            name="action",
            field=models.CharField(
                choices=[
                    ("start", "Start"),
                    ("advance", "Advance"),
                    ("hold", "Hold"),
                    ("rollback", "Rollback"),
                    ("promote", "Promote"),
                    ("pause", "Pause"),
                    ("resume", "Resume"),
                    ("cancel", "Cancel"),
                    ("await_approval", "Await Approval"),
                    ("approve", "Approve"),
                ],
                max_length=16,
            ),
        ),
        migrations.RemoveConstraint(model_name="rollout", name="one_active_rollout_per_alias"),
        migrations.AddConstraint(
            model_name="rollout",
            constraint=models.UniqueConstraint(
                condition=models.Q(("state__in", ACTIVE)),
                fields=("alias",),
                name="one_active_rollout_per_alias",
            ),
        ),
    ]
