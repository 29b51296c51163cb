"""The README runs as written (issue 52): its python blocks are executed against the shipped checkpoints and their
`# -> ` outputs compared; its bash commands are run in-process at tiny scale (`--max_steps`-style overrides) in a
scratch folder, or, where a run needs a download or hours (the retrofit), parsed through the script's own argument
parser and path checks. Also: the README's shape (≤ 200 lines, the sections in order, quick starts ≤ 15 lines, ≤ 10
result rows whose figures are in the linked results, ≤ 8 one-line limits), its install line is setup_env.sh's, every
relative link in README.md and docs/ resolves, docs/training.md lists every flag of train_par.py with its default,
and the commands of the docs pages parse."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import load_example

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
DOCS = sorted((REPO / "docs").glob("*.md"))
SECTIONS = ["Install and the two commands", "Quick start 1", "Quick start 2", "Quick start 3", "Results", "Limits",
            "Code map"]

train_par = load_example("examples/train_par.py")

# tiny-scale overrides, per script: a flag the command gives is replaced, one it does not give is added
TINY = {
    "examples/make_dataset.py": {"--n": "1000", "--n_per_depth": "4"},
    "examples/train_par.py": {"--hidden_size": "32", "--intermediate_size": "64", "--num_attention_heads": "2",
                              "--num_key_value_heads": "2", "--per_device_train_batch_size": "16", "--max_steps": "2",
                              "--logging_steps": "1", "--disable_tqdm": "true", "--use_cpu": "true",
                              "--compile_core": "false"},
}
ONLY_IF_GIVEN = {"--n", "--n_per_depth"}  # make_dataset takes one of the two: override, never add


# ------------------------------------------------------------------------------------------------------ reading
def section(name: str, text: str = README) -> str:
    """The body of the `## name…` section."""
    match = re.search(rf"^## {re.escape(name)}[^\n]*\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"README has no section '## {name}'"
    return match.group(1)


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.M | re.S)


def commands(block: str) -> list[list[str]]:
    """The commands of a bash block, each as its words (continuations joined, comments and blank lines dropped;
    `a && b` is two commands)."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append(words[:cut])
            words = words[cut + 1:]
    return out


def with_tiny(script: str, argv: list[str]) -> list[str]:
    argv = list(argv)
    for flag, value in TINY.get(script, {}).items():
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        elif flag not in ONLY_IF_GIVEN:
            argv += [flag, value]
    return argv


# ------------------------------------------------------------------------------------------------------ running
class Shell:
    """Runs the README's bash lines in this process: `python examples/X.py ...` through the script's `main` (with
    the tiny overrides), `python -m module ...` through the module's `main`, `VAR=$(command)` capturing its output;
    `parse` names scripts that are only parsed (their flags through the script's own parser and path checks)."""

    def __init__(self, parse: dict | None = None):
        self.vars: dict[str, str] = {}
        self.parse = parse or {}
        self.ran: list[str] = []

    def run(self, words: list[str]) -> str:
        assignment = re.fullmatch(r"(\w+)=\$\((.*)", words[0])
        if assignment and words[-1].endswith(")"):  # VAR=$(command ...)
            inner = [assignment.group(2), *words[1:]]
            inner[-1] = inner[-1][:-1]
            self.vars[assignment.group(1)] = self.run([w for w in inner if w]).strip()
            return ""
        argv = [self.vars.get(a[1:], a) if a.startswith("$") else a for a in words]
        assert argv[0] == "python", f"README command not run by this test: {words}"
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            if argv[1] == "-m":
                self.ran.append(argv[2])
                importlib.import_module(argv[2]).main(argv[3:])
            else:
                script, args = argv[1], argv[2:]
                self.ran.append(script)
                if script in self.parse:
                    self.parse[script](args)
                else:
                    load_example(script).main(with_tiny(script, args))
        return out.getvalue()


