"""The throughput sweep's job-side code: the task wrapper, results from logs, the report, compare.

Runs inside the training container too (the image carries this package), so nothing here imports
Hydra, Jinja or OmegaConf; only the report needs matplotlib, and only to draw the plot.
"""
