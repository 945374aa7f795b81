"""`xtrain metrics RUN_DIR [RUN_DIR ...]`: a run's curves from the shell, without a server.

`runs` reads each run directory's metrics.jsonl into one record per step (the later record of a step counts;
a resume drops the steps after its checkpoint that the interrupted attempt had logged), `summary` computes and
prints the last steps, the best eval loss and the throughput medians, `csv_file` writes every step's record as
CSV and `plot` draws the loss, eval loss, grad norm and tokens/s curves of one or several runs into a PNG.
"""

from xtrain.metrics_report.command import run_metrics
from xtrain.metrics_report.runs import MetricsInputError, RunMetrics, load_run

__all__ = ["MetricsInputError", "RunMetrics", "load_run", "run_metrics"]
