# Trace analyses behind docs/policy.md "Second round" (python3; about a minute).
# ana: reuse of new blocks by the request's hit length; ana2: continuations, children per block;
# ana3: continuation chance by length, output length, turn; ana4: hit pools by prior uses;
# ana5: hazard of the next use by prior uses and age; ana6: previous vs next reuse gap.
TRACE = "/work/shared/traces/conversation_trace.jsonl"

# ---- ana ----
def ana():
    import json
    reqs=[json.loads(l)['hash_ids'] for l in open(TRACE)]
    seen={}  # id -> list of request idx
    for i,r in enumerate(reqs):
        for b in r: seen.setdefault(b,[]).append(i)
    from collections import defaultdict
    # for each request, unbounded hit len; for new blocks, classify
    stats=defaultdict(lambda:[0,0,0])  # cat -> [n, reused, reused within 300]
    known=set()
    turn={}  # chain turn count estimate: first block after root? 
    for i,r in enumerate(reqs):
        h=0
        for b in r:
            if b in known: h+=1
            else: break
        cat = 'h0' if h==0 else ('h1' if h==1 else ('h2-9' if h<10 else 'h10+'))
        for d,b in enumerate(r):
            if b not in known:
                uses=seen[b]
                nxt=[u for u in uses if u>i]
                s=stats[cat]; s[0]+=1
                if nxt: s[1]+=1
                if nxt and nxt[0]-i<=300: s[2]+=1
        for b in r: known.add(b)
    for k,v in sorted(stats.items()): print(k, v, v[1]/v[0], v[2]/v[0])

# ---- ana2 ----
def ana2():
    import json
    from collections import Counter,defaultdict
    reqs=[json.loads(l)['hash_ids'] for l in open(TRACE)]
    # map block -> first request index containing it
    first={}
    for i,r in enumerate(reqs):
        for b in r: first.setdefault(b,i)
    # for each request with h>=2, the source request (first of its last hit block) and whether it covers all of source
    full=Counter(); lens=Counter(); gaps=[]
    children=defaultdict(set)
    for i,r in enumerate(reqs):
        h=0
        for b in r:
            if first[b]<i: h+=1
            else: break
        if h>=2:
            src=first[r[h-1]]
            s=reqs[src]
            # is hit prefix the whole of src except last (partial) block?
            full[(h>=len(s)-1, h==len(s))]+=1
            gaps.append(i-src)
        # children
        for a,b in zip(r,r[1:]): children[a].add(b)
    print(full)
    gaps.sort(); print(len(gaps), gaps[len(gaps)//10], gaps[len(gaps)//2], gaps[9*len(gaps)//10])
    print(Counter(min(len(c),10) for c in children.values()))
    print(len(children[0]))

# ---- ana3 ----
def ana3():
    import json
    from collections import Counter,defaultdict
    rows=[json.loads(l) for l in open(TRACE)]
    reqs=[r['hash_ids'] for r in rows]
    first={}
    for i,r in enumerate(reqs):
        for b in r: first.setdefault(b,i)
    cont=defaultdict(lambda:[0,0]); nextgap={}
    for i,r in enumerate(reqs):
        h=0
        for b in r:
            if first[b]<i: h+=1
            else: break
        if h>=2: nextgap.setdefault(first[r[h-1]], i)
    def bucket(n):
        for t in (2,4,8,16,32,64,128): 
            if n<=t: return t
        return 999
    for key in ('len','out','turn'):
      cont=defaultdict(lambda:[0,0,0])
      for i,r in enumerate(reqs):
        h=0
        for b in r:
            if first[b]<i: h+=1
            else: break
        k={'len':bucket(len(r)),'out':bucket(rows[i]['output_length']//16),'turn':'t1' if h<=1 else 'tk'}[key]
        c=cont[k]; c[0]+=1; c[2]+=len(r)
        if i in nextgap: c[1]+=1
      print(key)
      for k,v in sorted(cont.items(), key=lambda x:str(x[0])): print(' ',k, v, round(v[1]/v[0],3))

# ---- ana4 ----
def ana4():
    import json
    from collections import Counter
    reqs=[json.loads(l)['hash_ids'] for l in open(TRACE)]
    cnt=Counter(); pool=Counter()
    for r in reqs:
        hit=True
        for b in r:
            if cnt[b]==0: hit=False
            if hit: pool[min(cnt[b],6)]+=1
        for b in r: cnt[b]+=1
    print(sorted(pool.items()), sum(pool.values()))

# ---- ana5 ----
def ana5():
    import json
    from collections import defaultdict
    reqs=[json.loads(l)['hash_ids'] for l in open(TRACE)]
    uses=defaultdict(list)
    for i,r in enumerate(reqs):
        for b in set(r): uses[b].append(i)
    N=len(reqs)
    gaps=defaultdict(list) # k -> list of gaps (None = never), only accesses with at least 2500 requests remaining
    for b,u in uses.items():
        for j,i in enumerate(u):
            if i> N-2500: continue
            k=min(j+1,6)
            g=u[j+1]-i if j+1<len(u) else None
            gaps[k].append(g)
    bins=[0,100,200,300,500,700,1000,1500,2000]
    print("k n P(ever<2500) hazard per 100 req in bins",bins)
    for k in sorted(gaps):
        g=gaps[k]; n=len(g)
        row=[]
        for a,b2 in zip(bins,bins[1:]):
            alive=sum(1 for x in g if x is None or x>=a)
            ev=sum(1 for x in g if x is not None and a<=x<b2)
            row.append(round(100*ev/alive/(b2-a),3) if alive else 0)
        print(k,n,round(sum(1 for x in g if x is not None and x<2500)/n,3),row)

# ---- ana6 ----
def ana6():
    import json, math
    from collections import defaultdict
    reqs=[json.loads(l)['hash_ids'] for l in open(TRACE)]
    uses=defaultdict(list)
    for i,r in enumerate(reqs):
        for b in set(r): uses[b].append(i)
    N=len(reqs)
    for k in (2,3):
      rows=defaultdict(lambda:[0,0,[]])
      xs=[];ys=[]
      for b,u in uses.items():
        if len(u)<k or u[k-1]>N-2500: continue
        g1=u[k-1]-u[k-2]
        g2=u[k]-u[k-1] if len(u)>k else None
        bk=min(int(math.log2(g1+1)),12)
        r=rows[bk]; r[0]+=1
        if g2 is not None and g2<2500: r[1]+=1; r[2].append(g2)
        if g2 is not None and g1>0 and g2>0: xs.append(math.log(g1)); ys.append(math.log(g2))
      import statistics
      print("k",k,"corr log gaps",round(statistics.correlation(xs,ys),3))
      for bk in sorted(rows):
        n,c,l=rows[bk]; l.sort()
        print(" prev gap ~2^%d: n=%d P(reuse<2500)=%.3f median next gap %s"%(bk,n,c/n,l[len(l)//2] if l else None))

if __name__ == "__main__":
    print('== ana'); ana()
    print('== ana2'); ana2()
    print('== ana3'); ana3()
    print('== ana4'); ana4()
    print('== ana5'); ana5()
    print('== ana6'); ana6()
