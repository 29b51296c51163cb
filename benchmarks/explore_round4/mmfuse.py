import torch, time, statistics
torch.set_num_threads(2)
F = torch.nn.functional
def bench(fn, n=300):
    for _ in range(20): fn()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return 1e6*statistics.median(ts)
for M in (384, 320, 1536):
    x = torch.randn(M, 128); Wq, Wk, Wv = (torch.randn(128,128) for _ in range(3)); bq,bk,bv=(torch.randn(128) for _ in range(3))
    Wg, Wu = torch.randn(256,128), torch.randn(256,128)
    Wqkv = torch.cat([Wq,Wk,Wv]); bqkv = torch.cat([bq,bk,bv]); Wgu = torch.cat([Wg,Wu])
    print(M, "qkv sep", round(bench(lambda: (F.linear(x,Wq,bq),F.linear(x,Wk,bk),F.linear(x,Wv,bv)))),
          "fused", round(bench(lambda: F.linear(x,Wqkv,bqkv))),
          "cat+fused", round(bench(lambda: F.linear(x,torch.cat([Wq,Wk,Wv]),torch.cat([bq,bk,bv])))),
          "| gu sep", round(bench(lambda: (F.linear(x,Wg),F.linear(x,Wu)))), "fused", round(bench(lambda: F.linear(x,Wgu))))
