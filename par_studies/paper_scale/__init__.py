"""The paper's retrofit at GPU scale, measured on a CPU (`examples/reproduce/paper_retrofit.py --dry_run`): the
FLOP / memory model and the GPU arithmetic (`flops`), the dry run that measures the 0.5B shape case by case
(`harness`) with its instruments (`measure`: resident memory, saved activations, FLOPs of CPU attention), and the
results README, plot and JSON it writes (`report`)."""
