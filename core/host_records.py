"""Step records on their way from the device to the host, read when the host needs them.

A decoding step leaves a record ``[committed, drafted, t_0 .. t_{committed-1}]`` (int64): how many
tokens it committed, how many drafts it verified, and the committed tokens. ``HostRecords`` lets
the host enqueue the next step before it reads the last one's record (the host one step behind the
device), or read each record as soon as it is sent (eagerly): the same class under either policy.
"""

from __future__ import annotations

import torch


class HostRecords:
    """Records in flight from the device to the host, without a sync when sent.

    ``send(record)`` enqueues the copy of a record (``[m]`` int64, ``m <= width``, on the device or
    the host; a static buffer may be overwritten by the next step once sent) into host slot ``sent
    % depth`` (pinned memory on CUDA) and records a CUDA event after it; ``receive()`` waits for
    the oldest record's event alone and returns its committed tokens and draft count. At most
    ``depth`` records may be sent and not yet received. On a CPU the copy is synchronous and there
    are no events.
    """

    def __init__(self, device: torch.device, width: int, depth: int = 2) -> None:
        cuda = device.type == "cuda"
        self.depth, self.width = depth, width
        self.slots = torch.zeros(depth, width, dtype=torch.int64, pin_memory=cuda)
        self.events = [torch.cuda.Event() for _ in range(depth)] if cuda else None
        self.sent = self.received = 0

    @property
    def in_flight(self) -> int:
        """Records sent and not yet received."""
        return self.sent - self.received

    def send(self, record: torch.Tensor) -> None:
        assert self.in_flight < self.depth, f"{self.depth} records in flight already"
        assert record.numel() <= self.width, f"a record of {record.numel()} values, slots of {self.width}"
        slot = self.sent % self.depth
        self.slots[slot, :record.numel()].copy_(record, non_blocking=True)
        if self.events is not None:
            self.events[slot].record()
        self.sent += 1

    def receive(self) -> tuple[list[int], int]:
        """The oldest record in flight: ``(committed tokens, drafts verified)``."""
        assert self.in_flight > 0, "no record in flight"
        slot = self.received % self.depth
        if self.events is not None:
            self.events[slot].synchronize()
        self.received += 1
        committed, drafted = self.slots[slot, :2].tolist()
        return self.slots[slot, 2:2 + committed].tolist(), drafted

    def reset(self) -> None:
        """Forget records sent and not received (a step enqueued after the generation's last)."""
        self.sent = self.received = 0


__all__ = ["HostRecords"]
