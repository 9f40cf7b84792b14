"""The tcp backend against the conformance suite, with 1 to 4 real ranks."""

from procgroup.testing import ConformanceSuite


class TestTcpConformance(ConformanceSuite):
    backend = "tcp"
    world_sizes = (1, 2, 3, 4)
