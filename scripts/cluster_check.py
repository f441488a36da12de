#!/usr/bin/env python3
"""The real-process cluster check of issue 23 (run by scripts/cluster-check.sh, which builds
the broker and provides paho-mqtt): three brokers, paho clients spread over all nodes, faults,
and a checker. See scripts/cluster-check.sh --help for the options.

Clients (scripts/cluster_clients.py): QoS 1 and QoS 2 publishers (3.1.1 and 5) with consecutive
numbers each on its own topic, and persistent subscribers (3.1.1 and 5) of every topic at QoS 2,
that count a QoS 2 message at its PUBREL. Every client starts on a different node and moves to
the next node of its list whenever its connection drops.

Faults, spread evenly over --seconds: SIGKILL of the leader (from GET /api/v1/cluster, else a
random live node), restarted after --restart-after-s; SIGSTOP of a random node for 1-3 s, then
SIGCONT; with --partition, the leader cut from the other two nodes for --partition-s (network
namespaces) while clients still reach it.

Checks, per (subscriber, publisher):
- lost: acknowledged (PUBACK, or PUBREC for QoS 2) and never delivered (MQTT-4.3.2-*,
  MQTT-4.3.3-*, issue 23 "nothing acknowledged is lost");
- duplicates: a QoS 2 message delivered more than once (MQTT-4.3.3-*: exactly once);
- reordered: a first delivery with a lower number than an earlier first delivery from the same
  publisher (MQTT-4.6.0-5: an Ordered Topic per publisher);
- minority_acks: with --partition, a message first sent after the cut and acknowledged on a
  connection to the cut node while it was cut (a minority must not acknowledge);
- failover_s per kill: from the SIGKILL to the first acknowledgement after it of a message first
  sent after the kill or on a connection made after it; failover_max_s is the largest.
The last line on stdout is one JSON object; the exit status is 1 when a check fails.
"""

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_nodes as cn  # noqa: E402
import cluster_power  # noqa: E402
from cluster_clients import Clock, Publisher, Subscriber  # noqa: E402

FAILOVER_LIMIT_S = 3.0
# A kill nobody recovers from within this long counts as this failover time.
FAILOVER_GIVE_UP_S = 60.0
FINISH_TIMEOUT_S = 60.0
DRAIN_IDLE_S = 15.0
# The whole run may take this much longer than --seconds before the watchdog ends it.
WATCHDOG_SLACK_S = 240.0
log = cn.log


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True, help="tern or nats-server binary")
    p.add_argument("--broker", choices=["tern", "tern-single", "nats"], default="tern")
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--pauses", type=int, default=2)
    p.add_argument("--partition", action="store_true")
    p.add_argument("--power-losses", type=int, default=0,
                   help="power losses of the leader (its disk keeps what had reached it)")
    p.add_argument("--power-loss-all", action="store_true",
                   help="once, a power loss of every node at the same instant")
    p.add_argument("--membership", action="store_true",
                   help="once, under the load: start a fourth, empty node, add it (it is "
                        "promoted once caught up), then remove a follower of the first three")
    p.add_argument("--snapshot-every", type=int, default=None,
                   help="[cluster] snapshot_every_entries (and a tenth of it kept behind): "
                        "nodes back from a fault and new members catch up by snapshot")
    p.add_argument("--transfers", type=int, default=0,
                   help="leader transfers (POST /api/v1/cluster/leader) under the load; tern only")
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--sync", help="tern --sync POLICY (e.g. never, to show a loss)")
    p.add_argument("--wipe-on-kill", action="store_true",
                   help="delete a killed node's data directory before its restart (a broken "
                        "disk: shows that the checker reports lost messages)")
    p.add_argument("--receiver-at-publish", action="store_true",
                   help="broken subscribers that count a QoS 2 message at its PUBLISH instead "
                        "of its PUBREL (shows that the checker reports duplicates)")
    p.add_argument("--netns", choices=["auto", "on", "off"], default="auto",
                   help="nodes in network namespaces (root); needed by --partition")
    p.add_argument("--restart-after-s", type=float, default=1.0)
    p.add_argument("--partition-s", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=100.0, help="messages/s per publisher")
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--tls", action="store_true",
                   help="tern: mutual TLS on the cluster port (openssl certificates, empty CRL)")
    p.add_argument("--tls-reloads", type=int, default=0,
                   help="with --tls: SIGHUP every node N times; nothing may be cut or fail")
    a = p.parse_args(argv)
    if a.tls_reloads and not a.tls:
        p.error("--tls-reloads needs --tls")
    if a.tls and a.broker != "tern":
        p.error("--tls is for --broker tern")
    return a


