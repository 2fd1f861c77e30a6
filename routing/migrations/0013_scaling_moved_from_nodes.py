# The scaling policy and its decisions, moved here from the nodes app (nodes 0009): state only, the models
# keep their tables `nodes_scalingpolicy` and `nodes_scalingdecision` (Meta.db_table), rows and all.
# What named them by app follows: their content types (so permissions and admin log entries still point at
# them) and the audit log's object type `nodes.scalingpolicy` (so a policy's trail stays under one name).

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

MODELS = ("scalingpolicy", "scalingdecision")


def relabel(apps, schema_editor, old: str, new: str) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        # A row already under the new label (a database whose post_migrate ran in between) wins.
        if not content_type.objects.filter(app_label=new, model=model).exists():
            content_type.objects.filter(app_label=old, model=model).update(app_label=new)
    audit_event = apps.get_model("core", "AuditEvent")
    for model in MODELS:
        audit_event.objects.filter(object_type=f"{old}.{model}").update(object_type=f"{new}.{model}")


def forwards(apps, schema_editor) -> None:
    relabel(apps, schema_editor, "nodes", "routing")


def backwards(apps, schema_editor) -> None:
    relabel(apps, schema_editor, "routing", "nodes")


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("core", "0001_initial"),
        ("nodes", "0009_scaling_moved_to_routing"),
        ("routing", "0012_request_log_stages"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ScalingPolicy",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("enabled", models.BooleanField(default=True)),
                        ("min_engines", models.PositiveSmallIntegerField(default=1)),
                        ("max_engines", models.PositiveSmallIntegerField(default=4)),
                        (
                            "target_waiting_per_engine",
                            models.FloatField(
                                default=2.0, validators=[django.core.validators.MinValueValidator(0.0)]
                            ),
                        ),
                        (
                            "target_kv_usage",
                            models.FloatField(
                                default=0.8,
                                validators=[
                                    django.core.validators.MinValueValidator(0.01),
                                    django.core.validators.MaxValueValidator(1.0),
                                ],
                            ),
                        ),
                        (
                            "target_ttft_ratio",
                            models.FloatField(
                                blank=True,
                                default=None,
                                null=True,
                                validators=[django.core.validators.MinValueValidator(1.0)],
                            ),
                        ),
                        ("scale_up_cooldown_s", models.PositiveIntegerField(default=30)),
                        ("scale_down_cooldown_s", models.PositiveIntegerField(default=300)),
                        (
                            "evaluation_interval_s",
                            models.PositiveIntegerField(
                                default=10, validators=[django.core.validators.MinValueValidator(1)]
                            ),
                        ),
                        ("last_evaluated_at", models.DateTimeField(blank=True, null=True)),
                        ("last_target_engines", models.PositiveSmallIntegerField(blank=True, null=True)),
                        ("last_reason", models.TextField(blank=True, default="")),
                        ("last_metrics", models.JSONField(blank=True, default=dict)),
                        ("quiet_since", models.DateTimeField(blank=True, null=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                        (
                            "pool",
                            models.OneToOneField(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="scaling_policy",
                                to="routing.routepool",
                            ),
                        ),
                        (
                            "template",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="scaling_templates",
                                to="nodes.deployment",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name_plural": "scaling policies",
                        "db_table": "nodes_scalingpolicy",
                        "ordering": ["pool__name"],
                    },
                ),
                migrations.CreateModel(
                    name="ScalingDecision",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("at", models.DateTimeField(db_index=True)),
                        ("interval", models.BigIntegerField()),
                        (
                            "action",
                            models.CharField(
                                choices=[
                                    ("scale_up", "Scale up"),
                                    ("scale_down", "Scale down"),
                                    ("replace", "Replace"),
                                    ("blocked", "Blocked"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("reason", models.TextField()),
                        ("engines_before", models.PositiveSmallIntegerField()),
                        ("engines_after", models.PositiveSmallIntegerField()),
                        ("metrics", models.JSONField(blank=True, default=dict)),
                        ("deployment_name", models.CharField(blank=True, default="", max_length=100)),
                        ("host_name", models.CharField(blank=True, default="", max_length=63)),
                        (
                            "deployment",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="scaling_decisions",
                                to="nodes.deployment",
                            ),
                        ),
                        (
                            "policy",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="decisions",
                                to="routing.scalingpolicy",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "nodes_scalingdecision",
                        "ordering": ["-at", "-id"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("policy", "interval"), name="scaling_decision_once_per_interval"
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
