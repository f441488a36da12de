#!/usr/bin/env python3
"""Classify ordering misses in a traced broker log (read-order-trace patch, old unrotated test).
For each missed round r (A's PUBLISH on order/r handled before B's SUBSCRIBE of order/r):
  tA = time of the wake that issued the ticket of A's read carrying the PUBLISH (or the read
       itself if the ticket was fresh), tB likewise for B's SUBSCRIBE.
  explained if a broker write to B's socket was open (begin seen, end not yet) at tA, i.e.
  B's segment could sit in the socket backlog while A's was reported."""
import re, sys, collections
path = sys.argv[1]
ev = []
peer_client = {}
slot_client = {}
fd_port = {}
conn_re = re.compile(r'peer=127\.0\.0\.1:(\d+) client_id=(\S+)')
odbg = re.compile(r'ODBG (\d+) ThreadId\((\d+)\) (.*)')
ansi = re.compile(r'\x1b\[[0-9;]*m')
for line in open(path, errors='replace'):
    line = ansi.sub('', line)
    m = conn_re.search(line)
    if m and 'client connected' in line:
        peer_client[m.group(1)] = m.group(2)
        continue
    m = odbg.search(line)
    if not m:
        continue
    t, th, msg = int(m.group(1)), int(m.group(2)), m.group(3)
    kv = dict(re.findall(r'(\w+)=(\S+)', msg))
    kind = msg.split()[0]
    if kind == 'turn':
        kind = 'turnwait'
    ev.append((t, th, kind, kv, msg))
    if kind == 'split':
        fd_port[kv['fd']] = kv['peer']
    if kind == 'write':
        kv['peer'] = fd_port.get(kv['peer'], 'fd' + kv['peer'])
    if kind.startswith('slot='):
        slot_client[kv['slot']] = kv['client']
client_peer = {c: p for p, c in peer_client.items()}
def who_slot(kv):
    return slot_client.get(kv.get('slot'))
# index: per slot, list of (idx, event)
subs, pubs = {}, {}
for i, (t, th, kind, kv, msg) in enumerate(ev):
    if kind == 'subscribed' and kv['client'] == 'order-b':
        subs[kv['filter']] = i
    if kind == 'publish' and kv['client'] == 'order-a' and '/' in kv['topic']:
        pubs.setdefault(kv['topic'], i)
def origin(i, client):
    """The read_done before event i on client's slot, and the wake that issued its ticket."""
    j = i
    while j >= 0:
        t, th, kind, kv, msg = ev[j]
        if kind == 'read_done' and slot_client.get(kv['slot']) == client:
            ticket = kv['ticket']
            k = j
            while k >= 0:
                t2, _, kind2, kv2, _ = ev[k]
                if kind2 == 'wake' and slot_client.get(kv2['slot']) == client and kv2.get('pending') == ticket and kv2.get('before') == '0':
                    return ('wake', t2, k, int(ticket))
                if kind2 == 'slot=' + kv['slot']:
                    break
                k -= 1
            return ('fresh', t, j, int(ticket))
        j -= 1
    return None
def open_writes(idx, port):
    """Write to port open at event idx: last begin for port before idx without an end after it."""
    j = idx
    while j >= 0:
        t, th, kind, kv, msg = ev[j]
        if kind == 'write' and kv.get('peer') == port:
            if msg.startswith('write begin'):
                return (t, th)
            return None
        j -= 1
    return None
missed = [topic for topic in pubs if topic in subs and pubs[topic] < subs[topic]]
missed.sort(key=lambda s: int(s.split('/')[1]))
print(f"rounds with both: {sum(1 for t in pubs if t in subs)}, missed: {len(missed)}")
bport, aport = client_peer.get('order-b'), client_peer.get('order-a')
expl = 0
for topic in missed:
    oa = origin(pubs[topic], 'order-a')
    ob = origin(subs[topic], 'order-b')
    wb = open_writes(oa[2], bport) if oa else None
    wa = open_writes(ob[2], aport) if ob else None
    # the write to B that was open at A's wake, how long it lasted
    dur = None
    if wb:
        for t, th, kind, kv, msg in ev[oa[2]:]:
            if kind == 'write' and kv.get('peer') == bport and msg.startswith('write end'):
                dur = t - wb[0]; break
    ok = wb is not None
    expl += ok
    print(f"{topic}: A {oa[0]} ticket {oa[3]} t={oa[1]}; B {ob[0]} ticket {ob[3]} t={ob[1]} (B-A {ob[1]-oa[1]} us); "
          f"write to B open at A's wake: {'yes' if wb else 'no'}{f' (began {oa[1]-wb[0]} us before, lasted {dur} us)' if wb else ''}; "
          f"write to A open at B's wake: {'yes' if wa else 'no'}")
print(f"explained by an open write to B: {expl} of {len(missed)}")
