#!/usr/bin/env python3
# bench/route-traffic.py: what the servers of a cluster sent one another, per kind, from a
# capture of their route ports (tcpdump's pcap format). The routes' message counters say how
# many messages crossed; this says which: each Raft group's appends (named after its stream or
# consumer when a server is given), their responses, publishes per stream subject, deliveries,
# replies, and the interest changes (RS+/RS-) that the counters leave out.
#
#   tcpdump -i lo -s0 -w routes.pcap 'tcp portrange 16222-16224' &   # during the load
#   bench/route-traffic.py routes.pcap [--per N] [--nats HOST:PORT]
#
# --per N divides every count by N (the intents answered); --nats asks that server for every
# stream's and consumer's Raft group (JetStream API, plain NATS protocol) to name the groups.
# bench/cluster-cost.sh does all of it with ROUTES=1. The route protocol is text: a message is
# "RMSG|HMSG|LMSG <account> <subject> [reply] [queues] [hdr size] <size>" and its payload; the
# flows are put back together from TCP sequence numbers, so a capture that dropped packets
# (tcpdump says so when it stops) undercounts.
import argparse
import collections
import json
import socket
import struct


def flows(path):
    """Every TCP flow's payload, in sequence order: {(src port, dst port, src, dst): bytes}."""
    segs = collections.defaultdict(dict)
    with open(path, 'rb') as f:
        head = f.read(24)
        magic = struct.unpack('<I', head[:4])[0]
        order = '<' if magic in (0xa1b2c3d4, 0xa1b23c4d) else '>'
        link = struct.unpack(order + 'I', head[20:24])[0]
        skip = {1: 14, 113: 16, 0: 4, 12: 0, 101: 0}.get(link)
        if skip is None:
            raise SystemExit(f'route-traffic.py: link type {link} not handled')
        while True:
            rec = f.read(16)
            if len(rec) < 16:
                break
            incl = struct.unpack(order + 'IIII', rec)[2]
            ip = f.read(incl)[skip:]
            if not ip or ip[0] >> 4 != 4:
                continue
            ihl, total = (ip[0] & 15) * 4, struct.unpack('>H', ip[2:4])[0]
            tcp = ip[ihl:total]
            sport, dport, seq = struct.unpack('>HHI', tcp[:8])
            payload = tcp[(tcp[12] >> 4) * 4:]
            if payload:
                segs[(sport, dport, ip[12:16], ip[16:20])][seq] = payload
    out = {}
    for key, by_seq in segs.items():
        seqs = sorted(by_seq)
        # A flow whose sequence numbers wrapped: start after the largest gap.
        gaps = [(b - a, i) for i, (a, b) in enumerate(zip(seqs, seqs[1:]))]
        if gaps and max(gaps)[0] > 1 << 31:
            cut = max(gaps)[1] + 1
            seqs = seqs[cut:] + seqs[:cut]
        out[key] = b''.join(by_seq[s] for s in seqs)
    return out


def group_names(hostport):
    """{Raft group: "stream S" or "consumer S/C"} from a server's JetStream API."""
    host, port = hostport.rsplit(':', 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    r = s.makefile('rb')
    r.readline()  # INFO
    s.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"protocol":1}\r\nSUB _INBOX.rt 1\r\n')

    def ask(subject):
        s.sendall(f'PUB {subject} _INBOX.rt 2\r\n{{}}\r\n'.encode())
        while True:
            line = r.readline().decode().split()
            if line and line[0] in ('MSG', 'HMSG'):
                body = r.read(int(line[-1]) + 2)
                if line[0] == 'HMSG':
                    body = body[int(line[-2]):]
                return json.loads(body)
            if line and line[0] == 'PING':
                s.sendall(b'PONG\r\n')

    names = {'_meta_': 'the meta group'}
    for st in ask('$JS.API.STREAM.LIST').get('streams') or []:
        name = st['config']['name']
        if st.get('cluster', {}).get('raft_group'):
            names[st['cluster']['raft_group']] = 'stream ' + name
        for c in ask('$JS.API.CONSUMER.LIST.' + name).get('consumers') or []:
            if c.get('cluster', {}).get('raft_group'):
                names[c['cluster']['raft_group']] = f'consumer {name}/{c["name"]}'
    s.close()
    return names


