"""The live monitor's speed (`model.stream`, modeling_par/streaming.py): events per second and per-event latency
(median, p95) of a local-view PAR model streaming one event at a time, against an LSTM cell stepping one event at a
time, and against re-reading the whole prompt with `predict` once the history is long. One CPU thread, eager, no grad.

    python benchmarks/bench_streaming.py                       # hidden 64, 1 + 1 + 1 layers, 1,000 events
    python benchmarks/bench_streaming.py --hidden_size 128 --layers 1,2,1 --intermediate_size 256

The PAR model is the records recipe's small one (`par_cli.recipe.model_size_rule`: hidden 64, MLP 128, 1 + 1 +
1 layers, answer feedback; local view, progress positions, bidirectional queries), with random weights: speed does
not depend on them. An event is one token (the recipe reads one token per operation); the prompt is <bos>, the events,
then `--queries` query tokens, each read. The LSTM (hidden `--lstm_hidden`) does per event what a recurrent monitor
does: the event's embedding, one `nn.LSTMCell` step and a linear readout of every query's candidates. The re-read is
`predict` on the whole prompt of `--events` events at forced depth d, what a monitor without a kept state pays per
event at that history (it grows with d: O(d) iterations, each O(1) on the local window). The stream's answer after the
last event is checked against that `predict` (printed). No figure here is asserted anywhere; the docs quote a run
(docs/streaming.md).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modeling_par import ParLoopedQwenConfig, ParLoopedQwenForStateTracking  # noqa: E402


def machine() -> str:
    """platform.processor(), or the CPU's model name where that is empty (Linux), with the OS and torch version."""
    name = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("model name")), "")
        name = f"{name} ({model})" if name and model and model != name else (model or name)
    return f"{name or 'unknown CPU'}, {platform.platform()}, torch {torch.__version__}"


def percentiles(seconds: list[float]) -> tuple[float, float]:
    """Median and 95th percentile of per-event latencies, in milliseconds."""
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return 1e3 * statistics.median(ordered), 1e3 * p95


def par_model(args, vocab: int, candidates: list[int]) -> ParLoopedQwenForStateTracking:
    prelude, core, coda = (int(n) for n in args.layers.split(","))
    config = ParLoopedQwenConfig(
        vocab_size=vocab, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
        num_attention_heads=args.heads, num_key_value_heads=args.heads, prelude_layers=prelude, core_layers=core,
        coda_layers=coda, answer_token_ids=candidates, loop_view="local", progress_positions=True,
        bidirectional_queries=True, answer_feedback=args.answer_feedback, max_iterations=max(args.events, 1024),
        max_position_embeddings=4 * (args.events + 16), attn_implementation=args.attn, pad_token_id=0)
    torch.manual_seed(args.seed)
    return ParLoopedQwenForStateTracking(config).eval()


class LstmMonitor(nn.Module):
    """A recurrent monitor stepping one event at a time: embedding lookup, one LSTM cell step, a linear readout of
    every query's candidates."""

    def __init__(self, vocab: int, hidden: int, queries: int, candidates: int):
        super().__init__()
        self.embed, self.cell = nn.Embedding(vocab, hidden), nn.LSTMCell(hidden, hidden)
        self.readout = nn.Linear(hidden, queries * candidates)
        self.queries, self.candidates = queries, candidates

    def step(self, token: torch.Tensor, state):
        h, c = self.cell(self.embed(token), state)
        return self.readout(h).view(-1, self.queries, self.candidates).argmax(-1), (h, c)


def time_events(step, events: list[int]) -> list[float]:
    """Seconds of `step(event)` for each event, one at a time."""
    out = []
    for event in events:
        started = time.perf_counter()
        step(event)
        out.append(time.perf_counter() - started)
    return out


