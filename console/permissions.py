"""Role-based permissions, enforced by the API for every view."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from console.choices import Role


def user_role(user: Any) -> str | None:
    if user is None or not user.is_authenticated:
        return None
    if user.is_superuser:
        return Role.ADMIN
    return str(user.role)


class RolePermission(BasePermission):
    """Everyone signed in may read; admins may write; evaluators may write only where a view allows it.

    A view opts evaluators in with `evaluator_writable = True` (evaluations and reviews).
    A view that holds secrets or user accounts sets `admin_only = True` to hide even reads.
    """

    message = "Your role does not allow this action."

    def has_permission(self, request: Request, view: Any) -> bool:
        role = user_role(request.user)
        if role is None:
            return False
        if role == Role.ADMIN:
            return True
        if getattr(view, "admin_only", False):
            return False
        if request.method in SAFE_METHODS:
            return True
        return role == Role.EVALUATOR and bool(getattr(view, "evaluator_writable", False))
