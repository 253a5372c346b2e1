"""The package's one exception family. Each error carries the HTTP status its request gets."""

from typing import Optional


class HandlerError(Exception):
    """Base of every error the handlers raise on purpose."""

    status = 500
    kind = "HandlerError"

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.param = param  # the request field at fault, when one is (OpenAI's error shape names it)


class BadInput(HandlerError):
    """The request itself is wrong: that request alone gets a 400."""

    status = 400
    kind = "BadInput"


class PayloadTooLarge(BadInput):
    """The request body is over the model's size limit."""

    status = 413
    kind = "PayloadTooLarge"


class UnsupportedMediaType(BadInput):
    """The request's content type is not one the model takes."""

    status = 415
    kind = "UnsupportedMediaType"


class ServerFault(HandlerError):
    """Our fault, not the request's: that request alone gets a 500 (the log has the traceback)."""

    status = 500
    kind = "InternalServerError"


class ConfigError(HandlerError):
    """The archive's handler settings are wrong: the model must not load."""

    kind = "ConfigError"


class OutOfMemory(HandlerError):
    """The device ran out of memory on this batch: its requests get a 507, the worker lives."""

    status = 507
    kind = "InsufficientStorage"


class DeadlineExceeded(HandlerError):
    """The request's deadline passed before the model ran: that request alone gets a 504, not computed."""

    status = 504
    kind = "DeadlineExceeded"
