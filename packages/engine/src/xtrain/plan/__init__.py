"""`xtrain plan`: memory per rank, bytes per collective and step time of a run, before it starts.

- :mod:`.shapes`: the FSDP groups of a model under a layout (what a rank holds and gathers);
- :mod:`.memory`: per-rank memory by part; :mod:`.comm`: bytes per collective kind and link;
- :mod:`.devices` and :mod:`.estimate`: the roofline and its overlap model (assumptions cited in docs/plan.md);
- :mod:`.planner`: one plan of a config on a cluster; :mod:`.search`: every valid combination, ranked;
- :mod:`.command` and :mod:`.render`: the command's output.
"""
