"""Why a group across nodes failed, as its ranks tell one another through the group's store.

A rank whose plan fails gives up (``nodes._gives_up_on_failure``): it posts in its
node arena that it gave up and lets go of its Gloo groups. What the others see
of that says nothing of the cause: a node mate sees that the rank gave up
(``PeerGaveUpError``), a peer on another node that their connection closed, as
it would if the rank had died. Only a few ranks see a death itself: a node mate
of the dead rank (its process exited; the arena holds the node's pids), and a
rank whose connection with it closed although it had not given up (a rank that
gives up says so first, below). So before it lets go of anything, a rank that
gives up posts in the store, which every rank of every node reaches:

  <keys>/failure/cause          the cause, if it saw one: "rank 3 (node 1) died (...)",
                                or its own error. The first rank to post one wins
                                (compare_set), so every rank that reads it names the same.
  <keys>/failure/gave-up/<r>    that rank r gave up (its error): the connections it
                                closes next are no sign that it died.

A rank that saw no cause reads it there, waiting up to ``LEARN_S`` for a rank that
can see it to post it (a node mate of the dead rank notices at the end of its
wait's slice, ``waits.SLICE_NS``, or when its own Gloo call fails). Past that, or
when the store cannot be reached (its host may be the rank that died), it raises
all the same and says that the cause is not known.
"""
from __future__ import annotations

import time

from shmcoll.errors import InterNodeError, PeerGaveUpError, ShmcollError

# How long a rank that saw no cause itself waits for another to post one. Those that see one post it within
# a wait's slice (0.1 s) of the failure, plus what a loaded machine adds; a rank that waits this long raises
# without it (every rank still raises within about a second of the failure it saw).
LEARN_S = 1.0
_POLL_S = 0.01
_UNREACHABLE = object()  # a store call that failed (``Causes._ask``)


def _only_reports_another(error: BaseException) -> bool:
    """Whether ``error`` shows only that another rank failed before this one: a node mate that gave up, or a
    Gloo call that failed (a network stage's, with its peers, or the flat group's own RuntimeError)."""
    if isinstance(error, (PeerGaveUpError, InterNodeError)):
        return True
    return isinstance(error, RuntimeError) and not isinstance(error, ShmcollError)


class Causes:
    """What this rank tells the others of a failure, and learns from them, in ``store`` under ``keys``.

    ``exited_peers()``: the group ranks of this rank's node mates whose process has exited (asked again while it
    waits: a rank that SIGKILL ends closes its connections before its process is seen to exit)."""

    def __init__(self, store, keys: str, shape, timeout_s: float, exited_peers):
        self.store = store
        self.cause_key = f"{keys}/failure/cause"
        self.gave_up_key = f"{keys}/failure/gave-up/"  # + the group rank
        self.shape = shape
        self.timeout_s = timeout_s  # the group's, which Gloo's calls have too
        self.exited_peers = exited_peers
        self.store_error: str | None = None  # why the store could not be reached, once it could not

    def give_up(self, error: BaseException, took_s: float, let_go) -> str:
        """Post why this rank gives up after ``error`` (raised by a call that took ``took_s``), call ``let_go()``,
        which makes the failure visible to the others, and return what to add to ``error``'s message:
        "; cause: ..." where the cause is another rank's failure or a death, else ''."""
        died = self._death_seen(error, took_s)
        own = None if died is not None or (_only_reports_another(error) and took_s < self.timeout_s) else \
            f"{self._who([self.shape.rank])}: {type(error).__name__}: {error}"
        seen = died or own
        first = self._post_cause(seen) if seen is not None else None
        self._ask(lambda: self.store.set(f"{self.gave_up_key}{self.shape.rank}", f"{type(error).__name__}: {error}"))
        let_go()
        if died is not None:
            return f"; cause: {died}"
        if own is not None:
            # The error is its own cause, unless another rank posted one first: a Gloo call here that timed out
            # because a peer gave up without closing its connections (a Gloo collective still running there).
            return "" if first in (None, own) else f"; cause: {first}"
        return f"; cause: {self._learn()}"

    def _death_seen(self, error: BaseException, took_s: float) -> str | None:
        """'rank 3 (node 1) died (...)' where this rank sees a death itself: a node mate's process exited, or
        a connection with a single peer closed (``InterNodeError.peers``) before the group's timeout (a Gloo
        timeout closes it too, with the peer alive) while that peer had not posted that it gave up."""
        exited = self.exited_peers()
        if exited:
            return self._exited(exited)
        peers = error.peers if isinstance(error, InterNodeError) else ()
        if len(peers) == 1 and took_s < self.timeout_s:
            gave_up = self._ask(lambda: self.store.check([f"{self.gave_up_key}{peers[0]}"]))
            if gave_up is False:
                return (f"{self._who(peers)} died (its connection with rank {self.shape.rank} closed, and it had not "
                        f"given up)")
        return None

    def _learn(self) -> str:
        """The cause, for a rank that saw none when it gave up: a node mate seen to exit since, or the cause
        another rank posted, waiting up to LEARN_S for either; else what is known of it."""
        deadline = time.monotonic() + LEARN_S
        while True:
            exited = self.exited_peers()
            if exited:
                died = self._exited(exited)
                self._post_cause(died)  # for the ranks that learn it from the store
                return died
            if self._ask(lambda: self.store.check([self.cause_key])) is True:
                cause = self._ask(lambda: self.store.get(self.cause_key))
                if isinstance(cause, bytes):
                    return cause.decode(errors="replace")
            if self.store_error is not None:
                return f"not known here: the group's store cannot be reached ({self.store_error})"
            if time.monotonic() >= deadline:
                return (f"not known here: no rank posted one within {LEARN_S:g} s (a rank that died alone on its "
                        f"node is seen only by the ranks whose connection with it closed)")
            time.sleep(_POLL_S)

    def _exited(self, ranks: list[int]) -> str:
        return f"{self._who(ranks)} died (process exited; seen by its node mate rank {self.shape.rank})"

    def _post_cause(self, cause: str) -> str | None:
        """Post ``cause`` unless another rank posted one first; returns the one posted, None where the store
        cannot say."""
        first = self._ask(lambda: self.store.compare_set(self.cause_key, "", cause))
        return first.decode(errors="replace") if isinstance(first, bytes) else None

    def _ask(self, call):
        """``call()``'s result, or _UNREACHABLE where the store failed (remembered in ``store_error``): a
        failure must still raise, on every rank, whatever became of the store's host."""
        if self.store_error is not None:
            return _UNREACHABLE
        try:
            return call()
        except Exception as error:
            self.store_error = f"{type(error).__name__}: {error}"
            return _UNREACHABLE

    def _who(self, ranks) -> str:
        """'rank 3 (node 1)', or 'ranks 2, 3 (node 1)' for ranks of one node."""
        nodes = sorted({self.shape.node_of(rank)[0] for rank in ranks})
        return (f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
                f"(node{'s' if len(nodes) > 1 else ''} {', '.join(map(str, nodes))})")
