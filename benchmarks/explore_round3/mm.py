import torch, time, statistics
F = torch.nn.functional
def rate(m, k, n, threads):
    torch.set_num_threads(threads)
    x = torch.randn(m, k); w = torch.randn(n, k)
    for _ in range(20): F.linear(x, w)
    ts = []
    for _ in range(200):
        t = time.perf_counter(); F.linear(x, w); ts.append(time.perf_counter() - t)
    return 2 * m * k * n / statistics.median(ts) / 1e9
for m in (384, 1536, 2432):
    for k, n in ((128, 128), (128, 256), (256, 128), (128, 384)):
        print(m, k, n, "1t %.0f  2t %.0f GFLOP/s" % (rate(m, k, n, 1), rate(m, k, n, 2)))
