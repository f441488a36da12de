"""The brokers under test for scripts/cluster_check.py: three `tern serve` processes with a
[cluster] table (`tern`), one `tern serve` without it (`tern-single`, restarted in place: the
checker's own test bed), or three routed nats-server processes with JetStream and MQTT
(`nats`, the peer's cluster; MQTT QoS 1 only).

Every node runs on loopback, or, with network namespaces (`--netns`, root and `ip netns`
needed), each in its own namespace behind a veth pair on one bridge. Namespaces make a real
partition possible: blackhole routes between the leader's namespace and the others cut the
cluster links while the clients (in the root namespace, on the bridge) still reach every node.
"""

import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

# How long a node may take from exec to a listening MQTT port.
START_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 0.5
# Bearer token of the HTTP listener: a non-loopback bind (namespaces) needs one.
HTTP_TOKEN = "cluster-check-token-0123456789"
# The nodes' log filter (`tern serve --log`); CLUSTER_CHECK_LOG replaces it, e.g.
# "warn,tern=info,tern_cluster=info,openraft=debug" to read an election in broker.log.
DEFAULT_LOG = "warn,tern=info,tern_cluster=info"


def log(msg):
    print(f"[cluster-check {time.strftime('%H:%M:%S', time.gmtime())}] {msg}", flush=True,
          file=__import__("sys").stderr)


def free_ports(count):
    """Ports nothing listens on now, taken below the kernel's ephemeral range (32768-60999):
    a port bound at 0 and released could be handed to another program's socket before the
    node binds it. Below that range only explicit binds take ports."""
    first, span = 20000, 12000
    start = random.randrange(span)
    ports = []
    for i in range(span):
        port = first + (start + i) % span
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"no {count} free ports between {first} and {first + span}")


