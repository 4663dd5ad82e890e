"""What a registered flow says of a create's payload, for its owner's decisions: whether it
takes it (payload_refusal), and the form two creates of one run id compare (payload_form).
Pure: the flow's model is called, nothing else."""

from __future__ import annotations

from collections.abc import Mapping

from runstream.engine.errors import PayloadInvalid
from runstream.engine.journal.input_limits import PayloadTooLarge, check_payload, shown
from runstream.projections.decide import json_form
from runstream.projections.reactions import RegisteredFlow
from runstream.projections.signal_start import is_json


def payload_refusal(flows: Mapping[str, RegisteredFlow], flow_name: str,
                  payload_json: str) -> str | None:
    """Why the payload is refused (None: it is taken): it is not JSON (empty, NaN), it is
    over the payload limit, or the registered flow refuses it (a flow not registered here:
    an owner that registers it validates it, at activation). Every client door checks the
    first two; a plain producer's create reached the run unchecked, which then failed."""
    if not is_json(payload_json):
        return (f"the payload of flow {flow_name[:128]!r} is not JSON: "
                f"{shown(payload_json, 40)}")
    try:
        check_payload(f"the payload of flow {flow_name[:128]!r}", payload_json)
    except PayloadTooLarge as exc:
        return str(exc)
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
