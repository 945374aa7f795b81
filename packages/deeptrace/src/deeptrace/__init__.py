"""deeptrace: per-rank trace collection and analysis of distributed training runs.

Entry points for other code (import them from their modules; this package imports nothing heavy):

- `deeptrace.analysis.run.analyse_run(run_dir, ...) -> RunAnalysis` and
  `deeptrace.report.schema.build_report(analysis) -> Report` (the typed report.json, `deeptrace.report.model`;
  read one back with `load_report`)
- `deeptrace.watch` (`deeptrace watch`: live status, hang stacks and verdicts; `Watch`, `judge`, `decide`)
- `deeptrace.kineto.read_kineto(path) -> RankTable` (one PyTorch profiler trace, streamed)
- `deeptrace.classify.KernelClassifier`, `ClassifyConfig`, `load_classify_config`
- `deeptrace.rundir` (the run-directory format) and `deeptrace.collect` (the span collector)
"""

__version__ = "0.1.0"
