"""The command line of the package's scripts: flags and their modes (`flag_modes`, `flag_values`, `hf_parser`,
`record_flags`), the error line every script exits with (`cli`), the recipe chosen from a user's records (`recipe`),
train_par.py's data step (`training_data`) and the arguments it resolves and builds once (`resolution`), its reports
and summary.json (`reports`) and the baselines it trains after PAR (`baselines_table`).

It builds on the tasks, data and evaluation of `state_tracking` and on `trainers`; nothing there imports it.
"""
