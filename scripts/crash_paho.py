#!/usr/bin/env python3
"""A paho-mqtt 2.x client with a persistent session for the crash test
(crates/server/tests/crash_exactly_once.rs), run as a subprocess.

Usage:
  crash_paho.py sub  PORT_FILE CLIENT_ID PROTOCOL FILTER
  crash_paho.py pub  PORT_FILE CLIENT_ID PROTOCOL TOPIC QOS WINDOW

PROTOCOL is 311 (clean_session=False) or 5 (clean_start=False, session expiry 0xFFFFFFFF).
PORT_FILE holds the broker's port; the test rewrites it after each restart (the broker comes
back on a new ephemeral port). While the broker is down it holds a port that refuses
connections, so the client keeps failing to reconnect, as paho's own auto-reconnect does
against a fixed port; or nothing, and then the client waits without dialing (the test's
TERN_CRASH_PUB_WAITS=1 does that for publishers, which makes the first paho bug below rare). The client reconnects with the same client object, so paho keeps its
session state: in-flight PUBLISHes are resent with DUP, PUBREL after PUBREC, and received
QoS 2 messages wait for their PUBREL.

paho 2.1/2.2 bug this reproduces (and reports): every connection attempt resets the state of
its stored messages, and a second reset turns "resend PUBREL" into "resend PUBLISH, DUP=0". So
after one failed attempt, a message whose PUBREL was already sent is published again, against
MQTT-4.3.3-1 (3.1.1) / MQTT-4.3.3-6 (v5); a receiver that processed the PUBREL must take it as
a new message (MQTT-4.3.3-2 (3.1.1) / MQTT-4.3.3-10..12 (v5)). The script watches paho's log
for this and reports it, so the checker can tell such duplicates from the broker's.

A second paho bug: PUBLISHes of messages published between a reconnect attempt and its
CONNACK go out before the CONNACK's resends of older ones (MQTT-4.6.0-1). This script publishes
only once connected, so it should not happen here; if a PUBLISH still leaves after a later
message's on one connection, it is reported too, so that the broker is not blamed for the order.

Why paho: its subscriber hands a QoS 2 message to the application at PUBREL (the spec's
Method A, MQTT 3.1.1 Figure 4.3), so the order of the broker's PUBRELs is the order of
delivery; and its publisher resends exactly what a crash leaves in flight. Both reproduced
issue 10 where the raw test clients did not.

Commands on stdin, one per line:
  limit N   (pub) publish messages up to number N-1 (the test paces publishers by the
            slowest subscriber, so that no session queue overflows)
  finish    (pub) publish nothing new; report "done" once nothing is in flight
  stop      disconnect and exit (stdin EOF does the same)
  away      (sub) disconnect cleanly (DISCONNECT) and stay away, keeping paho's session
            state (QoS 2 messages held until PUBREL), until "back": the test sends it shortly
            before a kill, so the session is offline with exchanges in flight when the broker
            dies, and the client comes back after the restart to a backlog (issue 25)
  back      (sub) reconnect again (with the same client object, clean_session=False)
A publisher keeps WINDOW messages unacknowledged while the limit allows.

Events on stdout, one JSON object per line (flushed):
  {"ev":"connected","sp":session_present}     {"ev":"lost"}
  {"ev":"subscribed"}                          (sub, after SUBACK)
  {"ev":"msg","topic":..,"payload":..,"qos":..,"dup":..,"mid":..}   (sub, one per delivery)
  {"ev":"rec","n":N,"qos":2}                   (pub, PUBREC for message N)
  {"ev":"ack","n":N,"qos":Q}                   (pub, PUBACK / PUBCOMP for message N)
  {"ev":"done","qos":Q}                        (pub, finished with nothing in flight)
  {"ev":"resent_after_pubrel","n":N,"mid":M,"dup":D}  (pub, the first paho bug above)
  {"ev":"sent_out_of_order","n":N,"after":M}   (pub, the second: N went out after M > N)
  {"ev":"away","held":H}                       (sub, after its DISCONNECT; H QoS 2 await PUBREL)
  {"ev":"error","what":..}
Payloads are "CLIENT_ID:N".
"""

