"""A multi-host test bed on one machine: hosts are network namespaces
(Bed), or, where those cannot be made, addresses of the loopback device
(LoopbackBed; open_bed chooses).

Each host gets its own IPv4 address (10.77.0.<i+1>/24) on a veth pair whose
other end is a port of a bridge in a namespace of its own (the switch). Names
carry this process's id and a random tag, so two beds (two tests) can exist at
once; everything is removed on close(), on exit, and on SIGTERM (what Bazel
sends at a timeout), and a bed also removes beds left behind by processes
that are gone (SIGKILL).

Links with delay, jitter, loss and cuts (this kernel has no netem): a client
host reaches each server host through bnps_relay (tools/testbed/relay.h),
which runs inside the client host and listens on 10.77.1.<j+1> (an address
of the client host's loopback standing for server host j) on the server's
ports. So a worker on host 2 given --servers=10.77.1.1:7000 reaches the
server of host 0 over the delayed link, and so does the raw-TCP BN port the
server advertises (a worker connects to it at the host of the gRPC address):
list both ports in Links(). Each (client host, server host) pair is its own
link, cut and healed on its own (an asymmetric partition is one cut).

Needs root (CAP_NET_ADMIN) and iproute2: unavailable() says why not.

LoopbackBed needs neither: host i is the address 127.<n>.0.<i+1> (Linux
routes all of 127.0.0.0/8 to the loopback device; <n> is claimed per bed
by a lock file under /tmp that no other live bed holds, so two beds, in one
process or in several, do not meet), its processes run as they are, and client host c
reaches server host j through its relay at 127.<n>.<c+1>.<j+1>, so each
(client, server) pair is still a link of its own with its delay, jitter,
loss and cuts. What it cannot show: the hosts share one kernel, one network
stack and one loopback device (no per-host queues or routes; a process
could reach another host's address directly; nothing stops it but the
addresses it is given).

    with Bed(3) as bed:
        links = bed.links(clients=[1, 2], servers=[0], ports=[7000, 7100],
                          rtt_us=200)
        bed.popen(0, ["bnps_server", "--host=0.0.0.0", ...])
        bed.popen(1, ["bnps_worker", f"--servers={links.address(0, 7000)}"])
        links.cut(1, 0, "blackhole"); ...; links.heal(1, 0)
"""

import atexit
import fcntl
import os
import random
import shutil
import signal
import subprocess

