"""What a registered flow says of a create's payload, for its owner's decisions: whether it
takes it (payload_refusal), and the form two creates of one run id compare (payload_form).
Pure: the flow's model is called, nothing else."""

from __future__ import annotations

from collections.abc import Mapping

from runstream.engine.errors import PayloadInvalid
from runstream.projections.decide import json_form
from runstream.projections.reactions import RegisteredFlow


def payload_refusal(flows: Mapping[str, RegisteredFlow], flow_name: str,
                  payload_json: str) -> str | None:
    """Why the registered flow refuses the payload (None: it takes it, or the flow is not
    registered here: an owner that registers it validates it, at activation)."""
    flow = flows.get(flow_name)
    if flow is None:
        return None
    try:
        flow.load_payload(payload_json)
    except PayloadInvalid as exc:
        return str(exc)
    return None


def payload_form(flows: Mapping[str, RegisteredFlow], flow_name: str,
                 payload_json: str) -> str:
    """The payload as the registered flow writes it (its model's defaults filled in),
    else as sorted JSON (projections.decide.json_form): what two creates of one run id
    compare."""
    flow = flows.get(flow_name)
    if flow is not None:
        try:
            return flow.dump_payload(flow.load_payload(payload_json))
        except PayloadInvalid:
            pass
    return json_form(flow_name, payload_json)
