"""paho-mqtt 2.x clients of scripts/cluster_check.py, one thread each, every one with a node
list: it dials its first node, and whenever its connection drops (or no CONNACK comes within
CONNACK_TIMEOUT_S) it dials the next node of the list with the same client object, so paho
keeps its session state: in-flight PUBLISHes are resent with DUP, PUBREL after PUBREC, and
received QoS 2 messages wait for their PUBREL.

- Publisher: QoS 1 or 2, MQTT 3.1.1 (clean_session=False) or 5 (clean_start=False, session
  expiry 0xFFFFFFFF), payload "ID:N" with N consecutive from 0 on its own topic, at most
  `window` unacknowledged, paced to `rate_per_s`. It publishes only while connected (paho
  would otherwise send new PUBLISHes before the CONNACK's resends, MQTT-4.6.0-1).
  Acknowledged means PUBACK (QoS 1) or PUBREC (QoS 2: the broker owns the message from then
  on; stricter than waiting for PUBCOMP).
- Subscriber: persistent session, subscribes to the run's topics at QoS 2, and records every
  delivery. paho hands a QoS 2 message to on_message when its PUBREL arrives
  (paho.mqtt.client._handle_pubrel: the spec's Method A receiver of MQTT 3.1.1 Figure 4.3), so
  a QoS 2 message counts as received at PUBREL, and the order of the PUBRELs is the order of
  delivery.

paho 2.2's reconnect reset turns "resend PUBREL" into "resend PUBLISH, DUP=0" when a connect
attempt fails between two resets (see scripts/crash_paho.py): a new message to the broker
(MQTT-4.3.3-2). Here the reset is patched to keep "resend PUBREL", so every QoS 2 duplicate is
the broker's; the log is still watched, and a PUBLISH sent after its PUBREL is reported as
`client_resent_after_pubrel` (its copies are then not counted against the broker).
"""

import collections
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from paho_log import CONNECT_SENT_LOG, PUBLISH_SENT_LOG, PUBREC_LOG, PUBREL_SENT_LOG

CONNACK_TIMEOUT_S = 3.0
KEEPALIVE_S = 3
LOOP_S = 0.02
RECONNECT_PAUSE_S = 0.05


def _patched_reset_out(self):
    """paho 2.2's _messages_reconnect_reset_out, except that a QoS 2 message whose PUBREL is
    due stays so across a second reset (MQTT-4.3.3-1: no PUBLISH after PUBREL)."""
    with self._out_message_mutex:
        self._inflight_messages = 0
        for m in self._out_messages.values():
            m.timestamp = 0
            if m.qos == 1:
                if m.state == mqtt.mqtt_ms_wait_for_puback:
                    m.dup = True
                m.state = mqtt.mqtt_ms_publish
            elif m.qos == 2:
                if m.state in (mqtt.mqtt_ms_wait_for_pubcomp, mqtt.mqtt_ms_resend_pubrel):
                    m.state = mqtt.mqtt_ms_resend_pubrel
                else:
                    if m.state == mqtt.mqtt_ms_wait_for_pubrec:
                        m.dup = True
                    m.state = mqtt.mqtt_ms_publish
            else:
                m.state = mqtt.mqtt_ms_publish


mqtt.Client._messages_reconnect_reset_out = _patched_reset_out


class Clock:
    """One monotonic clock for the clients and the fault injector."""

    def __init__(self):
        self.t0 = time.monotonic()

    def now(self):
        return time.monotonic() - self.t0


class BaseClient(threading.Thread):
    def __init__(self, client_id, protocol, nodes, first, clock, stop):
        super().__init__(daemon=True, name=client_id)
        self.client_id = client_id
        self.v5 = protocol == 5
        self.nodes = nodes  # (host, port, node index)
        self.at = first  # index into nodes of the current / next dial
        self.clock = clock
        self.stop_event = stop
        self.connected = False
        self.conn_seq = 0  # connections that got a CONNACK
        self.dials = 0
        self.dialed_at = 0.0
        self.errors = []
        kwargs = {"client_id": client_id,
                  "protocol": mqtt.MQTTv5 if self.v5 else mqtt.MQTTv311}
        if not self.v5:
            kwargs["clean_session"] = False
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, **kwargs)
        self.c.max_inflight_messages_set(1000)  # the window is ours; paho must never queue
        self.c.max_queued_messages_set(0)
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = self._on_disconnect
        self.lock = threading.Lock()

    def node_now(self):
        return self.nodes[self.at % len(self.nodes)][2]

    def _on_connect(self, _c, _u, flags, reason_code, _props):
        if reason_code.is_failure:
            self.errors.append(f"CONNACK {reason_code}")
            return
        self.connected = True
        self.conn_seq += 1
        self.on_connected(bool(flags.session_present))

    def on_connected(self, session_present):
        pass

    def _on_disconnect(self, *_args):
        self.connected = False

    def dial(self):
        host, port, _ = self.nodes[self.at % len(self.nodes)]
        self.dials += 1
        self.dialed_at = self.clock.now()
        try:
            if self.v5:
                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = 0xFFFFFFFF
                self.c.connect(host, port, keepalive=KEEPALIVE_S, clean_start=False,
                               properties=props)
            else:
                self.c.connect(host, port, keepalive=KEEPALIVE_S)
            return True
        except (OSError, RuntimeError, ValueError):
            return False

    def next_node(self):
        self.connected = False
        self.at += 1
        try:
            self.c._sock_close()  # drop a half-open socket without a DISCONNECT
        except Exception:  # noqa: BLE001: a socket already gone is fine
            pass

    def work(self):
        """Called every loop while connected."""

    def finished(self):
        return self.stop_event.is_set()

    def run(self):
        socket_open = False
        while not self.finished():
            if not socket_open:
                socket_open = self.dial()
                if not socket_open:
                    self.next_node()
                    time.sleep(RECONNECT_PAUSE_S)
                    continue
            if self.connected:
                self.work()
            elif self.clock.now() - self.dialed_at > CONNACK_TIMEOUT_S:
                socket_open = False
                self.next_node()
                continue
            rc = self.c.loop(LOOP_S)
            if rc != mqtt.MQTT_ERR_SUCCESS:
                socket_open = False
                self.next_node()
                time.sleep(RECONNECT_PAUSE_S)
        if self.connected:
            try:
                self.c.disconnect()
                self.c.loop(0.1)
            except Exception:  # noqa: BLE001
                pass


