"""Lower bounds on the slow-loop objective and their certificates: the hop-class model and its
Lagrangian (decompose.py), co-location rows (colocation.py), scenario-group bounds (group_bound.py,
group_cpsat.py), the least NoP of any placement that the replica-count bound adds (nop_floor.py), and
the checkers that re-derive a bound from the data (check_bound.py,
check_group_bound.py)."""
