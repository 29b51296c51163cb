import torch, time, statistics
torch.set_num_threads(2)
def bench(fn, n=300):
    for _ in range(20): fn()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return 1e6*statistics.median(ts)
R=1536
for (i,o) in [(128,128),(128,256),(256,128),(128,384)]:
    x=torch.randn(R,i); W=torch.randn(o,i); b=torch.randn(o); Wt=W.t().contiguous()
    fl=2*R*i*o
    r={}
    r['mm x@W.t']=bench(lambda: torch.mm(x,W.t()))
    r['mm x@Wt']=bench(lambda: torch.mm(x,Wt))
    r['addmm W.t']=bench(lambda: torch.addmm(b,x,W.t()))
    r['addmm Wt']=bench(lambda: torch.addmm(b,x,Wt))
    print(i,o,{k:f"{v:.0f}us {fl/v/1e3:.0f}GF" for k,v in r.items()})