def report(name: str, seconds: list[float]) -> float:
    median, p95 = percentiles(seconds)
    rate = len(seconds) / sum(seconds)
    print(f"{name:<34} {rate:10.1f} events/s   latency median {median:7.3f} ms   p95 {p95:7.3f} ms")
    return rate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--hidden_size", type=int, default=64)
    parser.add_argument("--intermediate_size", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", default="1,1,1", help="prelude,core,coda")
    parser.add_argument("--answer_feedback", type=lambda s: s.lower() in ("1", "true", "yes"), default=True)
    parser.add_argument("--attn", default="sdpa", help="sdpa | eager | par_eager (the attention implementation)")
    parser.add_argument("--operations", type=int, default=30, help="distinct operation tokens")
    parser.add_argument("--queries", type=int, default=2, help="query tokens, each read")
    parser.add_argument("--candidates", type=int, default=5)
    parser.add_argument("--lstm_hidden", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=50, help="events run first and not timed")
    parser.add_argument("--reread_repeats", type=int, default=3, help="timed predict calls on the whole prompt")
    parser.add_argument("--compile", action="store_true", help="model.compile_core() first (minutes on a CPU)")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def vocabulary(args) -> tuple[list[int], list[int], int, list[int], list[int]]:
    """(candidates, query ids, vocabulary size, the timed events, the warm-up events): 0 pad, 1 <bos>, the candidates,
    the query tokens, the operations."""
    candidates = list(range(2, 2 + args.candidates))
    query_ids = list(range(candidates[-1] + 1, candidates[-1] + 1 + args.queries))
    first_op = query_ids[-1] + 1
    vocab = first_op + args.operations
    g = torch.Generator().manual_seed(args.seed)
    events = torch.randint(first_op, vocab, (args.events,), generator=g).tolist()
    warmup = torch.randint(first_op, vocab, (args.warmup,), generator=g).tolist()
    return candidates, query_ids, vocab, events, warmup


def time_stream(model, query_ids: list[int], warmup: list[int], events: list[int]):
    """Per-event seconds of `model.stream` (after a warm-up stream) and its answer after the last event."""
    columns = list(range(len(query_ids)))
    warm = model.stream([1], query_ids, query_positions=columns)
    time_events(warm.update, [[e] for e in warmup])
    stream = model.stream([1], query_ids, query_positions=columns)
    par_seconds = time_events(stream.update, [[e] for e in events])
    return par_seconds, stream.answer()


def time_lstm(args, vocab: int, warmup: list[int], events: list[int]) -> tuple[list[float], int]:
    """Per-event seconds of an `LstmMonitor` (after warm-up events, its state reset) and its parameter count."""
    lstm = LstmMonitor(vocab, args.lstm_hidden, args.queries, args.candidates).eval()
    state = [(torch.zeros(1, args.lstm_hidden), torch.zeros(1, args.lstm_hidden))]

    def lstm_step(event):
        _, state[0] = lstm.step(torch.tensor([event]), state[0])

    time_events(lstm_step, warmup)
    state[0] = (torch.zeros(1, args.lstm_hidden), torch.zeros(1, args.lstm_hidden))
    lstm_seconds = time_events(lstm_step, events)
    return lstm_seconds, sum(p.numel() for p in lstm.parameters())


def time_reread(model, args, events: list[int], query_ids: list[int]):
    """Median milliseconds of `predict` on the whole prompt at forced depth d (after one untimed call), and its
    prediction."""
    columns = list(range(args.queries))
    ids = torch.tensor([[1, *events, *query_ids]])
    ends = torch.tensor([list(range(args.events + 1))])
    query_positions = torch.tensor([[args.events + 1 + c for c in columns]])
    reread = []
    model.predict(ids, query_positions=query_positions, operation_ends=ends, num_iterations=args.events)  # warm-up
    for _ in range(args.reread_repeats):
        started = time.perf_counter()
        prediction = model.predict(ids, query_positions=query_positions, operation_ends=ends,
                                   num_iterations=args.events)
        reread.append(time.perf_counter() - started)
    return 1e3 * statistics.median(reread), prediction


def main(argv=None):
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    candidates, query_ids, vocab, events, warmup = vocabulary(args)

    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {machine()}; 1 thread; {datetime.datetime.now().astimezone().isoformat(timespec='minutes')}")
    model = par_model(args, vocab, candidates)
    if args.compile:
        model.compile_core()
    params = sum(p.numel() for p in model.parameters())
    print(f"PAR: hidden {args.hidden_size}, MLP {args.intermediate_size}, {args.layers.replace(',', ' + ')} layers, "
          f"{args.heads} heads, answer feedback {args.answer_feedback}, attention {args.attn}"
          f"{', compile_core' if args.compile else ', eager'}, {params:,} parameters; "
          f"{args.events} one-token events, {args.queries} queries, {args.candidates} candidates")
    with torch.no_grad():
        par_seconds, last = time_stream(model, query_ids, warmup, events)
        lstm_seconds, lstm_params = time_lstm(args, vocab, warmup, events)

    print()
    par_rate = report("PAR stream (model.stream)", par_seconds)
    lstm_rate = report(f"LSTM cell, hidden {args.lstm_hidden} ({lstm_params:,} p.)", lstm_seconds)
    first, later = percentiles(par_seconds[:100]), percentiles(par_seconds[-100:])
    print(f"PAR stream latency, events 1-100 vs the last 100: median {first[0]:.3f} vs {later[0]:.3f} ms "
          "(flat: no re-reading)")

    reread_ms, prediction = time_reread(model, args, events, query_ids)
    diff = (prediction.answer_logits[0] - last.answer_logits).abs().max().item()
    same = torch.equal(prediction.answers[0], last.answers)
    print(f"{'predict, whole prompt (re-read)':<34} {1e3 / reread_ms:10.2f} events/s   "
          f"{reread_ms:9.1f} ms per event at d = {args.events} (median of {args.reread_repeats} after one untimed)")
    print()
    print(f"stream vs LSTM: {par_rate / lstm_rate:.2f}x the LSTM's events/s; re-reading at d = {args.events} costs "
          f"{reread_ms / (1e3 * statistics.median(par_seconds)):.0f}x the stream's median event")
    print(f"check: stream after {args.events} events vs predict on the whole prompt: answers equal {same}, "
          f"answer_logits max |diff| {diff:.2e}")

if __name__ == "__main__":
    main()
