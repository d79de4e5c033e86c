"""sbx: Linux microVM sandboxes for AI agents, from Python.

    from sbx import Sandbox
    with Sandbox.create(name="demo") as sb:
        print(sb.commands.run("python3 -c 'print(2**100)'").stdout)

Reads SBX_URL, SBX_API_KEY and SBX_CA_CERT unless given them (url=, api_key=, ca_cert=).
"""
from .errors import ERRORS, SbxError, SbxTimeoutError, error_for
from .errors import *  # noqa: F401,F403  (NotFoundError, UnavailableError, ...)
from .sandbox import CommandHandle, CommandResult, Sandbox, SandboxPage
from .template import Template

__version__ = "0.1.0"
__all__ = ["Sandbox", "SandboxPage", "Template", "CommandResult", "CommandHandle", "SbxError", "SbxTimeoutError",
           "error_for", "ERRORS"] + [cls.__name__ for cls in ERRORS.values()]
