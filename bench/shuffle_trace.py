"""Make a longer trace from a recorded one (bench/shuffle_trace.py SRC DST NSTEPS SEED):
keep the prologue (model, optimizer state), then the steady-state steps in a random
order, or in the order ORDER="i,j,..." gives (indices into the steps after the first two).
Blocks a step leaves live for the next are matched, by size, to the next step's frees of
blocks it did not allocate. Steps are cut as gmlake-replay --steps cuts them."""
import gzip, sys, random
src, dst, nsteps, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
hdr=[]; ev=[]
for ln in gzip.open(src,'rt'):
    if ln[0]=='#': hdr.append(ln); continue
    ev.append(ln.split())
live=0; sizes={}; L=[]
for p in ev:
    if p[0]=='a': sizes[p[1]]=int(p[2]); live+=int(p[2])
    else: live-=sizes.get(p[1],0)
    L.append(live)
n=len(L); floor=min(L[n//5:n*9//10]); peak=max(L)
lo=floor+(peak-floor)//50; hi=floor+(peak-floor)//10
steps=[]; above=False; start=0
for i,v in enumerate(L):
    if v>hi: above=True
    if above and v<=lo: steps.append((start,i+1)); start=i+1; above=False
good=steps[2:]
print("steps",len(steps),"used",len(good), file=sys.stderr)
rng=random.Random(seed)
out=gzip.open(dst,'wt')
for h in hdr: out.write(h)
nid=0; remap={}; carry=[]
def run(seg, inside_only=False):
    global nid, carry
    allocated=set(p[1] for p in seg if p[0]=='a')
    for p in seg:
        if p[0]=='a':
            nid+=1; remap[p[1]]=nid; out.write("a %d %s %s\n"%(nid,p[2],p[3]))
        elif p[1] in allocated or inside_only:
            if p[1] in remap: out.write("f %d\n"%remap.pop(p[1]))
        elif carry:
            want=sizes.get(p[1],0)
            j=min(range(len(carry)), key=lambda i: abs(carry[i][1]-want))
            out.write("f %d\n"%carry.pop(j)[0])
    left=[p[1] for p in seg if p[0]=='a' and p[1] in remap]
    carry += [(remap.pop(k), sizes[k]) for k in left]
run(ev[:good[0][0]], True)
import os
order=os.environ.get("ORDER")
if order:
    seq=[int(x) for x in order.split(",")]
else:
    seq=[rng.randrange(len(good)) for k in range(nsteps)]
for k in seq:
    s,e=good[k]
    run(ev[s:e])
out.close()
