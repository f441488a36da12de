#!/usr/bin/env python3
"""Connects once with paho-mqtt 2.x (username/password) and prints the CONNACK reason as
paho reports it: its number (3.1.1 return codes are mapped to v5 reason codes) and name.

Usage: paho_connect.py PORT USER PASSWORD 3|5   (used by crates/server/tests/auth.rs)"""
import sys
import paho.mqtt.client as mqtt
port, user, password, version = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
protocol = mqtt.MQTTv5 if version == "5" else mqtt.MQTTv311
c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-auth-" + version, protocol=protocol)
c.username_pw_set(user, password)
result = []
def on_connect(client, userdata, flags, reason_code, properties):
    result.append(reason_code)
    client.disconnect()
c.on_connect = on_connect
c.connect("127.0.0.1", port, keepalive=10)
c.loop_forever()
print(int(result[0].value) if result else "none", str(result[0]) if result else "")
