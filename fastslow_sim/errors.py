"""Errors that the toolkit raises for bad input.

`InputError` is a `ValueError` whose message is one sentence naming the offending value and what
was expected. The CLI turns it into that sentence on stderr and exit status 2.
"""


class InputError(ValueError):
    """Bad input from a user: the message names the value and what was expected."""


class ReducibleGeneratorError(InputError):
    """The generator has no unique stationary distribution; `closed_classes` lists its closed classes."""

    def __init__(self, message, closed_classes=(), transient=()):
        super().__init__(message)
        self.closed_classes = [list(c) for c in closed_classes]
        self.transient = list(transient)
