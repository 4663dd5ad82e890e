"""Flow definitions: payload validation and canonical dumps, results, retry policies."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel, Field

from runstream.engine.errors import PayloadInvalid
from runstream.engine.flow.context import FlowContext
from runstream.engine.flow.definition import NO_RETRY, Flow, RetryPolicy, dump_json


class Item(BaseModel):
    sku: str
    qty: int = Field(gt=0)


class Order(BaseModel):
    order_id: str
    amount: int
    items: list[Item] = []
    note: str | None = None


class Shipped(BaseModel):
    order_id: str
    at: datetime
    tracking: uuid.UUID
    parcels: list[Item]


orders: Flow[Order, Shipped] = Flow("ship", payload=Order, result=Shipped)


# payload validation


def test_payload_from_dict_json_text_bytes_and_instance() -> None:
    expected = Order(order_id="o-1", amount=5, items=[Item(sku="a", qty=2)])
    as_dict = {"order_id": "o-1", "amount": 5, "items": [{"sku": "a", "qty": 2}]}
    assert orders.parse_payload(as_dict) == expected
    assert orders.load_payload(json.dumps(as_dict)) == expected
    assert orders.load_payload(json.dumps(as_dict).encode()) == expected
    assert orders.parse_payload(expected) == expected
    assert type(orders.parse_payload(as_dict)) is Order


def test_payload_validation_coerces_like_pydantic() -> None:
    assert orders.parse_payload({"order_id": "o-1", "amount": "7"}).amount == 7


@pytest.mark.parametrize("payload, where", [
    ({"order_id": "o-1"}, "amount: Field required"),
    ({"order_id": "o-1", "amount": "many"}, "amount: Input should be a valid integer"),
    ('{"order_id": "o-1", "amount": 1, "items": [{"sku": "a", "qty": 0}]}',
     "items.0.qty: Input should be greater than 0"),
    ("[1, 2]", "payload: Input should be"),  # a model payload must be an object
    ("{not json", "payload: Invalid JSON"),
])
def test_payload_invalid_names_the_field(payload: Any, where: str) -> None:
    with pytest.raises(PayloadInvalid) as raised:
        if isinstance(payload, str):
            orders.load_payload(payload)  # JSON text, as the journal holds payloads
        else:
            orders.parse_payload(payload)
    error = raised.value
    assert error.flow == "ship" and where in error.detail
    assert str(error).startswith("payload does not fit flow 'ship': ")
    assert "\n" not in str(error)  # one line, fit for logs and journal records
    assert error.__cause__ is None and error.__suppress_context__


def test_payload_invalid_lists_three_errors_and_counts_the_rest() -> None:
    flow = Flow("five", payload=dict[str, int])
    with pytest.raises(PayloadInvalid) as raised:
        flow.parse_payload({k: "x" for k in "abcde"})
    detail = raised.value.detail
    assert detail.count("Input should be a valid integer") == 3
    assert detail.endswith(" (+2 more)")


def test_untyped_flow_takes_any_json_value() -> None:
    flow = Flow("any")
    assert flow.parse_payload({"b": [1, None]}) == {"b": [1, None]}
    assert flow.load_payload("[1, 2]") == [1, 2]
    assert flow.parse_payload("[1, 2]") == "[1, 2]"  # a Python str is a string payload
    with pytest.raises(PayloadInvalid):
        flow.load_payload("not json")  # journal text is always JSON text


# canonical dumps


def test_dump_payload_is_canonical_so_equal_payloads_are_equal_text() -> None:
    texts = {
        orders.dump_payload({"amount": 5, "order_id": "o-1"}),
        orders.dump_payload(json.loads('{"order_id": "o-1", "amount": 5}')),
        orders.dump_payload(json.loads('{ "amount" : 5 ,\n "order_id":"o-1" }')),
        orders.dump_payload(Order(order_id="o-1", amount=5)),
        orders.dump_payload({"order_id": "o-1", "amount": "5"}),
    }
    assert texts == {'{"amount":5,"items":[],"note":null,"order_id":"o-1"}'}


def test_dump_payload_sorts_nested_keys_and_validates() -> None:
    flow = Flow("any")
    assert flow.dump_payload({"z": {"b": 1, "a": 2}, "a": [{"y": 1, "x": 2}]}) == (
        '{"a":[{"x":2,"y":1}],"z":{"a":2,"b":1}}')
    with pytest.raises(PayloadInvalid):
        orders.dump_payload({"order_id": "o-1"})


def test_dump_json_without_adapter_handles_models_and_json_types() -> None:
    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert dump_json({"b": Item(sku="s", qty=1), "a": when}) == (
        '{"a":"2024-01-02T03:04:05Z","b":{"qty":1,"sku":"s"}}')
    assert dump_json(None) == "null" and dump_json("é") == '"\\u00e9"'


# results


def test_result_dump_and_load_round_trip() -> None:
    result = Shipped(order_id="o-1", at=datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC),
                     tracking=uuid.UUID(int=7), parcels=[Item(sku="a", qty=1)])
    text = orders.dump_result(result)
    assert json.loads(text)["tracking"] == "00000000-0000-0000-0000-000000000007"
    assert list(json.loads(text)) == sorted(json.loads(text))
    loaded = orders.load_result(text)
    assert loaded == result and type(loaded) is Shipped
    assert orders.dump_result(loaded) == text


def test_untyped_result_round_trips_as_json() -> None:
    flow = Flow("any")
    assert flow.load_result(flow.dump_result({"b": (1, 2), "a": None})) == {
        "a": None, "b": [1, 2]}


# definitions


def test_handler_registration() -> None:
    flow: Flow[Order, int] = Flow("count", payload=Order, result=int)
    with pytest.raises(RuntimeError, match="no handler"):
        _ = flow.fn

    @flow.handler
    async def count(ctx: FlowContext, order: Order) -> int:
        return order.amount

    assert flow.fn is count
    assert repr(flow) == "Flow('count')"


@pytest.mark.parametrize(("name", "said"), [
    ("", "non-empty"), ("a/b", "'/'"), ("/", "'/'"),
    ("bad name!", "use only letters"),  # (no client could create a run of it)
])
def test_flow_name_must_be_one_a_client_can_name(name: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        Flow(name)


@pytest.mark.parametrize("name", ["checkout", "checkout.v2", "a-b_c"])
def test_valid_flow_names(name: str) -> None:
    assert Flow(name).name == name


# retry policies


def test_delay_grows_by_the_multiplier() -> None:
    policy = RetryPolicy(initial_interval=0.5, backoff_coefficient=2.0, maximum_interval=60.0)
    assert [policy.delay_after(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 8.0]


def test_delay_is_capped_by_max_backoff() -> None:
    policy = RetryPolicy(initial_interval=1.0, backoff_coefficient=3.0, maximum_interval=10.0)
    assert [policy.delay_after(n) for n in range(1, 6)] == [1.0, 3.0, 9.0, 10.0, 10.0]
    assert RetryPolicy().delay_after(100) == 60.0


def test_constant_and_zero_backoff() -> None:
    assert RetryPolicy(initial_interval=2.0, backoff_coefficient=1.0).delay_after(9) == 2.0
    assert RetryPolicy(initial_interval=0).delay_after(5) == 0.0


def test_default_policies() -> None:
    assert RetryPolicy() == RetryPolicy(max_attempts=3, initial_interval=0.5,
                                        backoff_coefficient=2.0, maximum_interval=60.0)
    assert NO_RETRY.max_attempts == 1
    with pytest.raises(AttributeError):
        NO_RETRY.max_attempts = 5  # type: ignore[misc]


def test_delay_stays_capped_for_very_many_attempts() -> None:
    assert RetryPolicy().delay_after(1025) == 60.0
