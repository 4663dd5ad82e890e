"""Time travel, answered from a read model: a run's history with verdicts (`history`), points
in it (`points`: record, offset or instant), the namespace at a consistent cut (`cut`,
`state --at`), forks (`fork`: the I/O half; the planning is pure, `projections.fork_plan`),
the fencing ledger (`fencing`) and the counterfactual dry run (`dryrun`, `dryrun_report`).
The replay of a run's history is pure too: `projections.replay`.

May import: `engine.worker`, `engine.client`, `engine.readmodel`, `engine.flow`,
`engine.kafka`, `projections`, `engine.journal`, `engine.errors`, `engine.config`; never
the CLI or the UI, which show what it answers.
"""
