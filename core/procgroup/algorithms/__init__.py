"""Collectives written once on top of a DataChannel's send/recv.

Every function takes the channel, the validated arrays and a private ``tag`` from
:meth:`DataChannel.next_collective_tag`, so collective traffic never matches a user's
send/recv. Backends call these as their defaults and override what they do better;
``pipelined`` holds the segmented ring and chains for large arrays (tcp picks them by size).
Results are identical on every rank: each element is reduced in one fixed order.
"""

from . import direct, pipelined, ring, tree

__all__ = ["direct", "pipelined", "ring", "tree"]
