"""The slow loop's solver-backed methods: the `milp`/`exact`/`full`/`lp` pipeline (pipeline.py),
the Pyomo models (models.py), the cut model (cut_model.py) and the phases' budget (schedule.py)."""
