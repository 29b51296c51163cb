"""Write a checkpoint folder's remote code from modeling_par/: the files it needs, as they are in the package.

    python scripts/sync_remote_code.py checkpoints/*            # rewrite each folder's remote code
    python scripts/sync_remote_code.py --check checkpoints/*    # change nothing; exit 1 naming what is stale

What a folder needs is what transformers loads for it with `trust_remote_code=True`: the modules its config.json
names (`auto_map`: the config and the model; `custom_pipelines`: the state-tracking pipeline) and, recursively, every
module they import relatively (transformers' own `get_relative_import_files`, the rule it copies and loads them by).
Each is copied from modeling_par/; a `.py` file in the folder that is not needed (a module the model no longer
imports) is removed. examples/push_to_hub.py writes every export's remote code with the same function.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
from pathlib import Path

from transformers.dynamic_module_utils import get_relative_import_files

PACKAGE = Path(__file__).resolve().parents[1] / "modeling_par"


def entry_modules(config: dict) -> list[str]:
    """The module names a config.json points transformers at: "modeling_par" for
    `auto_map: {"AutoModel": "modeling_par.ParLoopedQwenForStateTracking"}`, "pipeline_par" for a custom pipeline's
    `impl` (a "repo--module.Class" reference names code in another repository and is not ours to write)."""
    references = []
    for value in config.get("auto_map", {}).values():
        references += value if isinstance(value, (list, tuple)) else [value]
    references += [spec.get("impl") for spec in config.get("custom_pipelines", {}).values()]
    return sorted({ref.split(".")[0] for ref in references if ref and "--" not in ref})


def remote_code_files(folder: str | Path) -> list[Path]:
    """The package files `folder` needs as remote code (sorted by name), from its config.json."""
    config_path = Path(folder) / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{folder} has no config.json: not a checkpoint folder.")
    modules = entry_modules(json.loads(config_path.read_text()))
    if not modules:
        raise ValueError(f"{config_path} names no remote code (no auto_map or custom_pipelines).")
    files = set()
    for module in modules:
        entry = PACKAGE / f"{module}.py"
        if not entry.is_file():
            raise ValueError(f"{config_path} names module {module!r}, which modeling_par/ does not have.")
        files |= {entry, *map(Path, get_relative_import_files(entry))}
    return sorted(files, key=lambda p: p.name)


def write_remote_code(folder: str | Path, check: bool = False) -> list[str]:
    """Make `folder`'s remote code the package's: copy each needed file that is missing or differs, remove each `.py`
    that is not needed. Returns what was (with `check`: would be) changed, one "written NAME" / "removed NAME" each."""
    folder = Path(folder)
    needed = remote_code_files(folder)
    stale = [src for src in needed
             if not (folder / src.name).is_file() or not filecmp.cmp(src, folder / src.name, shallow=False)]
    names = {src.name for src in needed}
    extra = [path for path in sorted(folder.glob("*.py")) if path.name not in names]
    if not check:
        for src in stale:
            shutil.copyfile(src, folder / src.name)
        for path in extra:
            path.unlink()
    return [f"written {src.name}" for src in stale] + [f"removed {path.name}" for path in extra]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", help="checkpoint folders (each with a config.json)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if any folder is stale")
    args = parser.parse_args(argv)
    stale = False
    for folder in args.folders:
        changes = write_remote_code(folder, check=args.check)
        stale |= bool(changes)
        verb = "stale" if args.check else "updated"
        print(f"{folder}: " + (f"{verb}: " + ", ".join(changes) if changes else "remote code is the package's"))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