class Publisher(BaseClient):
    def __init__(self, client_id, protocol, nodes, first, clock, stop, topic, qos, window,
                 rate_per_s):
        super().__init__(client_id, protocol, nodes, first, clock, stop)
        self.topic = topic
        self.qos = qos
        self.window = window
        self.rate_per_s = rate_per_s
        self.started_at = None
        self.next = 0
        self.by_mid = {}  # mid -> n, published and not completed
        self.first_sent = {}  # n -> time of its first PUBLISH
        self.first_node = {}  # n -> the node it was first sent to
        # (n, time, when its connection was dialed, node index) at PUBACK / PUBREC
        self.acks = []
        self.acked = set()
        self.completed = 0
        self.finishing = False
        self.pubrel_sent = set()
        self.resent_after_pubrel = {}  # n -> count
        self.sent_out_of_order = 0
        self.highest_sent = -1
        self.publishing = None
        self.c.on_publish = self._on_publish
        self.c.on_log = self._on_log

    def finished(self):
        if self.stop_event.is_set():
            return True
        return self.finishing and not self.by_mid

    def _ack(self, n):
        if n is not None and n not in self.acked:
            self.acked.add(n)
            self.acks.append((n, self.clock.now(), self.dialed_at, self.node_now()))

    def _on_publish(self, _c, _u, mid, _reason, _props):
        self.pubrel_sent.discard(mid)
        n = self.by_mid.pop(mid, None)
        if n is not None:
            self._ack(n)  # QoS 1: PUBACK; QoS 2: PUBCOMP (PUBREC already counted)
            self.completed += 1

    def _on_log(self, _c, _u, _level, buf):
        m = PUBREC_LOG.match(buf)
        if m:
            self._ack(self.by_mid.get(int(m.group(1))))
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
        if mid in self.pubrel_sent and n is not None:
            self.resent_after_pubrel[n] = self.resent_after_pubrel.get(n, 0) + 1
        if n is not None:
            if n < self.highest_sent:
                self.sent_out_of_order += 1
            self.highest_sent = max(self.highest_sent, n)

    def work(self):
        if self.finishing:
            return
        now = self.clock.now()
        if self.started_at is None:
            self.started_at = now
        due = int((now - self.started_at) * self.rate_per_s) + 1
        while self.next < due and len(self.by_mid) < self.window:
            n = self.next
            self.publishing = n
            info = self.c.publish(self.topic, f"{self.client_id}:{n}", qos=self.qos)
            self.publishing = None
            self.by_mid[info.mid] = n
            self.first_sent[n] = now
            self.first_node[n] = self.node_now()
            self.next += 1


class _RecordAtPublish(collections.OrderedDict):
    """paho's store of received QoS 2 messages awaiting PUBREL, counting each at its PUBLISH:
    the broken receiver of --receiver-at-publish."""

    def __init__(self, record):
        super().__init__()
        self.record = record

    def __setitem__(self, mid, message):
        self.record(message)
        super().__setitem__(mid, message)


class Subscriber(BaseClient):
    def __init__(self, client_id, protocol, nodes, first, clock, stop, topic_filter,
                 at_publish=False):
        super().__init__(client_id, protocol, nodes, first, clock, stop)
        self.filter = topic_filter
        # Broken on purpose (a check of the checker): a QoS 2 message counts when its PUBLISH
        # arrives, so the broker's resends with DUP before PUBREL (MQTT-4.3.3-*) count twice.
        self.at_publish = at_publish
        if at_publish:
            self.c._in_messages = _RecordAtPublish(self._record)
        self.subscribed = threading.Event()
        self.sessions_lost = 0  # CONNACKs without a session after the first SUBACK
        self.deliveries = []  # (publisher id, n, qos, time)
        self.c.on_subscribe = self._on_subscribe
        self.c.on_message = self._on_message

    def on_connected(self, session_present):
        if not session_present:
            if self.subscribed.is_set():
                self.sessions_lost += 1
            self.c.subscribe(self.filter, qos=2)

    def _on_subscribe(self, _c, _u, _mid, reason_codes, _props):
        if all(rc.value == 2 for rc in reason_codes) or self.subscribed.is_set():
            self.subscribed.set()
        else:
            # nats-server grants QoS 1 for QoS 2 subscriptions; that is fine for QoS 1 traffic.
            self.subscribed.set()
            self.errors.append(f"SUBACK {[rc.value for rc in reason_codes]}")

    def _on_message(self, _c, _u, msg):
        if not (self.at_publish and msg.qos == 2):
            self._record(msg)

    def _record(self, msg):
        try:
            pub, n = msg.payload.decode("ascii").rsplit(":", 1)
            self.deliveries.append((pub, int(n), msg.qos, self.clock.now()))
        except ValueError:
            self.errors.append(f"bad payload {msg.payload[:40]!r}")
