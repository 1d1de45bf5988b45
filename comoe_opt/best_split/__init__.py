"""The best split of a step's work over an expert's replicas: the cut condition, its min cut, the share LP.

A step's best-routing makespan is a cut ratio over chiplet sets (cut_condition.py), found by
enumeration or by parametric min cut (min_cut.py), or by the share LP (best_split/shares.py) when chiplets
are not related by one speed factor. The slow loop, the balancers and the evaluator score
placements with it; it imports nothing of theirs.
"""
