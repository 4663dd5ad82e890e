"""Time travel: a run's history with verdicts (`history`), points in it (`points`: record,
offset or instant), the namespace at a consistent cut (`cut`, `state --at`), forks (`fork`,
`fork_source`: the I/O half; the planning is pure, in projections), the fencing ledger
(`fencing`) and the counterfactual dry run (`dryrun`, `dryrun_report`).

May import: `engine.worker`, `engine.client`, `engine.readmodel`, `engine.flow`,
`engine.kafka`, `projections`, `engine.journal`, `engine.errors`, `engine.config`,
`engine.timetext`; never the CLI or the UI, which show what it answers.
"""
