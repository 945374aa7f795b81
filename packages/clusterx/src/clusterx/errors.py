"""User errors of clusterx. Each is a ValueError whose message names the problem and its fix.

The command line prints the message (no traceback) and exits with status 2.
"""


class ClusterxError(ValueError):
    """Base class of every error a user can cause and fix."""


class SpecError(ClusterxError):
    """A malformed spec file or option."""


class ResourceError(ClusterxError):
    """A request no machine of the backend can satisfy (more GPUs than exist, more CPUs than the machine...)."""


class JobNotFoundError(ClusterxError):
    """No job with that id in this database."""


class NotOwnerError(ClusterxError):
    """Only the user who submitted a job may cancel it."""


class JobStateError(ClusterxError):
    """The job is in a state that does not allow the operation (e.g. retry of a live job)."""


class DatabaseConfigError(ClusterxError):
    """The database URL or path cannot be used."""


class BackendError(ClusterxError):
    """A backend refused or failed a request (sbatch error, daemon did not start...)."""
