"""The study's command line (`examples/reproduce/pretrained_smollm2.py`): its flags and what each runs."""

from __future__ import annotations

import argparse

from par_cli.flag_modes import true_or_false

from .curves import INTERPOLATION_N, interpolate, probe_curve
from .diagnostics import diagnose_sentences, diagnose_slots, profile_row, random_start
from .export import EXPORT, export
from .heldout import HELDOUT2, heldout2
from .report import collect
from .rows import ROWS
from .runner import run_parity, run_row


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=description)
    parser.add_argument("--row", choices=sorted(ROWS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--phrasings", default=None,
                        help="with --row: evaluate only these (comma-separated) phrasings, kept in the run folder "
                             "for a later --row run to read (no record written)")
    parser.add_argument("--parity", type=true_or_false, nargs="?", const=True, default=False,
                        help="R = 1 of the retrofit against the parent, real weights")
    parser.add_argument("--diagnose", choices=sorted(ROWS),
                        help="held-out phrasings one slot at a time (a trained row)")
    parser.add_argument("--sentences", choices=sorted(ROWS),
                        help="how a trained row reads each operation sentence on its own (d = 1 from every state)")
    parser.add_argument("--random_start", choices=sorted(ROWS),
                        help="a trained, recorded row's test with random start states (256 prompts per depth)")
    parser.add_argument("--profile", choices=sorted(ROWS),
                        help="accuracy of every iteration at d = 64, each phrasing (a trained, recorded row)")
    parser.add_argument("--export", choices=sorted(ROWS),
                        help=f"a trained row as a pipeline checkpoint ({EXPORT}/<name>)")
    parser.add_argument("--heldout2", choices=sorted(ROWS),
                        help=f"the chosen row's seeds (--seeds) on the second held-out set, once ({HELDOUT2})")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds for --heldout2")
    parser.add_argument("--cache_only", type=true_or_false, nargs="?", const=True, default=False,
                        help="with --heldout2: test the seeds and keep each in its run folder, write no record (seeds "
                             "in parallel processes; one later call over every seed writes the record)")
    parser.add_argument("--probe_curve", choices=sorted(ROWS),
                        help="a trained row's probe accuracies over training (its summary.json), kept as JSON")
    parser.add_argument("--compare_to", choices=sorted(ROWS),
                        help="with --probe_curve: the row trained with the same flags without the probe (weights diff)")
    parser.add_argument("--interpolate", choices=sorted(ROWS),
                        help="WiSE-FT: a trained row's weights moved back toward its parent's, evaluated per --alphas")
    parser.add_argument("--alphas", default="1.0,0.8,0.6,0.4",
                        help="comma-separated alphas in [0, 1] for --interpolate (1 = the fine-tuned row)")
    parser.add_argument("--interpolation_n", type=int, default=INTERPOLATION_N,
                        help="prompts per depth and phrasing for --interpolate")
    parser.add_argument("--collect", type=true_or_false, nargs="?", const=True, default=False,
                        help="README.md and summary.json from runs/*.json")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The flags that go together: one action at least, --cache_only with --heldout2, --compare_to with
    --probe_curve."""
    if not (args.row or args.parity or args.diagnose or args.sentences or args.random_start or args.profile
            or args.export or args.heldout2 or args.interpolate or args.probe_curve or args.collect):
        parser.error("give --row, --parity, --diagnose, --sentences, --random_start, --profile, --export, --heldout2, "
                     "--interpolate, --probe_curve or --collect")
    if args.cache_only and not args.heldout2:
        parser.error("--cache_only goes with --heldout2")
    if args.compare_to and not args.probe_curve:
        parser.error("--compare_to goes with --probe_curve")


def alphas_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[float]:
    """--alphas as numbers in [0, 1] (and --interpolation_n at least 1), or the parser's error naming them."""
    try:
        alphas = [float(a) for a in args.alphas.split(",")]
    except ValueError:
        parser.error(f"--alphas must be comma-separated numbers in [0, 1]; got {args.alphas!r}")
    if not alphas or any(not 0.0 <= a <= 1.0 for a in alphas):
        parser.error(f"--alphas must be comma-separated numbers in [0, 1]; got {args.alphas!r}")
    if args.interpolation_n < 1:
        parser.error(f"--interpolation_n must be >= 1; got {args.interpolation_n}")
    return alphas


def main(argv=None, description: str | None = None) -> None:
    """Run what the flags ask, in this order: parity, row, the diagnostics, export, the second held-out set, the
    probe curve, interpolation, collect (`description`: the --help text, the script's docstring's first paragraph)."""
    parser = build_parser(description)
    args = parser.parse_args(argv)
    check_args(parser, args)
    if args.parity:
        run_parity()
    if args.row:
        run_row(args.row, args.seed, None if args.phrasings is None else args.phrasings.split(","))
    if args.diagnose:
        diagnose_slots(args.diagnose, args.seed)
    if args.sentences:
        diagnose_sentences(args.sentences, args.seed)
    if args.random_start:
        random_start(args.random_start, args.seed)
    if args.profile:
        profile_row(args.profile, args.seed)
    if args.export:
        export(args.export, args.seed)
    if args.heldout2:
        heldout2(args.heldout2, [int(seed) for seed in args.seeds.split(",")], write_record=not args.cache_only)
    if args.probe_curve:
        probe_curve(args.probe_curve, args.seed, args.compare_to)
    if args.interpolate:
        interpolate(args.interpolate, args.seed, alphas_of(parser, args), args.interpolation_n)
    if args.collect:
        collect()
