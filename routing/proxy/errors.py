"""OpenAI-shaped errors: what the official client turns into its own exception classes."""

from __future__ import annotations

import orjson


class ProxyError(Exception):
    """An error the proxy answers with: HTTP status plus OpenAI's {"error": {...}} body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or []

    def body(self) -> bytes:
        return error_body(self.message, type=self.type, code=self.code, param=self.param)


def error_body(message: str, *, type: str, code: str | None = None, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ProxyError:
    return ProxyError(400, message, param=param, code=code)


def unauthorized(message: str = "Invalid API key. Send 'Authorization: Bearer <key>'.") -> ProxyError:
    return ProxyError(401, message, type="authentication_error", code="invalid_api_key")


def not_found(message: str, *, param: str | None = None, code: str = "model_not_found") -> ProxyError:
    return ProxyError(404, message, param=param, code=code)


def rate_limited(message: str, *, code: str, headers: list[tuple[bytes, bytes]]) -> ProxyError:
    return ProxyError(429, message, type="rate_limit_error", code=code, headers=headers)


def unavailable(message: str, *, code: str = "service_unavailable") -> ProxyError:
    return ProxyError(503, message, type="service_unavailable_error", code=code)
