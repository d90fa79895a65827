"""Flat run filters of run-detail.md §12.2 and the `runs/values` field (unit level)."""

from __future__ import annotations

import pytest
from starlette.datastructures import QueryParams

from durably.dashboard.filters import BadRequest, run_query_kwargs, value_facet_request


def q(text: str) -> dict[str, object]:
    return run_query_kwargs(QueryParams(text))


def test_edge_cases_of_the_spec() -> None:
    assert q("status=running&status=suspended") == {"statuses": ["running", "suspended"]}
    assert q("status=running") == {"status": "running"}
    assert q("namespace=") == {}
    assert q("origin=x&unattributed=true") == {"origins": ["x", None]}
    assert q("unattributed=1&origin=x") == {"origins": ["x", None]}
    assert q("unattributed=true") == {"origin": None}
    assert q("limit=-1&offset=abc") == {}
    assert q("limit=10&offset=20") == {"limit": 10, "offset": 20}
    assert q("attr=amount:gte:200&attr=url:eq:http://x&attr=bad&attr=k:like:v") == {
        "attributes": [
            {"key": "amount", "op": "gte", "value": 200},
            {"key": "url", "op": "eq", "value": "http://x"},
        ]
    }
    assert q("attr=f:eq:true&attr=g:ne:1.5&attr=h:lt:") == {
        "attributes": [
            {"key": "f", "op": "eq", "value": True},
            {"key": "g", "op": "ne", "value": 1.5},
            {"key": "h", "op": "lt", "value": ""},
        ]
    }
    assert q("workflow=a&workflow=b&tag=t&unknown=1") == {"workflows": ["a", "b"], "tag": "t"}


def test_value_facet_requests() -> None:
    axis, query, limit, offset = value_facet_request(
        QueryParams("field=tag&tag=etl&namespace=acme&limit=5")
    )
    assert (axis, query, limit, offset) == ({"field": "tag"}, {"namespace": "acme"}, 5, 0)
    axis, query, limit, _ = value_facet_request(
        QueryParams("groupByCount[field]=attr.k&attr=k:eq:1&attr=j:eq:2&groupByCount[limit]=7")
    )
    assert axis == {"field": "attributeValue", "key": "k"}
    assert query == {"attributes": [{"key": "j", "op": "eq", "value": 2}]}
    assert limit == 7
    axis, query, limit, _ = value_facet_request(QueryParams("field=attributeKey&attr=k:eq:1"))
    assert (axis, query, limit) == ({"field": "attributeKey"}, {}, 100)
    with pytest.raises(BadRequest):
        value_facet_request(QueryParams("field=nope"))
    with pytest.raises(BadRequest):
        value_facet_request(QueryParams(""))
