"""A test class's one-worker sync job: a bnps_server shard on 127.0.0.1 and
cls.connection to it (init's arguments plus CONNECT), one torch thread;
both stop after the class's tests."""

import unittest

import torch

import bnps.torch
from bnps.cluster import LocalCluster


class OneWorkerJob(unittest.TestCase):
    CONNECT = {}  # more bnps.torch.init arguments

    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.cluster = LocalCluster(num_servers=1, num_workers=1).start()
        try:
            cls.connection = bnps.torch.init(
                servers=cls.cluster.servers, worker=0, num_workers=1,
                **cls.CONNECT)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.connection.close()
        cls.cluster.stop()
