"""A collective on a group, as in the PyTorch tutorial: all_reduce over the group [0, 1].

    python examples/tutorial_groups.py -n 4 [--arrays torch] [--backend gloo]

Every rank creates the group and calls the all_reduce; ranks 0 and 1 get 2, and ranks
outside the group (2 and 3 on four ranks) get a warning and keep their ones, as with
torch.distributed.
"""

from __future__ import annotations

import warnings

import tutorial_common as common
import procgroup as dist


def run(rank: int, size: int) -> None:
    group = dist.new_group([0, 1])
    tensor = common.ones(1)
    with warnings.catch_warnings(record=True):  # the non-members' "does not belong" warning
        warnings.simplefilter("always")
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    print("Rank ", rank, " has data ", tensor[0])
    assert float(tensor[0]) == (2.0 if rank < 2 else 1.0)
    # the whole world, for comparison
    everyone = common.ones(1)
    dist.all_reduce(everyone, op=dist.ReduceOp.SUM, group=dist.group.WORLD)
    assert float(everyone[0]) == size


if __name__ == "__main__":
    common.main(run, default_size=4)