def port_open(host, port, timeout_s=0.3):
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def run(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Netns:
    """A bridge in the root namespace and one namespace per node (10.X.Y.10+i/24)."""

    def __init__(self, count):
        tag = os.getpid() % 100000
        self.bridge = f"tccb{tag}"
        self.prefix = f"10.{200 + tag % 50}.{tag % 250}"
        self.names = [f"tcc{tag}-{i}" for i in range(1, count + 1)]
        self.cut = []  # blackhole routes in place: (namespace, address)

    def ip_of(self, index):
        return f"{self.prefix}.{10 + index}"

    def setup(self):
        run(["ip", "link", "add", self.bridge, "type", "bridge"])
        run(["ip", "addr", "add", f"{self.prefix}.1/24", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])
        for i, ns in enumerate(self.names, start=1):
            host_end, ns_end = f"{self.bridge}h{i}"[-15:], f"{self.bridge}n{i}"[-15:]
            run(["ip", "netns", "add", ns])
            run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end])
            run(["ip", "link", "set", ns_end, "netns", ns])
            run(["ip", "link", "set", host_end, "master", self.bridge])
            run(["ip", "link", "set", host_end, "up"])
            run(["ip", "-n", ns, "addr", "add", f"{self.ip_of(i)}/24", "dev", ns_end])
            run(["ip", "-n", ns, "link", "set", ns_end, "up"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def partition(self, index):
        """Cuts node `index` from every other node (both directions), not from the clients."""
        for j in range(1, len(self.names) + 1):
            if j == index:
                continue
            for ns, addr in ((self.names[index - 1], self.ip_of(j)),
                             (self.names[j - 1], self.ip_of(index))):
                run(["ip", "-n", ns, "route", "add", "blackhole", f"{addr}/32"])
                self.cut.append((ns, addr))

    def heal(self):
        for ns, addr in self.cut:
            subprocess.run(["ip", "-n", ns, "route", "del", "blackhole", f"{addr}/32"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.cut = []

    def teardown(self):
        self.heal()
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "link", "del", self.bridge], stderr=subprocess.DEVNULL)


class Node:
    """One broker process: started, killed, paused and restarted by the checker."""

    def __init__(self, index, host, mqtt_port, cluster_port, http_port, work, netns=None):
        self.index = index  # 1-based; tern's node_id
        self.host = host
        self.mqtt_port = mqtt_port
        self.cluster_port = cluster_port
        self.http_port = http_port
        self.dir = os.path.join(work, f"node{index}")
        self.data_dir = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "broker.log")
        self.netns = netns
        self.proc = None
        self.paused = False
        self.starts = 0
        os.makedirs(self.dir, exist_ok=True)

    @property
    def name(self):
        return f"n{self.index}"

    def command(self):
        raise NotImplementedError

    def start(self):
        cmd = self.command()
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns.names[self.index - 1]] + cmd
        logf = open(self.log_path, "ab")
        logf.write(f"--- start {self.starts + 1} at {time.time():.3f}: {' '.join(cmd)}\n".encode())
        logf.flush()
        # `ip netns exec` execs the broker: the pid is the broker's.
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL)
        logf.close()
        self.paused = False
        self.starts += 1

    def wait_listening(self, timeout_s=START_TIMEOUT_S):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            if port_open(self.host, self.mqtt_port):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} is not listening on {self.host}:{self.mqtt_port} after {timeout_s} s")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        """SIGKILL (also of a paused process) and reap it."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.paused = False

    def stop(self):
        if self.alive():
            if self.paused:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.paused = False

    def hangup(self):
        """SIGHUP: the broker reads its files again (a paused one when it resumes)."""
        if self.alive():
            self.proc.send_signal(signal.SIGHUP)

    def pause(self):
        if self.alive():
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self):
        if self.alive() and self.paused:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def http_json(self, path):
        req = urllib.request.Request(f"http://{self.host}:{self.http_port}{path}",
                                     headers={"Authorization": f"Bearer {HTTP_TOKEN}"})
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):
            return None

    def http_post(self, path, body, timeout_s=30.0, method="POST"):
        """(status, parsed JSON body or None) of a token-guarded POST (or `method`); (None,
        error) if no answer."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://{self.host}:{self.http_port}{path}",
                                     data=data, method=method,
                                     headers={"Authorization": f"Bearer {HTTP_TOKEN}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except (OSError, ValueError) as e:
            return None, str(e)

    def leader_view(self):
        """(leader's node index or None, term) as this node sees it; None if it cannot tell."""
        raise NotImplementedError


class TernNode(Node):
    def __init__(self, *args, peers=None, sync=None, snapshot_every=None, tls=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.peers = peers  # None: no [cluster] table (tern-single)
        self.sync = sync
        self.snapshot_every = snapshot_every
        self.tls = tls  # None, or the node's cluster-port TLS files (make_cluster_certs)
        self.config = os.path.join(self.dir, "tern.toml")

    def write_config(self, binary):
        lines = [
            "# scripts/cluster_check.py: one node",
            "[limits]",
            "max_queued_messages = 100000",
            "[sys]",
            "interval_s = 0",
            "[http]",
            f'token = "{HTTP_TOKEN}"',
        ]
        if self.netns:
            lines += ["[auth]", "allow_anonymous = true"]
        if self.peers is not None:
            lines += [
                "[cluster]",
                f"node_id = {self.index}",
                f'bind = "{self.host}:{self.cluster_port}"',
                "peers = [" + ", ".join(f'"{p}"' for p in self.peers) + "]",
            ]
            if self.snapshot_every:
                # Snapshots often and little log kept behind them: a node back from a kill or
                # a new member catches up by a snapshot install, not by the log.
                lines += [f"snapshot_every_entries = {self.snapshot_every}",
                          f"log_kept_behind_snapshot = {max(1, self.snapshot_every // 10)}"]
            if self.tls:
                lines += [f'{key} = "{self.tls[key]}"'
                          for key in ("tls_cert", "tls_key", "tls_ca", "tls_crl")]
        with open(self.config, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        self.binary = binary

    def command(self):
        cmd = [self.binary, "serve", "--config", self.config, "--data-dir", self.data_dir,
               "--bind", f"{self.host}:{self.mqtt_port}", "--http", f"{self.host}:{self.http_port}",
               "--log", os.environ.get("CLUSTER_CHECK_LOG", DEFAULT_LOG)]
        if self.sync:
            cmd += ["--sync", self.sync]
        return cmd

    def leads_by_log(self):
        """Whether this process's log says it leads now: its last engine line is "leading"
        (as crates/server/tests/cluster.rs reads it), for builds without /api/v1/cluster."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            return False
        text = text[max(0, text.rfind("cluster: node starting")):]
        lead, stop = text.rfind("cluster: leading"), text.rfind("cluster: engine stopped")
        return lead >= 0 and stop < lead

    def leader_view(self):
        if not self.alive() or self.paused:
            return None
        view = self.http_json("/api/v1/cluster")
        if not isinstance(view, dict) or "node_id" not in view:
            return (self.index, 0) if self.peers and self.leads_by_log() else None
        leader = view.get("leader_id")
        if view.get("role") == "leader":
            leader = view.get("node_id", self.index)
        return (leader if isinstance(leader, int) else None, view.get("term") or 0)


class NatsNode(Node):
    """nats-server with JetStream and MQTT; routes to the others make the streams R3."""

    def __init__(self, *args, routes=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.routes = routes
        self.config = os.path.join(self.dir, "nats.conf")

    def write_config(self, binary):
        self.binary = binary
        routes = ", ".join(f'"nats-route://{r}"' for r in self.routes)
        text = f"""server_name: n{self.index}
listen: {self.host}:{self.free_client_port}
http: {self.host}:{self.http_port}
jetstream {{ store_dir: "{self.data_dir}" }}
cluster {{ name: cc, listen: {self.host}:{self.cluster_port}, routes: [{routes}] }}
mqtt {{ listen: {self.host}:{self.mqtt_port} }}
"""
        with open(self.config, "w", encoding="utf-8") as f:
            f.write(text)

    def command(self):
        return [self.binary, "-c", self.config]

    def leader_view(self):
        """The leader of the stream that holds MQTT QoS 1 messages ($MQTT_msgs), else the
        JetStream meta leader: the server whose death stops the acknowledgements."""
        if not self.alive() or self.paused:
            return None
        jsz = self.http_json("/jsz?accounts=true&streams=true")
        if not isinstance(jsz, dict):
            return None
        leader = None
        for account in jsz.get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                if stream.get("name") == "$MQTT_msgs":
                    leader = (stream.get("cluster") or {}).get("leader")
        if leader is None:
            leader = (jsz.get("meta_cluster") or {}).get("leader")
        if not isinstance(leader, str) or not leader.startswith("n"):
            return (None, 0)
        try:
            return (int(leader[1:]), 0)
        except ValueError:
            return (None, 0)


def make_cluster_certs(work, count):
    """A cluster CA, a certificate for each of `count` nodes (serverAuth and clientAuth) and the
    CA's revocation list, empty, made with openssl as docs/cluster.md says ("Security"): the
    files of `[cluster] tls_*`, one dict per node."""
    d = os.path.join(work, "cluster-tls")
    os.makedirs(d, exist_ok=True)

    def ssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-days", "2", "-subj", "/CN=cluster-check CA", "-keyout", "ca-key.pem", "-out", "ca.pem")
    with open(os.path.join(d, "index.txt"), "w", encoding="utf-8"):
        pass
    with open(os.path.join(d, "crlnumber"), "w", encoding="utf-8") as f:
        f.write("1000\n")
    with open(os.path.join(d, "ca.cnf"), "w", encoding="utf-8") as f:
        f.write("[ca]\ndefault_ca = c\n[c]\ndatabase = index.txt\ncrlnumber = crlnumber\n"
                "default_md = sha256\ndefault_crl_days = 2\n")
    ssl("ca", "-config", "ca.cnf", "-keyfile", "ca-key.pem", "-cert", "ca.pem", "-gencrl",
        "-out", "ca-crl.pem")
    made = []
    for i in range(1, count + 1):
        with open(os.path.join(d, f"ext{i}.cnf"), "w", encoding="utf-8") as f:
            f.write(f"subjectAltName=DNS:node{i}\nextendedKeyUsage=serverAuth,clientAuth\n")
        ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-subj", f"/CN=node{i}", "-keyout", f"node{i}-key.pem", "-out", f"node{i}.csr")
        ssl("x509", "-req", "-in", f"node{i}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
            "-CAcreateserial", "-days", "2", "-extfile", f"ext{i}.cnf", "-out", f"node{i}.pem")
        made.append({"tls_cert": os.path.join(d, f"node{i}.pem"),
                     "tls_key": os.path.join(d, f"node{i}-key.pem"),
                     "tls_ca": os.path.join(d, "ca.pem"),
                     "tls_crl": os.path.join(d, "ca-crl.pem")})
    return made


def make_nodes(kind, count, binary, work, netns, sync, spares=0, snapshot_every=None,
               tls=False):
    """The nodes of one run, configured but not started: `count` initial members, then `spares`
    more (tern) whose `peers` name only the initial members: started later, they wait to be
    added (POST /api/v1/cluster/members). With `tls` (tern), mutual TLS on the cluster port."""
    ports = free_ports(4 * (count + spares))
    nodes = []
    for i in range(1, count + spares + 1):
        host = netns.ip_of(i) if netns else "127.0.0.1"
        if netns:  # every namespace has the same ports to itself
            mqtt_port, cluster_port, http_port, client_port = 1883, 7001, 8081, 4222
        else:
            mqtt_port, cluster_port, http_port, client_port = ports[4 * (i - 1):4 * i]
        nodes.append((i, host, mqtt_port, cluster_port, http_port, client_port))
    made = []
    if kind in ("tern", "tern-single"):
        peers = ([f"{i}={h}:{c}" for (i, h, _m, c, _h, _p) in nodes[:count]]
                 if kind == "tern" else None)
        certs = make_cluster_certs(work, len(nodes)) if tls and kind == "tern" else None
        for (i, h, m, c, hp, _p) in nodes:
            node = TernNode(i, h, m, c, hp, work, netns=netns, peers=peers, sync=sync,
                            snapshot_every=snapshot_every,
                            tls=certs[i - 1] if certs else None)
            node.write_config(binary)
            made.append(node)
    else:
        for (i, h, m, c, hp, p) in nodes:
            routes = [f"{h2}:{c2}" for (j, h2, _m, c2, _h, _p) in nodes if j != i]
            node = NatsNode(i, h, m, c, hp, work, netns=netns, routes=routes)
            node.free_client_port = p
            node.write_config(binary)
            made.append(node)
    return made


def find_leader(nodes):
    """The node most live nodes name as leader (highest term wins a tie), or None."""
    votes = {}
    for node in nodes:
        view = node.leader_view()
        if view and view[0] is not None:
            key = view[0]
            count, term = votes.get(key, (0, 0))
            votes[key] = (count + 1, max(term, view[1]))
    if not votes:
        return None
    best = max(votes.items(), key=lambda kv: kv[1])[0]
    return next((n for n in nodes if n.index == best), None)


def pick_victim(nodes, rng):
    """The leader when the nodes can tell, else a random live node (single node: that one)."""
    leader = find_leader(nodes)
    if leader is not None and leader.alive():
        return leader, True
    live = [n for n in nodes if n.alive()]
    return (rng.choice(live) if live else None), False


__all__ = ["Netns", "make_nodes", "find_leader", "pick_victim", "port_open", "log", "random"]
