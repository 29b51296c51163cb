"""A script's command line: a bad input is one line, ``error: <message>``, and exit status 2, as argparse does for a
bad flag (`run_cli`), and the paths a flag names are checked where the flag is read, before anything loads
(`require_file`, `require_checkpoint`, `require_task`), so that the error names the flag, the path and what it takes.
"""

from __future__ import annotations

import os

from state_tracking.tasks import GROUP_TASK_NAMES, get_task, load_task

CHECKPOINT_FILE = "config.json"  # what makes a folder a checkpoint (save_pretrained writes it)


def run_cli(main, argv: list[str] | None = None) -> None:
    """Run a script's `main(argv)` as its command line: a bad input prints ``error: <message>`` on stderr and exits 2;
    ``--debug`` (taken out of argv) or ``PAR_DEBUG=1`` shows the traceback instead.

    A bad input is a `ValueError` (`RecordError`, `PromptFormatError`, a refused flag or value, a path the `require_*`
    checks refuse) or an `OSError` (a file, folder or Hub repository the command names that cannot be read or
    written). Any other exception is a bug and keeps its traceback."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("PAR_DEBUG", "").lower() in ("1", "true", "yes")
    argv = [a for a in argv if a != "--debug"]
    try:
        main(argv)
    except (ValueError, OSError) as error:
        if debug:
            raise
        print(f"error: {error}\n(the traceback: run again with --debug or PAR_DEBUG=1)", file=sys.stderr)
        raise SystemExit(2) from None


def _is_hub_id(value: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def require_file(flag: str, path: str | os.PathLike | None, what: str = "a file") -> str | os.PathLike | None:
    """`path` when it names an existing file (None passes: the flag was not given); else a ValueError naming the flag,
    the path and `what` the flag takes."""
    if path is None or os.path.isfile(path):
        return path
    found = "is a folder" if os.path.isdir(path) else "does not exist"
    raise ValueError(f"{flag} {path}: {found}; give {what}.")


def require_checkpoint(flag: str, path: str | os.PathLike | None, gguf_file: str | None = None,
                       gguf_flag: str = "--gguf_file") -> str | os.PathLike | None:
    """`path` when `from_pretrained` can read it: a local folder holding config.json (with `gguf_file`: holding that
    GGUF file), or a Hub model id (``owner/name``, read by `from_pretrained` itself); None passes (the flag was not
    given). A missing local path, a file, or a folder that is not a checkpoint is a ValueError naming the flag."""
    if path is None:
        return path
    if os.path.isdir(path):
        if gguf_file is not None:
            if not os.path.isfile(os.path.join(path, gguf_file)):
                there = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
                raise ValueError(f"{gguf_flag} {gguf_file}: no such file in {flag} {path} (GGUF files there: "
                                 f"{there or 'none'}).")
        elif not os.path.isfile(os.path.join(path, CHECKPOINT_FILE)):
            raise ValueError(f"{flag} {path}: the folder is not a checkpoint (it has no {CHECKPOINT_FILE}); give a "
                             "folder save_pretrained wrote (a training run's output_dir) or a Hub model id.")
        return path
    if os.path.exists(path):
        raise ValueError(f"{flag} {path}: a file, not a checkpoint; give the folder save_pretrained wrote (a "
                         "training run's output_dir) or a Hub model id.")
    if not _is_hub_id(os.fspath(path)):
        raise ValueError(f"{flag} {path}: no such folder; give a checkpoint folder save_pretrained wrote (a training "
                         "run's output_dir) or a Hub model id (owner/name).")
    return path


def require_task(flag: str, value: str | os.PathLike | None, presets: bool = True):
    """The task a flag names: a preset (``swap_s5``, ``s5``, ``a5``; unless `presets` is False) or a task JSON file
    (`state_tracking.tasks.load_task`); None passes (the flag was not given). A missing file, or one that is not a
    task spec, is a ValueError naming the flag, the file and what is wrong."""
    if value is None:
        return None
    if presets and value in GROUP_TASK_NAMES:
        return get_task(value)
    allowed = (f"a preset {list(GROUP_TASK_NAMES)} or " if presets else "") + \
        "a task JSON file (examples/tasks/register3.json is one)"
    require_file(flag, value, allowed)
    try:
        return load_task(value)
    except (ValueError, TypeError, KeyError) as error:  # a spec load_task cannot read
        raise ValueError(f"{flag} {value}: not a task spec: {error}") from error


__all__ = ["CHECKPOINT_FILE", "require_checkpoint", "require_file", "require_task", "run_cli"]