def expected_output(lines: list[str], after: int):
    """The literal a `# -> ` comment right after line `after` (1-based) states, continuation lines included; None
    when there is none."""
    if after >= len(lines) or not lines[after].startswith("# -> "):
        return None
    text = lines[after][len("# -> "):]
    for line in lines[after + 1:]:
        if not line.startswith("#  "):
            break
        text += line[1:]
    return ast.literal_eval(text.strip())


def run_python_block(code: str, namespace: dict) -> int:
    """Execute `code` statement by statement; an expression followed by `# -> literal` must equal it. Returns how
    many outputs were compared."""
    lines, compared = code.splitlines(), 0
    for node in ast.parse(code).body:
        if isinstance(node, ast.Expr):
            value = eval(compile(ast.Expression(node.value), "<README>", "eval"), namespace)
            expected = expected_output(lines, node.end_lineno)
            if expected is not None:
                assert value == expected, f"README line {node.end_lineno}: got {value!r}"
                compared += 1
        else:
            exec(compile(ast.Module([node], type_ignores=[]), "<README>", "exec"), namespace)
    return compared


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A folder that looks like a clean clone to relative paths (examples/ and checkpoints/ linked in), so what
    the commands write stays out of the repository."""
    for name in ("examples", "checkpoints"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ------------------------------------------------------------------------------------------------------ shape
def test_readme_is_short_and_in_order():
    assert len(README.splitlines()) <= 200
    headings = re.findall(r"^## (.*)$", README, flags=re.M)
    positions = [next(i for i, h in enumerate(headings) if h.startswith(s)) for s in SECTIONS]
    assert positions == sorted(positions) and len(headings) == len(SECTIONS), headings
    intro = README.split("\n## ")[0]
    assert "Progress-aligned targets" in intro and "State-norm anchoring" in intro
    for quick in ("Quick start 1", "Quick start 2", "Quick start 3"):
        code = [line for block in code_blocks(section(quick), r"\w+") for line in block.splitlines() if line.strip()]
        assert 0 < len(code) <= 15, (quick, len(code))


def test_results_table_has_one_headline_per_study_and_its_figures_are_in_the_results():
    rows = [line for line in section("Results").splitlines() if line.startswith("| [")]
    assert 0 < len(rows) <= 10
    for row in rows:
        link = re.match(r"\| \[[^\]]+\]\((results/[^)]+/README\.md)\)", row)
        assert link, row
        results = (REPO / link.group(1)).read_text()
        for figure in re.findall(r"\d+\.\d+", row.split("|")[3]):
            assert figure in results, f"{figure} is not in {link.group(1)}"


def test_limits_are_at_most_eight_one_line_bullets_with_links():
    body = section("Limits").strip().splitlines()
    bullets = [line for line in body if line.strip()]
    assert 0 < len(bullets) <= 8 and all(line.startswith("- ") and "](" in line for line in bullets)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_in_readme_and_docs_resolves():
    for page in [REPO / "README.md", *DOCS]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"https?://", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{page.name}: link {target} does not resolve"
            if anchor and file.suffix == ".md":
                anchors = {slug(h) for h in re.findall(r"^#+ (.*)$", file.read_text(), flags=re.M)}
                assert anchor in anchors, f"{page.name}: no heading '#{anchor}' in {file.name}"
    linked = set(re.findall(r"\]\(docs/([\w.]+\.md)\)", README))
    assert {p.name for p in DOCS} <= linked, "every docs page is linked from the README"


# ------------------------------------------------------------------------------------------------------ install
def test_install_line_and_the_two_commands_are_what_the_scripts_do():
    block = code_blocks(section("Install and the two commands"), "bash")
    assert commands(block[0]) == [["bash", "scripts/main_job.sh"], ["bash", "scripts/test.sh"]]
    assert 'python examples/train_par.py "$@"' in (REPO / "scripts/main_job.sh").read_text()
    assert "python -m pytest" in (REPO / "scripts/test.sh").read_text()
    assert "bash scripts/test.sh" in (REPO / ".ci/run").read_text()
    setup = (REPO / "scripts/setup_env.sh").read_text()
    torch_spec = re.search(r'TORCH_SPEC:-([^}"]+)', setup).group(1)
    installs = [shlex.split(line.replace("$torch_spec", torch_spec).replace("$repo", "."))
                for line in re.findall(r"^\s*(pip install [^\n]*)", setup, flags=re.M)]
    assert commands(block[1]) == [[a for a in argv if a != "-q"] for argv in installs]
    # the main job as the README describes it: train_par.py's defaults
    model, task, data, train, _ = train_par.parse_all_args([])
    assert (model.hidden_size, model.prelude_layers, model.core_layers, model.coda_layers) == (128, 1, 2, 1)
    assert (train.max_steps, train.per_device_train_batch_size, train.max_train_depth) == (2000, 64, 8)
    assert (task.eval_n, task.eval_depths, train.output_dir) == (256, "8,16,32,64", "runs/par-swap-s5-cpu")


# ------------------------------------------------------------------------------------------------------ quick starts
def test_quick_start_1_answers_as_the_readme_says(scratch):
    (block,) = code_blocks(section("Quick start 1"), "python")
    assert run_python_block(block, {}) == 2


def test_quick_start_2_trains_exports_and_answers_at_tiny_scale(scratch):
    body = section("Quick start 2")
    (bash,) = code_blocks(body, "bash")
    shell = Shell()
    for line in commands(bash):
        shell.run(line)
    assert shell.ran == ["examples/make_dataset.py", "examples/make_dataset.py", "examples/train_par.py",
                         "examples/push_to_hub.py"]
    run = scratch / "runs" / "my-log"
    summary = (run / "summary.json").read_text()
    assert '"train_records"' in summary and (run / "eval_test.json").is_file()
    card = (scratch / "export" / "my-log" / "README.md").read_text()
    assert "# par-log\n" in card and "records from `log.csv`" in card and "split: test" in card
    (python,) = code_blocks(body, "python")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run_python_block(python, {})
    answer = ast.literal_eval(out.getvalue().strip())
    states = ["idle", "filling", "heating", "holding", "draining", "fault"]
    assert answer["answers"]["state"] in states and answer["depth"] == 3
    # the prose's budget is train_par.py's records default
    assert "after 6,000 steps" in body and train_par.DATA_TRAINING["max_steps"] == 6000
    assert "max_train_seconds" not in train_par.DATA_TRAINING


def test_quick_start_3_retrofit_command_parses_and_names_the_fetched_file(scratch, monkeypatch):
    """The fetch is stubbed (the real one downloads 100 MB); its folder holds the file the fetcher's own table names,
    so train_par.py's path check passes only if the README's --gguf_file is that file."""
    import par_studies.parents as parents

    class Fetched:
        def __init__(self, name):
            self.parent = parents.PARENTS[name]

        def ensure(self):
            folder = scratch / "cache" / self.parent.name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / self.parent.gguf_file).write_bytes(b"")
            return folder

    monkeypatch.setattr(parents, "get_parent", Fetched)
    parsed = {}

    def parse_train_par(argv):
        model, task, data, train, given = train_par.parse_all_args(argv)
        train_par.require_checkpoint("--init_from_parent", model.init_from_parent, gguf_file=model.gguf_file)
        train_par.require_task("--task_file", task.task_file, presets=False)
        parsed.update(model=model, task=task, train=train)

    (bash,) = code_blocks(section("Quick start 3"), "bash")
    shell = Shell(parse={"examples/train_par.py": parse_train_par})
    for line in commands(bash):
        shell.run(line)
    assert shell.ran == ["par_studies.parents", "examples/train_par.py"]
    model, task, train = parsed["model"], parsed["task"], parsed["train"]
    assert model.init_from_parent == str(scratch / "cache" / "smollm2-135m") and model.truncate_parent
    assert (model.prelude_layers, model.core_layers, model.coda_layers) == (3, 3, 3)
    assert task.rendering == "text" and train.max_steps == 1000
    assert "qwen2.5-coder-0.5b" in parents.PARENTS and "qwen2.5-coder-0.5b" in section("Quick start 3")


# ------------------------------------------------------------------------------------------------------ docs
def field_default(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_training_doc_lists_every_flag_with_its_default():
    from transformers import TrainingArguments

    from trainers import ParTrainingArguments, SelfDistillationArguments

    text = (REPO / "docs" / "training.md").read_text()
    rows = dict(re.findall(r"^\| `--(\w+)` \| ([^|]*) \|", text, flags=re.M))
    hf = {f.name for f in dataclasses.fields(TrainingArguments)} - {"remove_unused_columns"}
    fields = [f for cls in (train_par.ModelArguments, train_par.TaskArguments, train_par.DataArguments)
              for f in dataclasses.fields(cls)]
    fields += [f for f in dataclasses.fields(ParTrainingArguments) if f.name not in hf]
    special = {"records": train_par.DATA_TRAINING, "retrofit": train_par.RETROFIT_TRAINING}
    defaults = {f.name: train_par.DEFAULT_TRAINING.get(f.name, f.default) for f in fields}
    defaults.update({k: v for k, v in train_par.DEFAULT_TRAINING.items() if k in hf})
    for name, value in defaults.items():
        assert name in rows, f"docs/training.md lists no --{name}"
        cell = rows[name].strip()
        assert cell.split(" (")[0] == field_default(value), (name, cell, value)
        for kind, values in special.items():
            if name in values:
                value = values[name]
                shown = "the longest record" if value == train_par.LONGEST_RECORD else field_default(value)
                assert f"({kind}: {shown})" in cell, (name, cell)
    sd = [f for f in dataclasses.fields(SelfDistillationArguments)
          if f.name not in {g.name for g in dataclasses.fields(ParTrainingArguments)}]
    assert all(f"`--{f.name}` ({field_default(f.default)}" in text for f in sd)


PARSERS = {
    "examples/train_par.py": lambda argv: train_par.parse_all_args(argv),
    "examples/evaluate_par.py": lambda argv: load_example("examples/evaluate_par.py").parse_args(argv),
    "examples/make_dataset.py": lambda argv: load_example("examples/make_dataset.py").parse_args(argv),
    "examples/push_to_hub.py": lambda argv: load_example("examples/push_to_hub.py").build_parser().parse_args(argv),
}


def test_docs_commands_parse_through_their_scripts():
    """Every command of the docs pages for the four user-facing scripts parses with its own parser (optional parts
    written [--flag value] included); the others name scripts that exist."""
    parsed = 0
    for page in DOCS:
        for block in code_blocks(page.read_text(), "bash"):
            for words in commands(block):
                argv = [a.strip("[]") for a in words if a.strip("[]")]
                if argv[0] != "python" or argv[1] == "-m":
                    continue
                assert (REPO / argv[1]).is_file(), f"{page.name}: {argv[1]} does not exist"
                if argv[1] in PARSERS:
                    PARSERS[argv[1]](argv[2:])
                    parsed += 1
    assert parsed >= 10


def test_docs_pipeline_example_answers_as_it_says(scratch):
    (block,) = [b for b in code_blocks((REPO / "docs" / "evaluation.md").read_text(), "python") if "pipeline(" in b]
    assert run_python_block(block, {}) == 2


def test_docs_model_example_gives_what_it_says():
    """docs/evaluation.md's direct use of the model: forced depth exact, learned halting at d + 1."""
    (block,) = [b for b in code_blocks((REPO / "docs" / "evaluation.md").read_text(), "python") if "predict" in b]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(block, "docs/evaluation.md", "exec"), {})
    assert out.getvalue().strip() == "True [7, 7, 7, 7] [True, True, True, True]"
