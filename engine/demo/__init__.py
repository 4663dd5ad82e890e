"""The demo's example flows and driver."""
