"""The one error type of the weights workflow: a one-line message for the user."""

from __future__ import annotations


class WeightsError(Exception):
    """A failure the user can act on; ``str(exc)`` is one line, shown as is by the CLI."""


class SpaceError(WeightsError):
    """The model does not fit in the target filesystem (or in RAM, for tmpfs)."""


class VerifyError(WeightsError):
    """Files are missing, have the wrong size, or the wrong sha256."""
