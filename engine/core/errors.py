"""Errors a user can act on. Their messages are shown as they are: no traceback."""


class LatencyLabError(Exception):
    """Base class: the message is written for the person who caused it."""


class InvalidRequest(LatencyLabError, ValueError):
    """A request the engine will not run (bad sampling values, empty prompt, too long...).

    `param` names the offending field so an API can point at it.
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ContextOverflow(InvalidRequest):
    """The prompt (plus the tokens asked for) does not fit the model's context window."""


class LoadError(LatencyLabError):
    """A model (or tokenizer) could not be loaded; the message says why and what to try."""


# Exit codes of every command (app.py / latency-lab, python -m engine, -m engine.bench, -m server).
EXIT_OK = 0  # done; a bench's own verdict passed
EXIT_FAILURE = 1  # it ran and failed: a model that does not load, a failed request, a bench verdict "ok": false
EXIT_USAGE = 2  # the command line was wrong: a bad flag value (argparse's own errors exit 2 too)


def exit_code(exc: BaseException) -> int:
    """The exit code for an error that ended a command."""
    return EXIT_USAGE if isinstance(exc, InvalidRequest) else EXIT_FAILURE


def first_line(exc: BaseException) -> str:
    """An exception's first line of text (at most 300 characters), for a message a user reads."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else "no details"
