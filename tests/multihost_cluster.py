"""A bnps cluster on the test bed (tools/testbed): each server and each worker
on a host of its choosing, workers reaching servers over relayed links.

Server i listens on 0.0.0.0, gRPC port 7000 + i and raw-TCP BN port 7100 + i
(--bn_port) of its host; a worker's --servers names them at the link
addresses of its own host (testbed.Links.address), so both its gRPC calls and
its BN connections cross the link and feel its delay and cuts. bnps_status
runs on `status_host` and reaches the servers at their own addresses,
without a link (the operator's view, unaffected by cuts).
"""

from tests.restart_cluster import SERVER, STATUS, Cluster, server_command

GRPC_PORT = 7000
BN_PORT = 7100


def ports(num_servers):
    return ([GRPC_PORT + i for i in range(num_servers)] +
            [BN_PORT + i for i in range(num_servers)])


class BedCluster(Cluster):
    def __init__(self, out, bed, links, server_hosts, worker_hosts,
                 status_host, **kwargs):
        super().__init__(out, servers=len(server_hosts),
                         workers=len(worker_hosts), **kwargs)
        self.bed = bed
        self.links = links
        self.server_hosts = list(server_hosts)
        self.worker_hosts = list(worker_hosts)
        self.status_host = status_host
        self.ports = [GRPC_PORT + i for i in range(self.num_servers)]
        self.addresses = ",".join(f"{bed.ip(h)}:{p}"
                                  for h, p in zip(self.server_hosts, self.ports))
        over_links = ",".join(links.address(h, p)
                              for h, p in zip(self.server_hosts, self.ports))
        self.worker_flags = [f"--servers={over_links}" if f.startswith("--servers=")
                             else f for f in self.worker_flags]

    def server_command(self, i):
        return server_command(SERVER, host="0.0.0.0", port=self.ports[i],
                              bn_port=BN_PORT + i, shard=i,
                              checkpoint_dir=self.checkpoint_dir(i),
                              flags=self.server_flags)

    def popen(self, kind, i, args, **kwargs):
        host = (self.server_hosts if kind == "server" else self.worker_hosts)[i]
        return self.bed.popen(host, args, **kwargs)

    def run_status(self, args):
        return self.bed.run(self.status_host,
                            [STATUS, f"--servers={self.addresses}", *args],
                            capture_output=True, text=True, timeout=30)
