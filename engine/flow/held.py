"""A step's outcome held back so that the run's last step rides in its completion.

A 3-step run used to write step.completed three times and then run.completed; the last
step's record and the completion went in one produce request anyway, but every reader
(the owner's read-back, the client's tail, read models, rebuilds) paid a record for each.
Now a reversible step's outcome waits, unsent, until the run's next decision: that
decision is sent after it, or, when it is the completion, carries it (run.completed's
final_step_* fields, which the reducer applies as the step.completed they stand for).
It waits one turn of the event loop at most (engine.flow.runner.HandlerRunner.hold_step),
so a handler that awaits anything outside its context sends it as before.

Never held: an irreversible step's outcome (its window without an outcome is quarantine),
and a large result (its size is judged where it is sent, and two large values together
could exceed a record that each alone fits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Results at most this large (characters of JSON) may be held, and ride in a completion
# whose own result is at most this large too: far below any record limit together.
HOLD_AT_MOST_CHARS = 16 * 1024


def may_hold(body: dict[str, Any]) -> bool:
    """A step's outcome small enough to hold (HandlerRunner.hold_step holds only steps')."""
    return len(str(body.get("result_json") or "")) <= HOLD_AT_MOST_CHARS


@dataclass(frozen=True, slots=True)
class HeldStep:
    body: dict[str, Any]  # the step.completed body: position, name, result_json, ...

    def rides_with(self, completion: dict[str, Any]) -> bool:
        return len(str(completion.get("result_json") or "")) <= HOLD_AT_MOST_CHARS

    def as_final_step(self) -> dict[str, Any]:
        """The run.completed fields that carry this step."""
        body = self.body
        return {"final_step_position": body["position"], "final_step_name": body["name"],
                "final_step_result_json": body["result_json"],
                "final_step_attempt": body.get("attempt", 1),
                "final_step_args_digest": body.get("args_digest")}
