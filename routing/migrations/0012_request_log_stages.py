"""Request log: per-stage outcomes and times of the request's stage chain (`stages`, JSON).

Nullable without a default, like 0004's column: on PostgreSQL one `ALTER TABLE routing_requestlog ADD
COLUMN` on the partitioned parent reaches every partition as a catalog change only (no rewrite), and
partitions created later (`CREATE TABLE ... (LIKE routing_requestlog)`) have it in the same position.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("routing", "0011_stage_chains"),
    ]

    operations = [
        migrations.AddField(
            model_name="requestlog",
            name="stages",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
