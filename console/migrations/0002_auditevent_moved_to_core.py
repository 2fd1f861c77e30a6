# The audit log moved to the shared floor (core), which every app may import; the table stays where it is.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="AuditEvent")],
            database_operations=[],
        ),
    ]
