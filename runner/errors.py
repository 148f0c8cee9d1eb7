"""Typed errors for what is not a candidate's fault. Torch-free, so the bot and the parent process can catch them.

A bad candidate never raises: it becomes a Verdict with reasons. These are for a broken problem or a broken machine.
Each maps to one exit status of the one table every command exits by (runner.contract.ExitStatus).
"""


class HarnessError(Exception):
    """Base of everything the harness raises."""


class ProblemError(HarnessError):
    """The problem itself is broken: it fails to import, to build its inputs or to run its reference."""

    def __init__(self, stage: str, where: str, cause: str):
        super().__init__(f"{stage}: {where}: {cause}")
        self.stage, self.where, self.cause = stage, where, cause


class MachineError(HarnessError):
    """The machine cannot run the harness: no GPU where one was asked for, a compiler missing, a dead judge."""


class UsageError(Exception):
    """A configuration or usage mistake: exit status 2 (ExitStatus.USAGE), with a message that names the fix."""

