"""Time travel: a run's history and its state at any past point, points and trees of
rounds and children, the namespace at a cut (`state --at`), forks, the fencing ledger and
the counterfactual dry run, all answered from a read model. The pure halves are in
projections: the replay of a run's history (projections.replay), fork planning
(projections.fork_plan); `fork_source` is only that old name, until its last importers move.

May import: client, readmodel, flow, kafka, projections, journal, errors, config; never cli or ui.
"""