# Times a transfer answered 409 (leadership moved before the request) is asked again.
TRANSFER_RETRIES = 3
# Lines of a node's log printed when it exits by itself.
EXIT_LOG_LINES = 25


def read_log(path):
    """A node's log as text ("" if it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def log_tail(path, lines):
    """The last `lines` lines of the file at `path` (none if it cannot be read)."""
    return read_log(path).splitlines()[-lines:]


class Run:
    def __init__(self, args):
        self.args = args
        self.seed = args.seed if args.seed is not None else random.randrange(1 << 30)
        self.rng = random.Random(self.seed)
        self.clock = Clock()
        self.work = tempfile.mkdtemp(prefix="tern-cluster-check.")
        self.netns = None
        self.nodes = []
        self.kills = []  # {"t", "node", "leader_known", "failover_s"}
        self.pauses = []
        self.partitions = []  # {"node", "from", "to"}
        self.transfers = []  # {"t", "from", "to", "status", "took_s", "writes_after_s"}
        self.power_losses = []  # {"t", "nodes", "down_s", "writes_after_s"}
        self.disks = {}  # node index -> cluster_power.LoopDisk
        self.spares = []  # nodes not yet members (--membership)
        self.removed = []  # nodes removed from the cluster (stopped)
        self.membership = []  # {"t", "added", "add_status", "add_s", "removed", ...}
        self.reloads = []  # {"t", "nodes"}: SIGHUPs (--tls-reloads)
        self.stop = threading.Event()
        self.exits = []  # nodes that exited without our SIGKILL
        self.pubs, self.subs = [], []

    # ---- brokers -----------------------------------------------------------------------
    def start_nodes(self):
        a = self.args
        count = 1 if a.broker == "tern-single" else 3
        use_ns = a.netns == "on" or (a.netns == "auto" and a.partition)
        spares = 1 if a.membership and a.broker == "tern" else 0
        if use_ns:
            if os.geteuid() != 0 or not shutil.which("ip"):
                raise SystemExit("cluster-check: --partition / --netns need root and `ip`")
            self.netns = cn.Netns(count + spares)
            self.netns.setup()
        made = cn.make_nodes("nats" if a.broker == "nats" else a.broker, count, a.bin,
                             self.work, self.netns, a.sync, spares=spares,
                             snapshot_every=a.snapshot_every, tls=a.tls)
        self.nodes, self.spares = made[:count], made[count:]
        if a.power_losses or a.power_loss_all:
            why = cluster_power.available()
            if why:
                raise SystemExit(f"cluster-check: {why}")
            for node in made:
                self.disks[node.index] = cluster_power.LoopDisk(node)
                self.disks[node.index].setup()
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_listening()
        log(f"{count} {a.broker} node(s) up: "
            + ", ".join(f"{n.name}={n.host}:{n.mqtt_port}" for n in self.nodes)
            + f"; work dir {self.work}")

    def note_exits(self):
        """Nodes that died without being killed by us (a crash, or a signal from elsewhere):
        logged with their exit status and restarted."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is not None:
                code = node.proc.returncode
                self.exits.append({"t": round(self.clock.now(), 3), "node": node.index,
                                   "status": code})
                log(f"{node.name} exited by itself with status {code} (negative: signal); "
                    f"restarting it; see {node.log_path}")
                # The work directory goes at the end of a run without --keep (as in CI):
                # the broker's last words are printed here, where they stay.
                for line in log_tail(node.log_path, EXIT_LOG_LINES):
                    log(f"  {node.name}| {line}")
                self.restart(node)

    def wait_for_leader(self, timeout_s=30.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = cn.find_leader(self.nodes)
            if leader is not None:
                return leader
            time.sleep(0.2)
        return None

    def restart(self, node):
        if self.args.wipe_on_kill:
            shutil.rmtree(node.data_dir, ignore_errors=True)
        node.start()
        try:
            node.wait_listening()
        except RuntimeError as e:
            log(f"restart of {node.name} failed: {e}")

    # ---- clients -----------------------------------------------------------------------
    def start_clients(self):
        a = self.args
        addrs = [(n.host, n.mqtt_port, n.index) for n in self.nodes]
        tag = f"cc{os.getpid() % 100000}"
        qos2 = a.broker != "nats"  # nats-server's MQTT has no QoS 2
        v5 = 4 if a.broker == "nats" else 5  # nats-server 2.9's MQTT is 3.1.1 only
        specs = [("s1", 4), ("s2", v5), ("s3", 4)]
        for i, (name, proto) in enumerate(specs):
            self.subs.append(Subscriber(f"{tag}-{name}", proto, addrs, i, self.clock, self.stop,
                                        f"{tag}/#", at_publish=a.receiver_at_publish))
        for s in self.subs:
            s.start()
        for s in self.subs:
            if not s.subscribed.wait(60):
                raise RuntimeError(f"{s.client_id} got no SUBACK in 60 s")
        pspecs = [("p1q1", 4, 1), ("p2q1", v5, 1), ("p3q2", 4, 2), ("p4q2", v5, 2)]
        if not qos2:
            pspecs = [("p1q1", 4, 1), ("p2q1", 4, 1), ("p3q1", 4, 1), ("p4q1", 4, 1)]
        for i, (name, proto, qos) in enumerate(pspecs):
            cid = f"{tag}-{name}"
            self.pubs.append(Publisher(cid, proto, addrs, i + 1, self.clock, self.stop,
                                       f"{tag}/{name}", qos, a.window, a.rate))
        for p in self.pubs:
            p.start()

    def acks_after(self, t, not_via=None):
        """Time of the first acknowledgement after t of a message first sent after t or on a
        connection dialed after t, over all publishers (not counting connections to node
        `not_via`); None if none yet."""
        best = None
        for p in self.pubs:
            for (n, at, dialed_at, node) in list(p.acks):
                if at <= t or node == not_via:
                    continue
                # Not an acknowledgement the dead node sent before it died (still in the
                # socket's receive buffer when the kill came).
                if p.first_sent.get(n, -1) > t or dialed_at > t:
                    best = at if best is None else min(best, at)
                    break
        return best

    # ---- faults ------------------------------------------------------------------------
    def do_kill(self):
        self.note_exits()
        victim, known = cn.pick_victim(self.nodes, self.rng)
        if victim is None:
            return
        victim.kill()
        t = self.clock.now()
        log(f"kill -9 {victim.name} ({'leader' if known else 'leader unknown: random node'})")
        self.kills.append({"t": t, "node": victim.index, "leader_known": known})
        time.sleep(self.args.restart_after_s)
        self.restart(victim)
        # Measure this kill before the next fault.
        deadline = time.monotonic() + FAILOVER_GIVE_UP_S
        while self.acks_after(t) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        first = self.acks_after(t)
        self.kills[-1]["failover_s"] = round(first - t, 3) if first else FAILOVER_GIVE_UP_S
        log(f"  writes again after {self.kills[-1]['failover_s']} s")

    def do_pause(self):
        live = [n for n in self.nodes if n.alive()]
        if not live:
            return
        node = self.rng.choice(live)
        pause_s = self.rng.uniform(1.0, 3.0)
        node.pause()
        log(f"SIGSTOP {node.name} for {pause_s:.1f} s")
        time.sleep(pause_s)
        node.resume()
        self.pauses.append({"t": self.clock.now(), "node": node.index, "s": round(pause_s, 2)})

    def do_reload(self):
        """SIGHUP to every node: with --tls the cluster port's files are read again and every
        open link checked against them; they revoke nothing, so nothing may be cut."""
        live = [n for n in self.nodes if n.alive()]
        for node in live:
            node.hangup()
        log("SIGHUP " + ", ".join(n.name for n in live))
        self.reloads.append({"t": self.clock.now(), "nodes": [n.index for n in live]})

    def reload_outcome(self):
        """Over every node's log: cluster TLS reloads done, links they cut, and reloads that
        failed."""
        done = cut = failed = 0
        for node in self.nodes + self.spares + self.removed:
            text = read_log(node.log_path)
            cut += text.count("cut after the reload")
            lines = [line for line in text.splitlines() if "cluster TLS" in line]
            done += sum(1 for line in lines if "reloaded" in line)
            failed += sum(1 for line in lines if "reload failed" in line)
        return done, cut, failed

    def do_partition(self):
        leader = self.wait_for_leader(10.0) or self.rng.choice(self.nodes)
        self.netns.partition(leader.index)
        t0 = self.clock.now()  # every route in place: from here on the node is cut
        log(f"partition: {leader.name} cut from the others for {self.args.partition_s} s")
        time.sleep(self.args.partition_s)
        t1 = self.clock.now()  # still cut until heal() has run
        self.netns.heal()
        first = self.acks_after(t0, not_via=leader.index)
        writes_s = round(first - t0, 3) if first else None
        self.partitions.append({"node": leader.index, "from": t0, "to": t1,
                                "majority_writes_after_s": writes_s})
        log(f"  healed; the majority acknowledged again {writes_s} s after the cut")

    def do_transfer(self):
        """Hands the leadership to another node (the next in order) through the leader's HTTP
        API, once that node has the log the leader had committed (a node just restarted may
        still catch up: the leader would answer 503 after 10 s)."""
        leader = self.wait_for_leader(10.0)
        if leader is None or self.args.broker != "tern":
            return
        to = self.nodes[(self.nodes.index(leader) + 1) % len(self.nodes)]
        deadline = time.monotonic() + 30.0
        view = leader.http_json("/api/v1/cluster") or {}
        commit = view.get("commit_index") or 0
        while time.monotonic() < deadline:
            view = leader.http_json("/api/v1/cluster") or {}
            match = [m.get("match_index") or 0 for m in view.get("members", [])
                     if m.get("id") == to.index]
            if match and match[0] >= commit:
                break
            time.sleep(0.1)
        t = self.clock.now()
        status, body = leader.http_post("/api/v1/cluster/leader", {"id": to.index})
        took = round(self.clock.now() - t, 3)
        log(f"transfer {leader.name} -> {to.name}: {status} {body} ({took} s)")
        # 409 "not the leader": leadership moved between finding the leader and asking it
        # (the broker's answer is right; an operator asks the new leader). Asked again of
        # whoever leads now, a few times; the transfer must still end in a 200.
        for _ in range(TRANSFER_RETRIES):
            if status != 409:
                break
            leader = self.wait_for_leader(10.0)
            if leader is None:
                break
            if leader is to:  # it leads already: hand it on to the next, as planned
                to = self.nodes[(self.nodes.index(leader) + 1) % len(self.nodes)]
            status, body = leader.http_post("/api/v1/cluster/leader", {"id": to.index})
            took = round(self.clock.now() - t, 3)
            log(f"  asked again: {leader.name} -> {to.name}: {status} {body} ({took} s)")
        deadline = time.monotonic() + FAILOVER_GIVE_UP_S
        while self.acks_after(t) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        first = self.acks_after(t)
        self.transfers.append({"t": t, "from": leader.index, "to": to.index, "status": status,
                               "took_s": took,
                               "writes_after_s": round(first - t, 3) if first else None})
        log(f"  writes again after {self.transfers[-1]['writes_after_s']} s")

    def do_power_loss(self, every_node=False):
        """The leader's power (or every node's) goes out; the node restarts from what had
        reached its disk (scripts/cluster_power.py)."""
        self.note_exits()
        if every_node:
            victims = [n for n in self.nodes]
        else:
            victim, _known = cn.pick_victim(self.nodes, self.rng)
            victims = [victim] if victim is not None else []
        if not victims:
            return
        t = self.clock.now()
        log(f"power loss: {', '.join(n.name for n in victims)}")
        down = cluster_power.power_loss(victims, self.disks, self.restart)
        deadline = time.monotonic() + FAILOVER_GIVE_UP_S
        while self.acks_after(t) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        first = self.acks_after(t)
        self.power_losses.append({"t": t, "nodes": [n.index for n in victims],
                                  "down_s": round(down, 3),
                                  "writes_after_s": round(first - t, 3) if first else None})
        log(f"  back after {down:.2f} s; writes again after "
            f"{self.power_losses[-1]['writes_after_s']} s")

    def do_membership(self):
        """Adds the spare node under the load (it joins as a learner, catches up, and the call
        answers once it is promoted), then removes a follower of the others and stops it."""
        if not self.spares:
            return
        spare = self.spares.pop(0)
        t = self.clock.now()
        spare.start()
        spare.wait_listening()
        leader = self.wait_for_leader(10.0)
        if leader is None:
            return
        body = {"id": spare.index, "addr": f"{spare.host}:{spare.cluster_port}"}
        status, answer = leader.http_post("/api/v1/cluster/members", body, timeout_s=120.0)
        added_s = round(self.clock.now() - t, 3)
        log(f"add {spare.name} through {leader.name}: {status} {answer} ({added_s} s)")
        self.nodes.append(spare)
        record = {"t": t, "added": spare.index, "add_status": status, "add_s": added_s}
        leader = self.wait_for_leader(10.0)
        victims = [n for n in self.nodes if n is not leader and n is not spare and n.alive()]
        if leader is not None and victims:
            victim = self.rng.choice(victims)
            t1 = self.clock.now()
            status, answer = leader.http_post(f"/api/v1/cluster/members/{victim.index}", None,
                                              timeout_s=60.0, method="DELETE")
            log(f"remove {victim.name} through {leader.name}: {status} {answer}")
            self.nodes.remove(victim)
            self.removed.append(victim)
            victim.stop()
            deadline = time.monotonic() + FAILOVER_GIVE_UP_S
            while self.acks_after(t1) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            first = self.acks_after(t1)
            record.update({"removed": victim.index, "remove_status": status,
                           "writes_after_s": round(first - t1, 3) if first else None})
        self.membership.append(record)

    def faults(self):
        a = self.args
        events = (["kill"] * a.kills + ["pause"] * a.pauses + ["transfer"] * a.transfers
                  + ["power"] * a.power_losses + ["reload"] * a.tls_reloads)
        self.rng.shuffle(events)
        if a.partition:
            events.insert(len(events) // 2, "partition")
        if a.power_loss_all:
            events.insert(2 * len(events) // 3, "power-all")
        if a.membership:
            events.insert(len(events) // 3, "membership")
        end = a.seconds
        gap = end / (len(events) + 1)
        for i, ev in enumerate(events):
            due = gap * (i + 1)
            while self.clock.now() - self.t_load < due:
                self.note_exits()
                time.sleep(0.05)
            {"kill": self.do_kill, "pause": self.do_pause, "partition": self.do_partition,
             "transfer": self.do_transfer, "power": self.do_power_loss,
             "power-all": lambda: self.do_power_loss(every_node=True),
             "membership": self.do_membership, "reload": self.do_reload}[ev]()
        while self.clock.now() - self.t_load < end:
            self.note_exits()
            time.sleep(0.1)

    # ---- the run -----------------------------------------------------------------------
    def finish_and_drain(self):
        self.note_exits()
        for n in self.nodes:
            n.resume()
            if not n.alive():
                self.restart(n)
        if self.netns:
            self.netns.heal()
        for p in self.pubs:
            p.finishing = True
        deadline = time.monotonic() + FINISH_TIMEOUT_S
        for p in self.pubs:
            p.join(max(0.1, deadline - time.monotonic()))
        unfinished = [p.client_id for p in self.pubs if p.is_alive()]
        if unfinished:
            log(f"publishers with messages still in flight after {FINISH_TIMEOUT_S} s: {unfinished}")
        want = {p.client_id: p.acked for p in self.pubs}
        last, idle_since = -1, time.monotonic()
        while time.monotonic() - idle_since < DRAIN_IDLE_S:
            got = sum(len(s.deliveries) for s in self.subs)
            if self.complete(want):
                break
            if got != last:
                last, idle_since = got, time.monotonic()
            time.sleep(0.2)
        self.stop.set()
        for c in self.pubs + self.subs:
            c.join(2)
        return unfinished

    def complete(self, want):
        for s in self.subs:
            seen = {}
            for (pub, n, _q, _t) in list(s.deliveries):
                seen.setdefault(pub, set()).add(n)
            for pub, acked in want.items():
                if not set(acked) <= seen.get(pub, set()):
                    return False
        return True

    def check(self):
        lost = dups = reordered = dup_q1 = by_client = minority = 0
        examples = []
        for s in self.subs:
            per_pub = {}
            for d in s.deliveries:
                per_pub.setdefault(d[0], []).append(d)
            for p in self.pubs:
                got = per_pub.get(p.client_id, [])
                counts, highest = {}, -1
                for (_pub, n, _q, _t) in got:
                    counts[n] = counts.get(n, 0) + 1
                    if counts[n] == 1:
                        if n < highest:
                            reordered += 1
                            if len(examples) < 10:
                                examples.append(f"{s.client_id}: {p.client_id}:{n} after {highest}")
                        highest = max(highest, n)
                for n in sorted(p.acked):
                    if n not in counts:
                        lost += 1
                        if len(examples) < 10:
                            examples.append(f"{s.client_id}: lost {p.client_id}:{n}")
                for n, c in counts.items():
                    if c > 1 and p.qos == 2:
                        mine = min(c - 1, p.resent_after_pubrel.get(n, 0))
                        by_client += mine
                        dups += c - 1 - mine
                        if c - 1 > mine and len(examples) < 10:
                            examples.append(f"{s.client_id}: {p.client_id}:{n} x{c}")
                    elif c > 1:
                        dup_q1 += c - 1
        cut_sent = majority = 0
        for cut in self.partitions:
            for p in self.pubs:
                for n, sent in list(p.first_sent.items()):
                    if cut["from"] < sent < cut["to"] and p.first_node.get(n) == cut["node"]:
                        cut_sent += 1
                for (n, at, _dialed, node) in p.acks:
                    if node != cut["node"] and cut["from"] < p.first_sent.get(n, -1) \
                            and at < cut["to"]:
                        majority += 1
                for (n, at, _dialed, node) in p.acks:
                    sent = p.first_sent.get(n, -1)
                    if node == cut["node"] and cut["from"] < sent and at < cut["to"]:
                        minority += 1
                        if len(examples) < 10:
                            examples.append(f"{p.client_id}:{n} sent {sent:.3f} acked {at:.3f} "
                                            f"by cut n{node} ({cut['from']:.3f}..{cut['to']:.3f})")
        return {"lost": lost, "duplicates": dups, "reordered": reordered,
                "minority_acks": minority, "sent_to_cut_node": cut_sent,
                "majority_acks_during_cut": majority, "qos1_duplicates": dup_q1,
                "client_resent_after_pubrel": by_client, "examples": examples}

    def main(self):
        a = self.args
        result = {"broker": a.broker, "seed": self.seed}
        try:
            self.start_nodes()
            if a.broker != "tern-single":
                leader = self.wait_for_leader()
                log(f"leader: {leader.name if leader else 'unknown (no /api/v1/cluster answer)'}")
            self.start_clients()
            self.t_load = self.clock.now()
            log(f"load on: {len(self.pubs)} publishers x {a.rate}/s, {len(self.subs)} subscribers")
            self.faults()
            unfinished = self.finish_and_drain()
            result.update(self.check())
            result["unfinished_publishers"] = len(unfinished)
        finally:
            self.stop.set()
            for n in self.nodes + self.spares + self.removed:
                n.stop()
            cluster_power.teardown(self.disks)
            if self.netns:
                self.netns.teardown()
        fail = [k["failover_s"] for k in self.kills if "failover_s" in k]
        result.update({
            "failover_max_s": max(fail) if fail else None,
            "kills": len(self.kills), "pauses": len(self.pauses),
            "partitions": len(self.partitions),
            "transfers": self.transfers,
            "power_losses": self.power_losses,
            "membership": self.membership,
            # From the cut to the first new acknowledgement through the other nodes. None (no
            # acknowledgement through the majority before the heal) fails the run: the
            # majority must go on. Clients whose connection a follower forwards to the cut
            # leader notice only by their keep alive (3 s; paho gives up after up to 2x), so
            # the cut lasts 10 s by default.
            "partition_writes_after_s": [c.get("majority_writes_after_s") for c in self.partitions],
            "leader_unknown_kills": sum(1 for k in self.kills if not k["leader_known"]),
            "acked": sum(len(p.acked) for p in self.pubs),
            "published": sum(p.next for p in self.pubs),
            "delivered": sum(len(s.deliveries) for s in self.subs),
            "sessions_lost": sum(s.sessions_lost for s in self.subs),
            # paho sending a message after a later one on one connection (MQTT-4.6.0-1): the
            # client's doing, not the broker's; not expected since publishing waits for CONNACK.
            "client_sent_out_of_order": sum(p.sent_out_of_order for p in self.pubs),
            "reconnects": sum(max(0, c.conn_seq - 1) for c in self.pubs + self.subs),
            "failovers_s": fail, "seconds": a.seconds,
            "unexpected_exits": len(self.exits), "exits": self.exits,
            "tls": a.tls, "tls_reloads": len(self.reloads),
        })
        (result["reloads_done"], result["reload_cuts"],
         result["reload_failures"]) = self.reload_outcome()
        ok = (result["lost"] == 0 and result["duplicates"] == 0 and result["reordered"] == 0
              and result["minority_acks"] == 0 and result["unfinished_publishers"] == 0
              and not self.exits
              and all(c.get("majority_writes_after_s") is not None for c in self.partitions)
              and all(x["status"] == 200 and x["writes_after_s"] is not None
                      for x in self.transfers)
              and all(x["writes_after_s"] is not None for x in self.power_losses)
              and all(x["add_status"] == 200 and x.get("remove_status") == 200
                      and x.get("writes_after_s") is not None for x in self.membership)
              and result["reload_cuts"] == 0 and result["reload_failures"] == 0
              # Each round of SIGHUPs reached at least one node's cluster TLS (a kill can
              # take a node before it handles its signal): else the check saw nothing.
              and result["reloads_done"] >= len(self.reloads)
              and (not fail or max(fail) <= FAILOVER_LIMIT_S))
        result["ok"] = ok
        if a.keep:
            result["work_dir"] = self.work
        else:
            shutil.rmtree(self.work, ignore_errors=True)
        return result


def self_test():
    """The checker on made-up records with one lost, one duplicated and one reordered message
    (and QoS 1 repeats, which are allowed): it must count exactly those."""
    from types import SimpleNamespace as NS
    q1 = NS(client_id="p1", qos=1, acked={0, 1, 2, 3}, resent_after_pubrel={}, acks=[],
            first_sent={})
    q2 = NS(client_id="p2", qos=2, acked={0, 1, 2, 3}, resent_after_pubrel={}, acks=[],
            first_sent={})
    good = NS(client_id="s1", deliveries=[("p1", n, 1, 0) for n in (0, 1, 1, 2, 3)]
              + [("p2", n, 2, 0) for n in (0, 1, 2, 3)])
    bad = NS(client_id="s2", deliveries=[("p1", n, 1, 0) for n in (0, 2, 1, 3)]
             + [("p2", n, 2, 0) for n in (0, 1, 1, 3)])
    run = Run.__new__(Run)
    run.pubs, run.subs, run.partitions = [q1, q2], [good, bad], []
    got = run.check()
    want = {"lost": 1, "duplicates": 1, "reordered": 1, "qos1_duplicates": 1}
    wrong = {k: got[k] for k in want if got[k] != want[k]}
    print(json.dumps({"self_test": "failed" if wrong else "ok", "got": got, "want": want}))
    return 1 if wrong else 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    args = parse_args(argv)
    run = Run(args)
    hard_stop = args.seconds + WATCHDOG_SLACK_S

    def watchdog():
        time.sleep(hard_stop)
        log(f"watchdog: the run exceeded {hard_stop:.0f} s; stopping")
        for n in run.nodes:
            n.kill()
        if run.netns:
            run.netns.teardown()
        print(json.dumps({"lost": None, "duplicates": None, "reordered": None,
                          "failover_max_s": None, "error": "watchdog"}), flush=True)
        os._exit(2)

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        result = run.main()
    except (RuntimeError, OSError) as e:
        log(f"error: {e}")
        print(json.dumps({"lost": None, "duplicates": None, "reordered": None,
                          "failover_max_s": None, "error": str(e)}), flush=True)
        return 2
    for ex in result.get("examples", []):
        log(f"  {ex}")
    first = ("lost", "duplicates", "reordered", "failover_max_s", "kills", "pauses")
    ordered = {k: result[k] for k in first}
    ordered.update({k: v for k, v in result.items() if k not in first and k != "examples"})
    print(json.dumps(ordered, separators=(",", ":")), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
