# The scaling policy and its decisions moved to the routing app (routing/scaling/), since a policy belongs
# to one route pool: state only, the tables `nodes_scalingpolicy` and `nodes_scalingdecision` stay as they
# are and routing 0013 takes them over.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0008_deployment_members"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="ScalingDecision"),
                migrations.DeleteModel(name="ScalingPolicy"),
            ],
            database_operations=[],
        ),
    ]
