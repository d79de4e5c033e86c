"""Errors of the sbx service: one class per catalogued code (schemas/errors.json,
generated into _codes.py), all subclasses of SbxError, which carries the code, the
HTTP status and the service's message (written for a person or a model to act on)."""
from ._codes import CODES


class SbxError(Exception):
    """A failure the service (or the way to it) reported: .code, .status, .message."""
    code = "internal"

    def __init__(self, message, code=None, status=None):
        super().__init__(f"{message} ({code or self.code})")
        self.message = message
        self.code = code or self.code
        self.status = status if status is not None else CODES.get(self.code, (500, ""))[0]


def _class_name(code):
    return "".join(part.capitalize() for part in code.split("_")) + "Error"


#  NotFoundError, InvalidArgumentError, UnavailableError, TimeoutError (as SbxTimeoutError
#  too, beside Python's own), ...
ERRORS = {}
for _code, (_status, _doc) in CODES.items():
    ERRORS[_code] = type(_class_name(_code), (SbxError,), {"code": _code, "__doc__": _doc})
    globals()[_class_name(_code)] = ERRORS[_code]
SbxTimeoutError = ERRORS["timeout"]


def error_for(code, message, status=None):
    """The SbxError subclass instance for a catalogued code (SbxError for another)."""
    return ERRORS.get(code, SbxError)(message, code=code, status=status)
