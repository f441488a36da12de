#!/usr/bin/env python3
"""Interoperability checks of a running Tern broker with the Eclipse paho-mqtt 2.x client.

Usage: paho_check.py HOST PORT

Covers MQTT 3.1.1 and 5.0: QoS 0/1/2 publish/subscribe, retained set/clear, persistent sessions
(messages published while away), the will on an abnormal close (a child process that dies
without DISCONNECT), no will after DISCONNECT, v5 properties round trip
(response topic, correlation data, content type, user properties, message expiry, payload
format indicator, subscription identifier) and v5 will properties.

Prints one line per check, `PASS name` or `FAIL name: why`, and exits with the number of
failures (0 = all passed). Every wait is bounded.
"""

import queue
import subprocess
import sys
import threading
import time
import uuid

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

WAIT_S = 10.0
HOST = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
PORT = int(sys.argv[2]) if len(sys.argv) > 2 else 1883
RUN = uuid.uuid4().hex[:8]  # keeps topics of reruns apart (retained messages)

PROTOCOLS = [("v311", mqtt.MQTTv311), ("v5", mqtt.MQTTv5)]
failures = 0


class CheckFailed(Exception):
    pass


def expect(cond, why):
    if not cond:
        raise CheckFailed(why)


class Conn:
    """A paho client with its network loop in a thread, and bounded waits."""

    def __init__(self, name, protocol, will=None, persistent=False):
        kwargs = {"client_id": f"paho-{name}-{RUN}", "protocol": protocol}
        if protocol != mqtt.MQTTv5:
            kwargs["clean_session"] = not persistent
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, **kwargs)
        self.protocol = protocol
        self.connected = threading.Event()
        self.reason = None
        self.subacks = {}
        self.messages = queue.Queue()
        self.c.on_connect = self._on_connect
        self.c.on_subscribe = self._on_subscribe
        self.c.on_message = lambda _c, _u, msg: self.messages.put(msg)
        if will:
            self.c.will_set(**will)
        self.session_present = None
        if protocol == mqtt.MQTTv5 and persistent:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 300
            self.c.connect(HOST, PORT, keepalive=30, clean_start=False, properties=props)
        else:
            self.c.connect(HOST, PORT, keepalive=30)
        self.c.loop_start()
        expect(self.connected.wait(WAIT_S), f"{name}: no CONNACK")
        expect(not self.reason.is_failure, f"{name}: CONNACK {self.reason}")

    def _on_connect(self, _c, _u, flags, reason_code, _props):
        self.reason = reason_code
        self.session_present = flags.session_present
        self.connected.set()

    def _on_subscribe(self, _c, _u, mid, reason_codes, _props):
        self.subacks[mid] = reason_codes

    def subscribe(self, topic, qos, properties=None):
        if properties is not None:
            result, mid = self.c.subscribe(topic, qos, properties=properties)
        else:
            result, mid = self.c.subscribe(topic, qos)
        expect(result == mqtt.MQTT_ERR_SUCCESS, f"subscribe {topic}: {result}")
        deadline = time.monotonic() + WAIT_S
        while mid not in self.subacks:
            expect(time.monotonic() < deadline, f"no SUBACK for {topic}")
            time.sleep(0.01)
        codes = self.subacks[mid]
        expect(all(not rc.is_failure for rc in codes), f"SUBACK {topic}: {codes}")

    def publish(self, topic, payload, qos, retain=False, properties=None):
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        info.wait_for_publish(timeout=WAIT_S)
        expect(info.is_published(), f"publish {topic} q{qos} not acknowledged")

    def next_message(self):
        try:
            return self.messages.get(timeout=WAIT_S)
        except queue.Empty:
            raise CheckFailed("no message within the wait") from None

    def nothing_more(self, quiet_s=0.5):
        try:
            msg = self.messages.get(timeout=quiet_s)
        except queue.Empty:
            return
        raise CheckFailed(f"unexpected message {msg.topic} {msg.payload!r}")

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


