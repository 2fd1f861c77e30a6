from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from console.models import ApiKey, Quota, Tenant, User

admin.site.register(User, UserAdmin)
admin.site.register(Tenant)
admin.site.register(Quota)
admin.site.register(ApiKey)
