"""Exceptions raised by the shm backend; all are RuntimeErrors, as torch's own are."""


class ShmcollError(RuntimeError):
    """Base class of every error shmcoll raises on purpose."""


class CollectiveError(ShmcollError):
    """Ranks disagree on the collective they are running (kind, op, dtype, count or root)."""


class PeerDiedError(ShmcollError):
    """A rank this one was waiting for has exited."""


class PeerTimeoutError(ShmcollError, TimeoutError):
    """Ranks did not reach a collective within the group's timeout."""


class PeerGaveUpError(ShmcollError):
    """A local peer gave up mid-collective after an error of its own (which its own message names), so the
    collective cannot complete on this rank either."""


class PeerLeftError(ShmcollError):
    """A local peer this rank was waiting for closed the group (destroy_process_group, abort()) without
    reaching the collective or transfer, so it never will."""


class AbortedError(ShmcollError):
    """The group was aborted (``abort()``) while this rank waited in a collective."""


class AttachError(ShmcollError):
    """This rank could not map its node's arena, which another local rank created; it can run as a node of its own."""


class PeerAttachError(ShmcollError):
    """Another local rank could not map the arena that this rank created or mapped."""


class SizesDisagreeError(ValueError):
    """Ranks passed sizes that do not fit together (an all_to_all's splits), found by every rank alike: every
    rank raises it, naming the same pair, and the group stays usable (not a ShmcollError)."""

    def __init__(self, sender: int, receiver: int, sent: int, expected: int):
        super().__init__(f"all_to_all split sizes disagree: rank {sender} sends {sent} bytes to rank {receiver}, "
                         f"which expects {expected} bytes from it")
        self.sender, self.receiver, self.sent, self.expected = sender, receiver, sent, expected

    def __reduce__(self):  # pickles (multiprocessing, the test harness) with its four fields
        return type(self), (self.sender, self.receiver, self.sent, self.expected)


class InterNodeError(ShmcollError):
    """A hierarchical plan failed part-way (a Gloo call between nodes, or a local peer that gave up on it).

    ``peers``: where a Gloo call failed, the group ranks at the other end of its connections (one for a
    message, every other member for a collective), from which ``placement.across.causes`` tells whether the
    rank on the other end died; empty where no call names them."""

    def __init__(self, message: str, peers=()):
        super().__init__(message)
        self.peers = tuple(peers)

    def __reduce__(self):  # pickles with its peers
        return type(self), (str(self), self.peers)


class TorchChangedError(ShmcollError):
    """This torch lacks, or changed, something of its internals that shm cannot work without
    (``torch_internals``): raised by the first group of a process, naming the torch version and what changed."""