def check(name, fn):
    global failures
    try:
        fn()
        print(f"PASS paho {name}", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the run
        failures += 1
        print(f"FAIL paho {name}: {type(e).__name__}: {e}", flush=True)


def qos_round_trip(tag, proto):
    def run():
        topic = f"interop/paho/{RUN}/{tag}/qos"
        sub = Conn(f"{tag}-qsub", proto)
        pub = Conn(f"{tag}-qpub", proto)
        try:
            sub.subscribe(topic, 2)
            for q in (0, 1, 2):
                pub.publish(topic, f"q{q}".encode(), q)
                msg = sub.next_message()
                expect(msg.topic == topic, f"topic {msg.topic}")
                expect(msg.payload == f"q{q}".encode(), f"payload {msg.payload!r}")
                expect(msg.qos == q, f"qos {msg.qos} != {q}")
                expect(not msg.retain, "retain flag on a live message")
        finally:
            sub.close()
            pub.close()

    return run


def retained(tag, proto):
    def run():
        topic = f"interop/paho/{RUN}/{tag}/retained"
        pub = Conn(f"{tag}-rpub", proto)
        try:
            pub.publish(topic, b"kept", 1, retain=True)
            s1 = Conn(f"{tag}-rsub1", proto)
            try:
                s1.subscribe(topic, 1)
                msg = s1.next_message()
                expect(msg.payload == b"kept" and msg.retain, f"retained: {msg.payload!r} retain={msg.retain}")
            finally:
                s1.close()
            pub.publish(topic, b"", 1, retain=True)  # clear
            s2 = Conn(f"{tag}-rsub2", proto)
            try:
                s2.subscribe(topic, 1)
                s2.nothing_more()
            finally:
                s2.close()
        finally:
            pub.close()

    return run


WILL_CHILD = """
import os, sys, threading, paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.packettypes import PacketTypes
host, port, proto, cid, topic = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
kw = {"client_id": cid, "protocol": proto}
if proto != mqtt.MQTTv5:
    kw["clean_session"] = True
c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, **kw)
props = None
if proto == mqtt.MQTTv5:
    props = Properties(PacketTypes.WILLMESSAGE)
    props.ContentType = "text/plain"
    props.UserProperty = [("why", "crash")]
c.will_set(topic, b"gone", qos=1, retain=False, properties=props)
ok = threading.Event()
c.on_connect = lambda *a: ok.set()
c.connect(host, port, keepalive=30)
c.loop_start()
if not ok.wait(10):
    sys.exit(3)
os._exit(0)  # no DISCONNECT: the kernel closes the socket
"""


def will_on_abnormal_close(tag, proto):
    def run():
        topic = f"interop/paho/{RUN}/{tag}/will"
        sub = Conn(f"{tag}-wsub", proto)
        try:
            sub.subscribe(topic, 1)
            child = subprocess.run(
                [sys.executable, "-c", WILL_CHILD, HOST, str(PORT), str(proto), f"paho-{tag}-will-{RUN}", topic],
                timeout=30,
            )
            expect(child.returncode == 0, f"will client exited {child.returncode}")
            msg = sub.next_message()
            expect(msg.topic == topic and msg.payload == b"gone", f"will {msg.topic} {msg.payload!r}")
            if proto == mqtt.MQTTv5:
                props = msg.properties
                expect(getattr(props, "ContentType", None) == "text/plain", f"will content type {props}")
                expect(getattr(props, "UserProperty", None) == [("why", "crash")], f"will user property {props}")
        finally:
            sub.close()

    return run


def no_will_on_disconnect(tag, proto):
    def run():
        topic = f"interop/paho/{RUN}/{tag}/nowill"
        sub = Conn(f"{tag}-nwsub", proto)
        try:
            sub.subscribe(topic, 1)
            c = Conn(f"{tag}-nw", proto, will={"topic": topic, "payload": b"bad", "qos": 1})
            c.close()  # DISCONNECT: the will is discarded
            sub.nothing_more(1.0)
        finally:
            sub.close()

    return run


def persistent_session(tag, proto):
    def run():
        topic = f"interop/paho/{RUN}/{tag}/session"
        sub = Conn(f"{tag}-psess", proto, persistent=True)
        try:
            sub.subscribe(topic, 2)
        finally:
            sub.close()
        pub = Conn(f"{tag}-psess-pub", proto)
        try:
            pub.publish(topic, b"while-away-1", 1)
            pub.publish(topic, b"while-away-2", 2)
        finally:
            pub.close()
        sub = Conn(f"{tag}-psess", proto, persistent=True)
        try:
            expect(sub.session_present, "session present 0 on reconnect")
            got = [sub.next_message(), sub.next_message()]
            expect([m.payload for m in got] == [b"while-away-1", b"while-away-2"], f"queued: {[m.payload for m in got]}")
            expect([m.qos for m in got] == [1, 2], f"qos {[m.qos for m in got]}")
        finally:
            sub.close()

    return run


def v5_properties_round_trip():
    topic = f"interop/paho/{RUN}/v5/props"
    sub = Conn("v5-psub", mqtt.MQTTv5)
    pub = Conn("v5-ppub", mqtt.MQTTv5)
    try:
        sp = Properties(PacketTypes.SUBSCRIBE)
        sp.SubscriptionIdentifier = 42
        sub.subscribe(topic, 1, properties=sp)
        pp = Properties(PacketTypes.PUBLISH)
        pp.ResponseTopic = "interop/reply"
        pp.CorrelationData = b"\x00corr\xff"
        pp.ContentType = "application/json"
        pp.UserProperty = [("b", "1"), ("a", "2"), ("b", "3")]
        pp.MessageExpiryInterval = 60
        pp.PayloadFormatIndicator = 1
        pub.publish(topic, b"{}", 1, properties=pp)
        msg = sub.next_message()
        got = msg.properties
        expect(getattr(got, "ResponseTopic", None) == "interop/reply", f"response topic {got}")
        expect(getattr(got, "CorrelationData", None) == b"\x00corr\xff", f"correlation data {got}")
        expect(getattr(got, "ContentType", None) == "application/json", f"content type {got}")
        expect(getattr(got, "UserProperty", None) == [("b", "1"), ("a", "2"), ("b", "3")], f"user properties {got}")
        expiry = getattr(got, "MessageExpiryInterval", None)
        expect(expiry is not None and 0 < expiry <= 60, f"message expiry {expiry}")
        expect(getattr(got, "PayloadFormatIndicator", None) == 1, f"payload format {got}")
        expect(getattr(got, "SubscriptionIdentifier", None) == [42], f"subscription identifier {got}")
    finally:
        sub.close()
        pub.close()


def main():
    for tag, proto in PROTOCOLS:
        check(f"{tag} qos 0/1/2 pub/sub", qos_round_trip(tag, proto))
        check(f"{tag} retained set/clear", retained(tag, proto))
        check(f"{tag} will on abnormal close", will_on_abnormal_close(tag, proto))
        check(f"{tag} no will after DISCONNECT", no_will_on_disconnect(tag, proto))
        check(f"{tag} persistent session gets messages sent while away", persistent_session(tag, proto))
    check("v5 properties round trip", v5_properties_round_trip)
    sys.exit(failures)


if __name__ == "__main__":
    main()
