# A deployment that spans hosts may run vLLM's multiprocessing executor (--nnodes, no Ray) instead of a
# Ray cluster; existing rows keep Ray, which is what they ran.

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0009_scaling_moved_to_routing"),
    ]

    operations = [
        migrations.AddField(
            model_name="deployment",
            name="multi_host_backend",
            field=models.CharField(
                choices=[("ray", "Ray"), ("mp", "Multiprocessing (vLLM --nnodes, no Ray)")],
                default="ray",
                max_length=8,
            ),
        ),
        migrations.AddField(
            model_name="deployment",
            name="master_port",
            field=models.PositiveIntegerField(
                blank=True,
                default=None,
                null=True,
                validators=[
                    django.core.validators.MinValueValidator(1024),
                    django.core.validators.MaxValueValidator(65535),
                ],
            ),
        ),
    ]
