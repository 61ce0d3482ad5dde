"""The exceptions of bnps: one class per status code the servers and the
client library give (absl::StatusCode), all subclasses of BnpsError.

    DeadlineExceeded    a barrier other workers did not reach in time; the
                        message names them (also a TimeoutError)
    Unavailable         a server cannot be reached (also a ConnectionError)
    FailedPrecondition  a call the job's policy does not allow, a lost
                        worker, a step out of order
    InvalidArgument     bad arguments (also a ValueError)
    NotFound            e.g. running statistics the servers do not have yet
"""


class BnpsError(RuntimeError):
    """A call to the bnps servers failed. `code` is the numeric status code,
    `code_name` its name ("DEADLINE_EXCEEDED"), and str() the message."""

    def __init__(self, code, code_name, message):
        super().__init__(f"{code_name}: {message}")
        self.code = code
        self.code_name = code_name
        self.message = message


class InvalidArgument(BnpsError, ValueError):
    pass


class DeadlineExceeded(BnpsError, TimeoutError):
    pass


class NotFound(BnpsError):
    pass


class FailedPrecondition(BnpsError):
    pass


class Unavailable(BnpsError, ConnectionError):
    pass


_BY_NAME = {
    "INVALID_ARGUMENT": InvalidArgument,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "NOT_FOUND": NotFound,
    "FAILED_PRECONDITION": FailedPrecondition,
    "UNAVAILABLE": Unavailable,
}


def from_native(error):
    """The BnpsError for a bnps._native.Error (args: code, name, message)."""
    code, name, message = error.args
    return _BY_NAME.get(name, BnpsError)(code, name, message)
