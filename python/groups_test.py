"""Unit tests of bnps.torch's process_group argument (bnps/torch/groups.py),
without servers: which torch groups map to bnps BN groups of K consecutive
worker ids, the clear error for those that do not, ranks read from a real
torch.distributed (gloo) process group, and the check against the servers'
--bn_group_size through SyncBatchNorm and convert_sync_batchnorm."""

import os
import socket
import sys
import types
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles

import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import bnps.torch  # noqa: E402
from bnps.torch import groups  # noqa: E402


class RanksToGroupSizeTest(unittest.TestCase):
    def test_blocks_of_consecutive_ranks(self):
        self.assertEqual(groups.group_size_of_ranks([0, 1], 1, 4), 2)
        self.assertEqual(groups.group_size_of_ranks([3, 2], 2, 4), 2)
        self.assertEqual(groups.group_size_of_ranks([4, 5, 6, 7], 5, 8), 4)
        self.assertEqual(groups.group_size_of_ranks([3], 3, 4), 1)
        # The whole job is no groups at all, as the servers' 0.
        self.assertEqual(groups.group_size_of_ranks([0, 1, 2, 3], 0, 4), 0)

    def test_other_groups_say_what_bnps_supports(self):
        for ranks, worker, w in (
                ([0, 2], 0, 4),        # not contiguous
                ([1, 2], 1, 4),        # not aligned to a block
                ([0, 1, 2], 0, 4),     # 3 does not divide 4
                ([2, 3, 4], 2, 6),     # misaligned block of 3
                ([0, 0], 0, 4),        # not a group
                ([], 0, 4)):
            with self.assertRaises(ValueError) as cm:
                groups.group_size_of_ranks(ranks, worker, w)
            self.assertIn("consecutive worker ids", str(cm.exception))
        with self.assertRaisesRegex(ValueError, "not in its process_group"):
            groups.group_size_of_ranks([2, 3], 0, 4)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connection(group_size, worker=0, num_workers=1):
    return types.SimpleNamespace(config={"bn_group_size": group_size},
                                 worker=worker, num_workers=num_workers)


class TorchProcessGroupTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
            world_size=1)
        cls.group = dist.new_group([0])

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()

    def test_ranks_of_a_torch_group(self):
        self.assertEqual(groups.process_group_ranks(self.group), [0])
        self.assertIsNone(groups.process_group_ranks(None))

    def test_checked_against_the_servers(self):
        groups.check_process_group(self.group, _connection(0))  # whole job
        groups.check_process_group(None, _connection(0))
        # [0] of 4 workers: the first of four groups of one.
        groups.check_process_group(self.group, _connection(1, 0, 4))
        with self.assertRaisesRegex(ValueError, "--bn_group_size=0"):
            groups.check_process_group(None, _connection(2, 0, 4))

    def test_layer_refuses_a_group_the_servers_do_not_run(self):
        model = bnps.torch.convert_sync_batchnorm(
            nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3)),
            process_group=self.group, connection=_connection(2, 0, 4))
        self.assertIs(model[1].process_group, self.group)
        with self.assertRaisesRegex(ValueError, "--bn_group_size=2"):
            model(torch.randn(4, 2))
        bn = bnps.torch.SyncBatchNorm(3, process_group=self.group, name="l",
                                      connection=_connection(0, 0, 4))
        with self.assertRaisesRegex(ValueError, "BN groups of 1 workers.*"
                                    "start them with --bn_group_size=1"):
            bn(torch.randn(4, 3))


if __name__ == "__main__":
    unittest.main()
