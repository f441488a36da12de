"""What paho-mqtt 2.x logs for the packets our test clients track (its on_log lines): the
only window on PUBRECs received and PUBLISH/PUBREL sent that paho gives. Shared by
crash_paho.py (the single node's crash test) and cluster_clients.py (cluster-check.sh)."""

import re

PUBREC_LOG = re.compile(r"Received PUBREC \(Mid: (\d+)\)")
PUBREL_SENT_LOG = re.compile(r"Sending PUBREL \(Mid: (\d+)\)")
PUBLISH_SENT_LOG = re.compile(r"Sending PUBLISH \(d(\d), q\d, r\d, m(\d+)\)")
CONNECT_SENT_LOG = re.compile(r"Sending CONNECT ")
