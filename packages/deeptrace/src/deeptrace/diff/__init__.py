"""`deeptrace diff RUN_A RUN_B`: what changed between two runs, per op, per kind of collective, per rank, per span.

`side` reads each run (run directory or folder of Kineto traces) with deeptrace's readers and analysis, `ops`
counts the ops of a Kineto trace per ProfilerStep (as HTA's TraceDiff), `compare` makes the typed `DiffReport`
(`model`), `render` writes it for people and programs.
"""
