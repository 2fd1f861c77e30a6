from django.contrib import admin

from core.models import AuditEvent

admin.site.register(AuditEvent)
