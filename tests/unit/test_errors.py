"""StatusError: one base for every error with an HTTP status, one OpenAI error body."""

from loraplex.errors import StatusError
from loraplex.ingress.errors import APIError
from loraplex.registry.archive import UploadTooLarge
from loraplex.registry.store import AdapterNotFound
from loraplex.tenancy.service import InvalidAPIKey, UnknownTenant


def test_body_is_openai_shaped_with_the_status_as_code():
    err = StatusError("no such thing", status=404, param="model")
    assert err.body() == {"error": {"message": "no such thing", "type": "not_found_error", "param": "model",
                                    "code": 404}}
    assert StatusError("boom").body()["error"] == {"message": "boom", "type": "server_error", "param": None,
                                                   "code": 500}
    assert StatusError("teapot", status=418).type == "invalid_request_error"
    assert StatusError("x", status=429, code="rate_limit_requests").body()["error"]["code"] == "rate_limit_requests"


def test_every_family_is_a_status_error_with_its_status():
    for err, status in ((UnknownTenant("x"), 404), (InvalidAPIKey("x"), 401), (AdapterNotFound("x"), 404),
                        (UploadTooLarge("x"), 413), (APIError(409, "x"), 409)):
        assert isinstance(err, StatusError) and err.status == status and err.body()["error"]["code"] == status


def test_headers_come_from_the_class_and_are_not_shared():
    err = InvalidAPIKey("bad key")
    assert err.headers == {"WWW-Authenticate": "Bearer"}
    err.headers["X"] = "1"
    assert InvalidAPIKey("again").headers == {"WWW-Authenticate": "Bearer"}
    assert APIError(503, "down", headers={"Retry-After": "5"}).headers == {"Retry-After": "5"}


def test_with_param_keeps_the_raisers_choice():
    assert AdapterNotFound("x").with_param("model").param == "model"
    assert APIError(400, "x", param="name").with_param("model").param == "name"
