#!/usr/bin/env python3
# bench/profile-shares.py: a CPU profile's samples grouped by the goroutine they ran on (the
# route connections' write and read loops, Raft, the HTTP server, the workers, the Go
# scheduler, GC, ...), which `go tool pprof -top` cannot say: a syscall's samples land under
# whichever loop made it. Feed it the traces of one or more profiles:
#
#   go tool pprof -traces BINARY n1.pprof n2.pprof n3.pprof > traces.txt
#   bench/profile-shares.py traces.txt
#
# (profiles from bench/cluster-cost.sh or bench/partition-cost.sh with PROFILE set). A sample
# goes to the first group whose pattern appears anywhere in its stack, in the order listed.
import collections
import re
import sys
blocks=open(sys.argv[1]).read().split('-----------+-------------------------------------------------------')
agg=collections.Counter(); total=0
def val(s):
    s=s.strip()
    if s.endswith('ms'): return float(s[:-2])/1000
    if s.endswith('us'): return float(s[:-2])/1e6
    if s.endswith('s'): return float(s[:-1])
rules=[('createRoute.func2','route writeLoop'),('createRoute.func1','route readLoop'),('(*raft).run','raft.run'),
('monitorStream','monitorStream'),('monitorConsumer','monitorConsumer'),('sendq','sendq'),('fasthttp','HTTP'),
('oncegate/workers','workers'),('gcBgMarkWorker','GC'),('bgsweep','GC'),('bgscavenge','GC'),('(*client).readLoop','server client readLoop'),('(*client).writeLoop','server client writeLoop'),
('processJSAPIRoutedRequests','JS API'),('internalSendLoop','server internal send'),('mcall','runtime sched'),('oncegate/ledger','ledger'),('oncegate/jobs','jobs'),('nats%2ego','nats.go'),('mockllm','mockllm'),('fileStore','filestore bg')]
for b in blocks:
    lines=[l for l in b.split('\n') if l.strip()]
    if not lines: continue
    m=re.match(r'\s+(\S+)\s+(\S+)',lines[0])
    if not m: continue
    v=val(m.group(1))
    if v is None: continue
    frames=[lines[0].split()[-1]]+[l.strip() for l in lines[1:]]
    total+=v
    key='other: '+frames[-2][:60] if len(frames)>1 else frames[0]
    for pat,name in rules:
        if any(pat in f for f in frames): key=name;break
    agg[key]+=v
for k,v in agg.most_common(14): print(f'{v:7.2f} {100*v/total:5.1f}% {k}')
print(total)
