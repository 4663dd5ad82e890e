"""The chaos harness: load, seeded faults (workers and broker), and a checker; see README.md."""
