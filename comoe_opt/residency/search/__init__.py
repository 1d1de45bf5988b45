"""Local search on a placement's balance scenarios: descent (refine.py) and annealing (anneal.py)."""
