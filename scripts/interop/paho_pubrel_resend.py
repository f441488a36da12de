"""Shows that paho-mqtt (Python) resends a QoS 2 PUBLISH, with DUP=0, for a message whose PUBREL
it already sent, when a reconnect attempt fails before the next one succeeds (MQTT-4.3.3-2:
the sender MUST NOT re-send the PUBLISH once it has sent the corresponding PUBREL).

A fake broker on 127.0.0.1 takes one QoS 2 PUBLISH, answers PUBREC, reads the PUBREL and drops
the connection before PUBCOMP; it then refuses one connection attempt and accepts the next,
with session present. It prints the first packet the client sends after CONNACK and exits 0
if it is the PUBREL (a compliant client), 1 if it is a PUBLISH.
"""
import os, socket, sys, time
import paho.mqtt
import paho.mqtt.client as mqtt

def read_packet(conn):
    head = conn.recv(1)
    if not head:
        return None, b""
    mult, length = 1, 0
    while True:
        b = conn.recv(1)[0]
        length += (b & 127) * mult
        mult *= 128
        if b < 128:
            break
    body = b""
    while len(body) < length:
        body += conn.recv(length - len(body))
    return head[0], body

def main():
    lsock = socket.socket(); lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0)); lsock.listen(1)
    port = lsock.getsockname()[1]
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="pubrel-check", clean_session=False)
    client.reconnect_delay_set(0.2, 0.2)
    client.connect("127.0.0.1", port)
    client.loop_start()
    conn, _ = lsock.accept()
    read_packet(conn)                       # CONNECT
    conn.sendall(bytes([0x20, 2, 0, 0]))    # CONNACK, no session yet
    client.publish("t", b"once", qos=2)
    kind, body = read_packet(conn)          # PUBLISH qos 2
    tlen = (body[0] << 8) | body[1]
    mid = body[2 + tlen: 4 + tlen]
    conn.sendall(bytes([0x50, 2]) + mid)    # PUBREC
    kind, body = read_packet(conn)          # PUBREL
    assert kind >> 4 == 6, kind
    conn.close(); lsock.close()             # gone before PUBCOMP; the next attempt is refused
    time.sleep(1.0)
    lsock = socket.socket(); lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", port)); lsock.listen(1); lsock.settimeout(10)
    conn, _ = lsock.accept()
    conn.settimeout(5)
    k,b=read_packet(conn)                       # CONNECT
    conn.sendall(bytes([0x20, 2, 1, 0]))    # CONNACK, session present
    time.sleep(2)
    conn.setblocking(False)
    try:
        data = conn.recv(65536)
    except BlockingIOError:
        data = b""
    kind = data[0] if data else 0
    name = {3: "PUBLISH", 6: "PUBREL"}.get(kind >> 4, "nothing")
    dup = bool(kind & 8) if kind >> 4 == 3 else None
    print(f"paho {paho.mqtt.__version__}: first packet after the reconnect: {name} (dup={dup}) {data!r}")
    sys.stdout.flush()
    os._exit(0 if kind >> 4 == 6 else 1)

main()