import json
import os
import queue
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from paho_log import CONNECT_SENT_LOG, PUBLISH_SENT_LOG, PUBREC_LOG, PUBREL_SENT_LOG

HOST = "127.0.0.1"
# The process never outlives a forgotten test by more than this.
MAX_LIFETIME_S = 1800.0
RECONNECT_PAUSE_S = 0.05
# Bound on flushing the DISCONNECT of "away" (paho closes the socket once it is written).
AWAY_FLUSH_S = 0.5
# Messages handed to paho beyond its in-flight window. Kept small: after a reconnect paho
# resends every stored message at once, ignoring max_inflight_messages (its reset loop never
# counts), and a long queue would exceed the broker's Receive Maximum.
QUEUED_BEHIND_WINDOW = 16


def emit(**event):
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def read_port(path):
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def stdin_commands(commands):
    for line in sys.stdin:
        commands.put(line.strip())
    commands.put("stop")


class Client:
    def __init__(self, role, port_file, client_id, protocol, topic, qos=0, window=0):
        self.role = role
        self.port_file = port_file
        self.client_id = client_id
        self.topic = topic
        self.qos = qos
        self.window = window
        self.v5 = protocol == "5"
        proto = mqtt.MQTTv5 if self.v5 else mqtt.MQTTv311
        kwargs = {"client_id": client_id, "protocol": proto}
        if not self.v5:
            kwargs["clean_session"] = False
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, **kwargs)
        # The publisher: 256 QoS 2 in flight. paho's own queue is unbounded (0);
        # publish_more() decides how much it is handed.
        self.c.max_inflight_messages_set(max(window, 20))
        self.c.max_queued_messages_set(0)
        self.c.on_connect = self.on_connect
        self.c.on_disconnect = self.on_disconnect
        self.c.on_subscribe = self.on_subscribe
        self.c.on_message = self.on_message
        self.c.on_publish = self.on_publish
        # paho has no callback for PUBREC; its debug log line is the only public trace of it.
        self.c.on_log = self.on_log
        self.connected = False
        self.away = False  # told "away" and not yet "back": no reconnect attempts
        self.limit = 0
        self.finishing = False
        self.pubrel_sent = set()  # mids whose PUBREL paho has sent (PUBCOMP not yet received)
        self.highest_sent = -1  # highest message number PUBLISHed on this connection
        self.publishing = None  # the number inside publish(): paho logs before returning the mid
        self.done = False
        self.next = 0
        self.by_mid = {}  # mid -> n, published and not completed

    # --- callbacks (all run on this thread, inside loop()) ---------------------------------
    def on_connect(self, _c, _u, flags, reason_code, _props):
        if reason_code.is_failure:
            emit(ev="error", what=f"CONNACK {reason_code}")
            return
        self.connected = True
        emit(ev="connected", sp=bool(flags.session_present))
        if self.role == "sub" and not flags.session_present:
            self.c.subscribe(self.topic, qos=2)

    def on_subscribe(self, _c, _u, _mid, reason_codes, _props):
        if all(rc.value == 2 for rc in reason_codes):
            emit(ev="subscribed")
        else:
            emit(ev="error", what=f"SUBACK {reason_codes}")

    def on_disconnect(self, _c, _u, _flags, _reason, _props):
        if self.connected:
            emit(ev="lost")
        self.connected = False

    def on_message(self, _c, _u, msg):
        emit(
            ev="msg",
            topic=msg.topic,
            payload=msg.payload.decode("utf-8", "replace"),
            qos=msg.qos,
            dup=bool(msg.dup),
            mid=msg.mid,
        )

    def on_publish(self, _c, _u, mid, _reason, _props):
        self.pubrel_sent.discard(mid)
        n = self.by_mid.pop(mid, None)
        if n is not None:
            emit(ev="ack", n=n, qos=self.qos)

    def on_log(self, _c, _u, _level, buf):
        m = PUBREC_LOG.match(buf)
        if m:
            n = self.by_mid.get(int(m.group(1)))
            if n is not None:
                emit(ev="rec", n=n, qos=self.qos)
            return
        m = PUBREL_SENT_LOG.match(buf)
        if m:
            self.pubrel_sent.add(int(m.group(1)))
            return
        if CONNECT_SENT_LOG.match(buf):
            self.highest_sent = -1
            return
        m = PUBLISH_SENT_LOG.match(buf)
        if not m:
            return
        mid = int(m.group(2))
        n = self.by_mid.get(mid, self.publishing)
        if mid in self.pubrel_sent:
            emit(ev="resent_after_pubrel", n=n, mid=mid, dup=m.group(1) == "1")
        if n is not None:
            if n < self.highest_sent:
                emit(ev="sent_out_of_order", n=n, after=self.highest_sent)
            self.highest_sent = max(self.highest_sent, n)

    # --- the loop -------------------------------------------------------------------------
    def leave(self, socket_open):
        """"away": a clean DISCONNECT (if a socket is open), then no dialing until "back".
        paho keeps received QoS 2 messages awaiting their PUBREL across it."""
        self.away = True
        if socket_open:
            self.c.disconnect()
            deadline = time.monotonic() + AWAY_FLUSH_S
            while time.monotonic() < deadline:
                if self.c.loop(0.02) != mqtt.MQTT_ERR_SUCCESS:
                    break
        self.connected = False
        # paho has no public count of them; the number only explains a failure.
        emit(ev="away", held=len(getattr(self.c, "_in_messages", {})))

    def dial(self):
        port = read_port(self.port_file)
        if port is None:
            return False
        try:
            # connect() again on the same client object is paho's way to change the port; it
            # keeps (and on CONNACK resends) the session state of a non-clean session.
            if self.v5:
                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = 0xFFFFFFFF
                self.c.connect(HOST, port, keepalive=30, clean_start=False, properties=props)
            else:
                self.c.connect(HOST, port, keepalive=30)
            return True
        except (OSError, RuntimeError):
            return False

    def publish_more(self):
        # Keep the window full and a little queued behind it, not the whole limit at once:
        # what a crash leaves in flight is then the "256 in flight".
        if self.finishing:
            if not self.by_mid and not self.done:
                self.done = True
                emit(ev="done", qos=self.qos)
            return
        while self.next < self.limit and len(self.by_mid) < self.window + QUEUED_BEHIND_WINDOW:
            n = self.next
            self.publishing = n
            info = self.c.publish(self.topic, f"{self.client_id}:{n}", qos=self.qos)
            self.publishing = None
            self.by_mid[info.mid] = n
            self.next += 1

    def run(self):
        commands = queue.Queue()
        threading.Thread(target=stdin_commands, args=(commands,), daemon=True).start()
        started = time.monotonic()
        socket_open = False
        while time.monotonic() - started < MAX_LIFETIME_S:
            try:
                while True:
                    cmd = commands.get_nowait()
                    if cmd == "stop":
                        if self.connected:
                            self.c.disconnect()
                            self.c.loop(0.1)
                        return
                    if cmd == "away" and self.role == "sub" and not self.away:
                        self.leave(socket_open)
                        socket_open = False
                    elif cmd == "back":
                        self.away = False
                    elif cmd == "finish":
                        self.finishing = True
                    elif cmd.startswith("limit "):
                        self.limit = max(self.limit, int(cmd.split()[1]))
            except queue.Empty:
                pass
            if not socket_open and self.away:
                time.sleep(RECONNECT_PAUSE_S)
                continue
            if not socket_open:
                socket_open = self.dial()
                if not socket_open:
                    time.sleep(RECONNECT_PAUSE_S)
                    continue
            if self.role == "pub" and self.connected:
                self.publish_more()
            rc = self.c.loop(0.02)
            if rc != mqtt.MQTT_ERR_SUCCESS:
                if self.connected:
                    emit(ev="lost")
                self.connected = False
                socket_open = False
                time.sleep(RECONNECT_PAUSE_S)


def main(argv):
    if len(argv) < 5 or argv[0] not in ("sub", "pub"):
        print(__doc__, file=sys.stderr)
        return 2
    role, port_file, client_id, protocol, topic = argv[:5]
    if role == "pub":
        if len(argv) != 7:
            print(__doc__, file=sys.stderr)
            return 2
        client = Client(role, port_file, client_id, protocol, topic, int(argv[5]), int(argv[6]))
    else:
        client = Client(role, port_file, client_id, protocol, topic)
    client.run()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
