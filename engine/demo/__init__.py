"""The demo (`runstream demo`, `scripts/demo.sh`): its example flows (`flows`, `next_deploy`)
and the driver that walks through runs, history, time travel, waits, rounds, a run's whole
life, debugging and poison records.

May import every library package; like the CLI and the UI, no library package imports it.
"""
