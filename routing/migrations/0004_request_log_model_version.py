"""Request log: the model version that answered (`model_version_id`).

A nullable column without a default, so on PostgreSQL one `ALTER TABLE routing_requestlog ADD COLUMN`
on the partitioned parent reaches every partition (day partitions and the default one) as a catalog
change only: no table rewrite, no copy, a brief lock. Partitions created later
(`routing.services.create_request_log_partition`, `CREATE TABLE ... (LIKE routing_requestlog)`) have it
in the same position, so moving rows out of the default partition (`INSERT ... SELECT *`) still lines
up. On SQLite (the plain table of the demo) it is an ordinary added column.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("routing", "0003_request_log_partitioned"),
    ]

    operations = [
        migrations.AddField(
            model_name="requestlog",
            name="model_version_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
    ]
