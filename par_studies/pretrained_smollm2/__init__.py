"""The pretrained-parent study on two CPU cores (`examples/reproduce/pretrained_smollm2.py`, whose docstring describes
the task, the test and every row): the rows as data (`rows`), where a row's run and record live and training it
(`training`), its test (`evaluation`), a row end to end and the parity check (`runner`), the diagnostics of a trained
row (`diagnostics`: slots, sentences, random start, profile), its probe over training and WiSE-FT toward the parent
(`curves`), the second held-out set (`heldout`), the pipeline-ready export (`export`), the summary and README tables
(`report`), and the command line (`cli`)."""