PREFIX = "bnpstb"
HOST_NET = "10.77.0."  # host i is HOST_NET + str(i + 1)
LINK_NET = "10.77.1."  # server host j, as a client host sees it over a link
LOOPBACK_NETS = range(100, 250)  # a LoopbackBed's second octet
LOOPBACK_LOCK = "/tmp/bnps-loopback-bed-{}.lock"


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def unavailable():
    """None when this process can make network namespaces, else why not."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "not root: making network namespaces needs CAP_NET_ADMIN"
    probe = f"{PREFIX}{os.getpid()}probe"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"cannot make a network namespace: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _namespaces():
    r = _ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _delete_namespace(ns):
    """Kills what still runs in `ns` (only beds' namespaces are passed here)
    and deletes it."""
    r = _ip("netns", "pids", ns, check=False)
    for pid in r.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _ip("netns", "del", ns, check=False)


def _sweep_orphans():
    """Deletes beds whose creating process is gone (killed with SIGKILL)."""
    for ns in _namespaces():
        if not ns.startswith(PREFIX):
            continue
        pid = ns[len(PREFIX):].split("x")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _delete_namespace(ns)


_open_beds = []


def _close_open_beds(*_):
    for bed in list(_open_beds):
        bed.close()


def _on_sigterm(signum, frame):
    _close_open_beds()
    raise SystemExit(128 + signum)


class _Hosts:
    """What both kinds of bed share: the processes started in its hosts
    (killed by PID at close), its links, and its clean-up at exit and on
    SIGTERM. A kind gives command(i, args), ip(i), link_ip(c, j),
    prepare_link(c, j) and _release() (what close() removes besides the
    processes)."""

    def _register(self, hosts):
        self.num_hosts = hosts
        self.procs = []
        if not _open_beds:
            atexit.register(_close_open_beds)
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
        _open_beds.append(self)

    def popen(self, i, args, **kwargs):
        p = subprocess.Popen(self.command(i, args), **kwargs)
        self.procs.append(p)
        return p

    def run(self, i, args, **kwargs):
        return subprocess.run(self.command(i, args), **kwargs)

    def links(self, clients, servers, ports, rtt_us=0, jitter_us=0,
              spin_us=60, relay=None):
        return Links(self, clients, servers, ports, rtt_us, jitter_us,
                     spin_us, relay)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()  # by PID: started here
            p.wait()
            for pipe in (p.stdin, p.stdout, p.stderr):
                if pipe is not None:
                    pipe.close()
        self.procs = []
        self._release()
        if self in _open_beds:
            _open_beds.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Bed(_Hosts):
    kind = "netns"

    def __init__(self, hosts):
        why = unavailable()
        if why:
            raise RuntimeError(why)
        _sweep_orphans()
        self.tag = f"{PREFIX}{os.getpid()}x{random.randrange(16**4):04x}"
        self.namespaces = []
        self._register(hosts)
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def _add_namespace(self, ns):
        _ip("netns", "add", ns)
        self.namespaces.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def _make(self):
        switch = f"{self.tag}-sw"
        self._add_namespace(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for i in range(self.num_hosts):
            ns = self.ns(i)
            self._add_namespace(ns)
            _ip("link", "add", "name", "eth0", "netns", ns, "type", "veth",
                "peer", "name", f"p{i}", "netns", switch)
            _ip("-n", switch, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", switch, "link", "set", f"p{i}", "up")
            _ip("-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def ns(self, i):
        return f"{self.tag}-h{i}"

    def ip(self, i):
        return HOST_NET + str(i + 1)

    def link_ip(self, client, server):
        """The address standing for `server` in host `client` (the relay's)."""
        return LINK_NET + str(server + 1)

    def prepare_link(self, client, server):
        _ip("-n", self.ns(client), "addr", "add",
            f"{self.link_ip(client, server)}/32", "dev", "lo")

    def command(self, i, args):
        """`args` run inside host i (ip netns exec execs it: same PID)."""
        return ["ip", "netns", "exec", self.ns(i), *args]

    def _release(self):
        for ns in reversed(self.namespaces):
            _delete_namespace(ns)
        self.namespaces = []


class LoopbackBed(_Hosts):
    """Hosts as loopback addresses (see the module comment): the interface
    of Bed, no privileges needed. The constructor claims an address block
    (RuntimeError when none is free); close() releases it. Not thread-safe:
    one thread drives a bed."""

    kind = "loopback"

    def __init__(self, hosts):
        self.net, self._lock = _claim_loopback_net()
        self._register(hosts)

    def ip(self, i):
        return f"127.{self.net}.0.{i + 1}"

    def link_ip(self, client, server):
        return f"127.{self.net}.{client + 1}.{server + 1}"

    def prepare_link(self, client, server):
        pass  # every 127/8 address is there already

    def command(self, i, args):
        return list(args)

    def _release(self):
        if self._lock is not None:
            os.close(self._lock)  # releases the address block
            self._lock = None


def _claim_loopback_net():
    """(n, fd): a second octet from LOOPBACK_NETS, tried in random order,
    whose lock file this call could flock; the lock lasts until fd is closed
    or its holder dies. RuntimeError when every block is held or no lock
    file can be opened."""
    nets = list(LOOPBACK_NETS)
    random.shuffle(nets)
    unopened = None
    for n in nets:
        try:
            fd = os.open(LOOPBACK_LOCK.format(n), os.O_RDONLY | os.O_CREAT, 0o644)
        except OSError as e:  # e.g. another user's file: not ours to take
            unopened = e
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return n, fd
        except BlockingIOError:
            os.close(fd)
    raise RuntimeError("every loopback bed address block (127.%d.0.0 to "
                       "127.%d.255.255) is held by a live bed or its lock "
                       "file %s cannot be opened%s"
                       % (LOOPBACK_NETS[0], LOOPBACK_NETS[-1],
                          LOOPBACK_LOCK.format("<n>"),
                          f" ({unopened})" if unopened else ""))


def open_bed(hosts, kind="auto"):
    """(bed, note): a Bed where network namespaces can be made, else a
    LoopbackBed, with a line saying why (note is None for a Bed); a Bed
    that fails half-built (e.g. no veth or bridge in this kernel) is
    removed and loopback hosts used instead. kind "netns" or "loopback"
    forces one (RuntimeError where namespaces cannot be made)."""
    if kind not in ("auto", "netns", "loopback"):
        raise ValueError(f"no bed kind {kind!r} (auto, netns, loopback)")
    if kind == "loopback":
        return LoopbackBed(hosts), "loopback hosts (asked for)"
    if kind == "netns":
        return Bed(hosts), None
    why = unavailable()
    if why is None:
        try:
            return Bed(hosts), None
        except RuntimeError as e:  # Bed removed what it had made
            why = f"making the namespace bed failed: {e}"
    return LoopbackBed(hosts), f"loopback hosts: no network namespaces here ({why})"


def relay_path():
    """bnps_relay in the runfiles of a Bazel test or in bazel-bin."""
    for path in ("tools/testbed/bnps_relay", "bazel-bin/tools/testbed/bnps_relay"):
        if os.path.exists(path):
            return os.path.abspath(path)
    raise RuntimeError("bnps_relay not found: bazel build //tools/testbed:bnps_relay")


class RelayProcess:
    """A running bnps_relay and its command line (stdin/stdout)."""

    def __init__(self, argv, popen=subprocess.Popen):
        self.proc = popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)
        ready = self.proc.stdout.readline().strip()
        if ready != "ready":
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"bnps_relay did not start ({argv})")

    def command(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if reply.startswith("error") or not reply:
            raise RuntimeError(f"bnps_relay: {line}: {reply or 'no reply'}")
        return reply

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


class Links:
    """The links from each client host to each server host (see the module
    comment): one relay process per client host, link "h<j>" to server j."""

    def __init__(self, bed, clients, servers, ports, rtt_us, jitter_us,
                 spin_us, relay):
        self.bed = bed
        self.relays = {}
        relay = relay or relay_path()
        self.clients = list(clients)
        for c in clients:
            forwards = []
            for j in servers:
                bed.prepare_link(c, j)
                forwards += [f"h{j}={bed.link_ip(c, j)}:{p}>{bed.ip(j)}:{p}"
                             for p in ports]
            self.relays[c] = RelayProcess(
                [relay, "--forward=" + ",".join(forwards),
                 f"--delay_us={rtt_us / 2}", f"--jitter_us={jitter_us}",
                 f"--spin_us={spin_us}", f"--seed={c + 1}"],
                popen=lambda argv, c=c, **kw: bed.popen(c, argv, **kw))

    def address(self, server, port, client=None):
        """Server host `server`'s `port`, as client host `client` reaches it
        (on a Bed every client host reaches it at the same address; on a
        LoopbackBed each at its own: `client` may be left out only where
        there is one client host)."""
        if client is None:
            if self.bed.kind != "netns" and len(self.clients) != 1:
                raise ValueError("on a loopback bed a link's address depends "
                                 "on the client host: pass client=")
            client = self.clients[0]
        return f"{self.bed.link_ip(client, server)}:{port}"

    def _each(self, client, server, line):
        clients = self.relays if client is None else [client]
        link = "*" if server is None else f"h{server}"
        for c in clients:
            self.relays[c].command(line.format(link=link))

    def cut(self, client=None, server=None, mode="blackhole"):
        """Cuts client host -> server host (None: every one); mode blackhole
        (nothing crosses, no RST) or rst (connections reset, new ones too)."""
        self._each(client, server, "cut {link} " + mode)

    def heal(self, client=None, server=None):
        self._each(client, server, "heal {link}")

    def delay(self, rtt_us, jitter_us=0, client=None, server=None):
        self._each(client, server, f"delay {{link}} {rtt_us / 2} {jitter_us}")

    def loss(self, p, penalty_us=200000, client=None, server=None):
        self._each(client, server, f"loss {{link}} {p} {penalty_us}")

    def stats(self, client):
        return self.relays[client].command("stats")