def kind(subject, reply, names):
    """The class a routed message is counted in."""
    p = subject.split('.')
    if subject.startswith('$NRG.AE.'):
        return 'Raft append: ' + names.get(p[2], p[2])
    if subject.startswith('$NRG.'):
        return 'Raft ' + {'R': 'append response', 'V': 'vote', 'P': 'proposal', 'RP': 'peer removal'}.get(p[1], p[1])
    if subject.startswith('$JS.API.'):
        return 'API ' + '.'.join(p[2:4])
    if subject.startswith('$JS.ACK.'):
        return 'ack ' + p[2]
    if subject.startswith('$JS.EVENT.'):
        return 'event ' + '.'.join(p[2:4])
    if subject.startswith('_INBOX.') or subject.startswith('_R_.'):
        return 'delivery to an inbox (a consumer\'s)' if reply.startswith('$JS.ACK.') else 'reply to an inbox (publish acks, API answers)'
    if subject.startswith('$KV.'):
        return 'publish $KV.' + p[1]
    if subject.startswith('$SYS.') or subject.startswith('$JSC.'):
        return '.'.join(p[:2])
    # A subject's first token, and its second when that is a word (og.end, jobs.run), not an id.
    word = len(p) > 2 and p[1].isalpha() and p[1].islower() and len(p[1]) < 16
    return 'message ' + p[0] + ('.' + p[1] if word else '')


def count(streams, names):
    counts = collections.Counter()
    for buf in streams.values():
        i, n = 0, len(buf)
        while i < n:
            j = buf.find(b'\r\n', i)
            if j < 0:
                break
            t = buf[i:j].decode('latin1').split()
            i = j + 2
            if not t:
                continue
            op = t[0]
            if op in ('RMSG', 'HMSG', 'LMSG'):
                sizes = 2 if op == 'HMSG' else 1
                args = t[1:len(t) - sizes]
                # A route pinned to an account leaves the account out; $NRG and inboxes never
                # name one in their first token.
                if len(args) > 1 and '.' not in args[0]:
                    args = args[1:]
                subject = args[0]
                reply = args[2] if len(args) > 2 and args[1] in ('+', '|') else (args[1] if len(args) > 1 and args[1] not in ('+', '|') else '')
                counts[kind(subject, reply, names)] += 1
                i += int(t[-1]) + 2
            elif op in ('RS+', 'RS-', 'LS+', 'LS-'):
                counts['interest change ' + op] += 1
            elif op in ('PING', 'PONG'):
                counts['PING/PONG'] += 1
            else:
                counts['other ' + op[:8]] += 1
    return counts


def main():
    ap = argparse.ArgumentParser(description='route messages per kind, from a pcap of the route ports')
    ap.add_argument('pcap')
    ap.add_argument('--per', type=float, default=1, help='divide the counts by this (intents)')
    ap.add_argument('--nats', help='HOST:PORT of a server, to name the Raft groups')
    a = ap.parse_args()
    names = group_names(a.nats) if a.nats else {}
    counts = count(flows(a.pcap), names)
    msgs = sum(v for k, v in counts.items() if not k.startswith(('interest', 'PING', 'other')))
    raft = sum(v for k, v in counts.items() if k.startswith('Raft'))
    print(f'{"kind":60s} {"count":>9s} {"per intent":>10s}')
    for k, v in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f'{k:60s} {v:9d} {v / a.per:10.2f}')
    print(f'{"messages (interest changes and PING/PONG not included)":60s} {msgs:9d} {msgs / a.per:10.2f}')
    print(f'{"of which Raft":60s} {raft:9d} {raft / a.per:10.2f}')


if __name__ == '__main__':
    main()
