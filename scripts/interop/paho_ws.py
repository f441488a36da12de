"""paho-mqtt over WebSocket (used by crates/server/tests/websocket.rs).

Usage: paho_ws.py PORT VERSION(3|5) [CAFILE]
Connects to ws://127.0.0.1:PORT/mqtt (wss:// with CAFILE), subscribes to ws/<version>,
publishes a small and a large (200 KiB, several WebSocket frames' worth) QoS 1 message to it
once the SUBACK is in, and prints what came back as `got <topic> <length> <first byte>` lines.
Exits 0 after both messages came back, 1 on a timeout or a refused connection.
"""
import sys
import threading

import paho.mqtt.client as mqtt

port = int(sys.argv[1])
version = mqtt.MQTTv5 if sys.argv[2] == "5" else mqtt.MQTTv311
cafile = sys.argv[3] if len(sys.argv) > 3 else None
topic = "ws/" + sys.argv[2]
payloads = [b"hello over websocket", bytes([7]) * (200 * 1024)]
received = []
done = threading.Event()


def on_connect(client, userdata, flags, reason_code, properties=None):
    if reason_code != 0:
        print("refused", reason_code, flush=True)
        done.set()
        return
    client.subscribe(topic, qos=1)


def on_subscribe(client, userdata, mid, reason_codes, properties=None):
    for payload in payloads:
        client.publish(topic, payload, qos=1)


def on_message(client, userdata, message):
    received.append(message.payload)
    print("got", message.topic, len(message.payload), message.payload[0], flush=True)
    if len(received) == len(payloads):
        done.set()


client = mqtt.Client(
    mqtt.CallbackAPIVersion.VERSION2,
    client_id="paho-ws-" + sys.argv[2],
    transport="websockets",
    protocol=version,
)
client.ws_set_options(path="/mqtt")
if cafile:
    client.tls_set(ca_certs=cafile)
client.on_connect = on_connect
client.on_subscribe = on_subscribe
client.on_message = on_message
client.connect("127.0.0.1", port, keepalive=30)
client.loop_start()
ok = done.wait(20) and received == payloads
client.disconnect()
client.loop_stop()
sys.exit(0 if ok else 1)
