"""Time travel: a run's history and its state at any past point, points and trees of
rounds and children, the namespace at a cut (`state --at`), forks, the fencing ledger and
the counterfactual dry run.
"""
