"""`deeptrace watch`: live diagnosis of a running job (docs/deeptrace.md, "deeptrace watch").

- status.py: each rank progressing, slow, in an announced phase, waiting, or stuck (`judge`)
- follow.py: the growing trace files, read incrementally (arrivals at collectives, step windows)
- stacks.py: one stack snapshot of a rank, by py-spy or by the Collector's in-process dump on a signal
- capture.py: several snapshots of every rank, local ones here, remote ones through node.py's helpers
- verdict.py: the culprit from heartbeats and stacks (frozen frames, the odd rank), with file:line and evidence
- hangdir.py, alerts.py: RUN_DIR/deeptrace/hang-TIME/ and --on-hang / --webhook
- session.py: the loop (`Watch`); display.py: the rich table and the change log; cli.py: the command's body
"""
