"""Rank 0's commands to the other ranks, in order: how followers mirror a leader's engine calls.

Under tensor parallelism every rank runs the same engine on its shard, and every forward pass all-reduces: the
ranks must admit the same requests, with the same seeds, and step at the same moments. Rank 0 (the leader: it
owns the HTTP server or the user's script) sends each command before acting on it; the others receive and apply
them in the same order. Commands are small Python objects, sent over a gloo group on the CPU beside the NCCL
group the model uses, so they never wait behind GPU work.

    channel = CommandChannel()            # every rank, after init_tensor_parallel
    channel.send(("step", key, commands))  # rank 0
    kind, key, payload = channel.receive()  # the other ranks, blocking until rank 0 sends

`channel.lock` serialises everything rank 0 does with collectives (steps, engine creation), whichever thread
does it: two threads interleaving collectives would deadlock the group.
"""

from __future__ import annotations

import datetime
import threading

import torch.distributed as dist

__all__ = ["CommandChannel"]

# a follower waits for the leader's next command as long as the server stays idle
_IDLE_TIMEOUT = datetime.timedelta(days=365)


class CommandChannel:
    """Broadcasts picklable commands from rank 0 to every rank of the default group (see the module doc)."""

    def __init__(self):
        if not dist.is_initialized():
            raise ValueError("CommandChannel needs an initialized torch.distributed process group")
        self.group = dist.new_group(backend="gloo", timeout=_IDLE_TIMEOUT)  # collective: every rank calls it
        self.rank = dist.get_rank()
        self.lock = threading.RLock()
        self.stopped = False  # rank 0 has sent ("stop", …)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def send(self, command) -> None:
        """Rank 0: deliver `command` to every rank (returns once it is sent)."""
        if not self.is_leader:
            raise RuntimeError("only rank 0 sends commands")
        dist.broadcast_object_list([command], src=0, group=self.group)

    def receive(self):
        """Ranks other than 0: the leader's next command (blocks until it is sent)."""
        if self.is_leader:
            raise RuntimeError("rank 0 sends commands; it does not receive them")
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]
