# The audit log, moved here from the console app: state only, the table `console_auditevent` stays as it is.

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("console", "0002_auditevent_moved_to_core"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="AuditEvent",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("actor_name", models.CharField(blank=True, default="", max_length=150)),
                        (
                            "action",
                            models.CharField(
                                choices=[
                                    ("create", "Create"),
                                    ("update", "Update"),
                                    ("delete", "Delete"),
                                    ("revoke", "Revoke"),
                                    ("switch", "Switch"),
                                    ("action", "Action"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("object_type", models.CharField(db_index=True, max_length=64)),
                        ("object_id", models.CharField(blank=True, default="", max_length=64)),
                        ("object_repr", models.CharField(blank=True, default="", max_length=200)),
                        ("before", models.JSONField(blank=True, null=True)),
                        ("after", models.JSONField(blank=True, null=True)),
                        (
                            "created_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        (
                            "actor",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "console_auditevent",
                        "ordering": ["-created_at", "-id"],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
