"""The slow loop's optimisation models: the MILP (milp.py) and its cut-condition form with lazy
cuts (cut_model.py), built here and solved by exact/pipeline.py and the bounds."""
