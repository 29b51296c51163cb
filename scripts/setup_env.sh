#!/usr/bin/env bash
# Create and fill the project's virtual environment if it is missing or stale, then leave it active.
# Sourced by scripts/main_job.sh and scripts/test.sh (and .ci/run, with a fresh VENV).
#   VENV        where the environment lives (default: .venv at the repository root)
#   TORCH_SPEC  the torch to install first (default torch==2.13.0, the CPU build; on a GPU machine give the build
#               you need, e.g. TORCH_SPEC="torch==2.11.0"); an unpinned torch pulls a multi-GB CUDA build
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$repo/.venv}"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
stamp="$venv/.par-installed"
want="$(cat "$repo/pyproject.toml" | sha256sum | cut -d' ' -f1) $torch_spec"
if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating $venv" >&2
    python3 -m venv "$venv"
fi
. "$venv/bin/activate"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing $torch_spec and the package (.[dev]) into $venv" >&2
    python -m pip install -q --upgrade pip
    # --- the README's install (keep in sync with README.md "Install") ---
    pip install -q "$torch_spec"
    pip install -q -e "$repo[dev]"
    echo "$want" > "$stamp"
fi
