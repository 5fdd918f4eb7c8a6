"""Errors meant for the person running gpuproof: each says what went wrong and what to do."""


class GpuproofError(Exception):
    """A failure with a message fit to print as is (the CLI prints it without a traceback)."""

    exit_code = 2


class FleetError(GpuproofError):
    """A fleet file is malformed. The message names the file and the field."""

    def __init__(self, source: str, field: str, problem: str):
        self.source, self.field, self.problem = source, field, problem
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: {problem}" if field else f"{where}{problem}")


class ControlPlaneError(GpuproofError):
    """The embedded control plane could not be built, started or reached."""


class ClusterError(GpuproofError):
    """The target cluster is unreachable, has no GPUs, or refuses us (permissions)."""


class WaitTimeout(GpuproofError, TimeoutError):
    """A watch-based wait ran past its deadline. The message says what it waited for."""

    exit_code = 3


class ApiUnreachable(WaitTimeout):
    """The API server did not answer until a wait's deadline: what the wait was observing was cut, so the check
    that waited is not judged (a skip naming the wait), never passed or failed."""


class ApiGone(ApiUnreachable):
    """The API server answered a request of the run's nothing for the API deadline (``--api-deadline``): it is taken
    as gone, and the run stops as one cut short by its cluster (exit 75, the report written, issue #41 item 2)."""


class NodeLost(ApiUnreachable):
    """A node the run judges was deleted, or went NotReady, during the run (issue #41 item 4): a wait on a pod bound or
    pinned to it ends at once, and a check on it is not judged (the skip names the node and why), never passed or
    failed. A kind of :class:`ApiUnreachable`, so whatever maps that to 'not judged' maps this too."""

    def __init__(self, node: str, reason: str, what: str = ""):
        self.node, self.reason = node, reason
        super().__init__(f"{reason}; gave up waiting for {what}" if what else reason)


def one_line(exc: BaseException, limit: int = 500) -> str:
    """An error's message on one line (newlines and runs of blanks made one blank), at most ``limit`` characters."""
    return " ".join(str(exc).split())[:limit]
