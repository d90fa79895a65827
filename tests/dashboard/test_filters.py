"""Flat run filters and the `runs/values` field (unit level): read exactly, or refused."""

from __future__ import annotations

import pytest
from starlette.datastructures import QueryParams

from durably.dashboard.filters import (
    FILTER_PARAMS,
    BadRequest,
    check_known,
    page,
    run_query_kwargs,
    value_facet_request,
)


def q(text: str) -> dict[str, object]:
    return run_query_kwargs(QueryParams(text))


def test_filters_read_as_written() -> None:
    assert q("status=running&status=suspended") == {"statuses": ["running", "suspended"]}
    assert q("status=running") == {"status": "running"}
    assert q("namespace=") == {}  # blank: no restriction on that field
    assert q("origin=x&unattributed=true") == {"origins": ["x", None]}
    assert q("unattributed=1&origin=x") == {"origins": ["x", None]}
    assert q("unattributed=true") == {"origin": None}
    assert q("unattributed=false") == {}
    assert q("attr=amount:gte:200&attr=url:eq:http://x&attr=") == {
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
    assert q("workflow=a&workflow=b&tag=t") == {"workflows": ["a", "b"], "tag": "t"}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("attr=bad", "attr"),
        ("attr=k:like:v", "attr"),
        ("attr=customer=42", "attr"),
        ("attr=:eq:1", "attr"),
        ("status=done", "status"),
        ("unattributed=yes", "unattributed"),
        ("unattributed=true&unattributed=false", "unattributed"),
    ],
)
def test_a_malformed_filter_is_refused(text: str, named: str) -> None:
    with pytest.raises(BadRequest, match=f"`{named}`"):
        q(text)


def test_pages_and_unknown_parameters() -> None:
    assert page(QueryParams("")) == (50, 0)
    assert page(QueryParams("limit=10&offset=20")) == (10, 20)
    for text in ("limit=0", "limit=-1", "offset=abc", "limit=1001", "limit=1&limit=2"):
        with pytest.raises(BadRequest):
            page(QueryParams(text))
    check_known(QueryParams("tag=a&limit=1"), FILTER_PARAMS | {"limit"})
    with pytest.raises(BadRequest, match="`unknown`"):
        check_known(QueryParams("tag=a&unknown=1"), FILTER_PARAMS)


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
    for text in ("field=nope", "", "field=tag&limit=0", "field=tag&colour=red"):
        with pytest.raises(BadRequest):
            value_facet_request(QueryParams(text))
