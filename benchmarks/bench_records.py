"""How long reading records files takes: load (datasets' CSV / JSON builders to Arrow), check and normalize, learn the
vocabulary, encode (batched over Arrow) — per 100k records, at a million records, one thread.

    python benchmarks/bench_records.py [--n 1000000] [--formats csv,jsonl] [--out results/own_data_cpu/prepare.json]

The file is written once by `examples/make_dataset.py` (register3, lengths 1..16, step states) into runs/bench_records/
and reused. The figure printed is the wall time of `read_record_splits` (what `train_par.py --train_file` runs before
training), and the peak resident memory of the process. `load_dataset` keeps the Arrow copy of a parsed file in
datasets' cache and reuses it: the figure includes parsing only on a file's first read (the committed figures were
measured with ~/.cache/huggingface/datasets emptied first).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--formats", default="csv,jsonl")
    parser.add_argument("--out", default=None)
    parser.add_argument("--workers", type=int, default=None, help="--preprocessing_num_workers (datasets' num_proc)")
    args = parser.parse_args(argv)
    import datasets
    import torch

    from state_tracking.records import RecordColumns, read_record_splits

    try:  # the records package (with ReadOptions) or an earlier commit's module
        from state_tracking.records import ReadOptions
        extra = {"options": ReadOptions(num_proc=args.workers, overwrite_cache=True)}
    except ImportError:
        extra = {}

    torch.set_num_threads(1)
    datasets.disable_caching()
    datasets.disable_progress_bars()
    folder = REPO / "runs" / "bench_records"
    rows = []
    for fmt in args.formats.split(","):
        path = folder / f"register3_{args.n}.{fmt}"
        if not path.is_file():
            subprocess.run([sys.executable, "examples/make_dataset.py", "--task", "examples/tasks/register3.json",
                            "--depths", "1-16", "--n", str(args.n), "--out", str(path)], cwd=REPO, check=True)
        started = time.time()
        records = read_record_splits(RecordColumns(), str(path), **extra)
        seconds = time.time() - started
        rows.append({"format": fmt, "records": len(records.encoded), "file_mb": round(path.stat().st_size / 2**20, 1),
                     "seconds": round(seconds, 1), "seconds_per_100k": round(seconds * 1e5 / len(records.encoded), 2)})
        print(rows[-1], flush=True)
    result = {"rows": rows, "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
              "command": "python benchmarks/bench_records.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, one thread"
                         + (f", {args.workers} reading processes" if args.workers else ""),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
