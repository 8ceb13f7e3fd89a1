"""One error family. Every message says what went wrong *and* what to do about it."""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    INVALID_SPEC = "invalid_spec"
    INVALID_INPUT = "invalid_input"
    NOT_FITTED = "not_fitted"
    TOO_FEW_SAMPLES = "too_few_samples"
    INFEASIBLE = "infeasible"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"
    CONFLICT = "conflict"


class DLRoverError(Exception):
    """Base of every error this project raises on purpose.

    ``problems`` holds one line per problem (a spec with three mistakes gives three lines);
    ``str(err)`` joins them under a heading so the CLI can print it without a traceback.
    """

    kind: ErrorKind = ErrorKind.INVALID_INPUT

    def __init__(self, message: str, *, problems: list[str] | None = None) -> None:
        self.message = message
        self.problems = list(problems or [])
        super().__init__(self.__str__())

    def __str__(self) -> str:
        if not self.problems:
            return self.message
        lines = [self.message] + [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


class SpecError(DLRoverError):
    kind = ErrorKind.INVALID_SPEC


class InputError(DLRoverError):
    kind = ErrorKind.INVALID_INPUT


class NotFittedError(DLRoverError):
    kind = ErrorKind.NOT_FITTED


class TooFewSamplesError(DLRoverError):
    kind = ErrorKind.TOO_FEW_SAMPLES


class InfeasibleError(DLRoverError):
    kind = ErrorKind.INFEASIBLE


class StoreUnavailableError(DLRoverError):
    kind = ErrorKind.UNAVAILABLE
