"""Collectives across nodes, each a pipeline of named stages (after Open MPI's coll/han).

Every plan is written over two kinds of stage:

  node stages   (``stages``)   shared memory inside this rank's node: the arena's schedules
  network       (``network``)  Gloo between nodes, on a *rail* (local rank i of every node) or
                               on the leaders' link (the nodes' local rank 0, a group of its own
                               for small messages), started asynchronously; partial results
                               combined by our kernels (``partials``)

and lives in a module of its own: allreduce, allgather, reduce_scatter, broadcast, reduce,
gather, scatter, alltoall, barrier. A large message is cut into segments that flow through
the stages, so the node works on one segment while the network carries another; a small one
takes the fewest network exchanges (its node's partial result, one exchange between the
nodes' leaders, the node's copy back).

Every plan reads ``shape.Shape`` (where every rank is: the nodes, this rank's place, its
rail, the index tables; ``Shape.small`` is the one meaning of SHMCOLL_SMALL_BYTES) and
crosses on ``links.Links`` (its rail, the leaders' link, the group of all ranks); both are
built once per group. all_to_all also keeps what it last agreed (``alltoall.Agreed``).
"""
