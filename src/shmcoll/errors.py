"""Exceptions raised by the shm backend; all are RuntimeErrors, as torch's own are."""


class ShmcollError(RuntimeError):
    """Base class of every error shmcoll raises on purpose."""


class CollectiveError(ShmcollError):
    """Ranks disagree on the collective they are running (kind, op, dtype, count or root)."""


class PeerDiedError(ShmcollError):
    """A rank this one was waiting for has exited."""


class PeerTimeoutError(ShmcollError, TimeoutError):
    """Ranks did not reach a collective within the group's timeout."""


class AbortedError(ShmcollError):
    """The group was aborted (``abort()``) while this rank waited in a collective."""


class AttachError(ShmcollError):
    """This rank could not map its node's arena, which another local rank created; it can run as a node of its own."""


class PeerAttachError(ShmcollError):
    """Another local rank could not map the arena that this rank created or mapped."""


class SizesDisagreeError(ValueError):
    """Ranks passed sizes that do not fit together (an all_to_all's splits), found by every rank alike before
    any data moved: every rank raises it, and the group stays usable (not a ShmcollError)."""


class InterNodeError(ShmcollError):
    """A hierarchical plan failed part-way (a Gloo call between nodes, or a local peer that gave up on it)."""
