"""The throughput sweep: its cases, results read from the tasks' logs, the report, compare; shared by
the benchmark stage, `status` and the sweep's jobs (launcher.jobs.bench_task, bench_report).

Runs inside the training container too (the image carries this package), so nothing here imports
Hydra, Jinja or OmegaConf; only the report needs matplotlib, and only to draw the plot.
"""
