"""The admin console's limits form has every limit the admin API takes: each TenantLimits field
(tenant-wide) and each BaseLimits field (per base model), with the least value the API accepts.
A limit added to the models but not to the form fails here."""

import re

from loraplex.console import STATIC_DIR
from loraplex.tenancy.models import BaseLimits, TenantLimits

FORM = (STATIC_DIR / "limits_form.js").read_text()


def least_value(model, name):
    """The field's `ge`: the smallest value the API accepts."""
    return next(m.ge for m in model.model_fields[name].metadata if hasattr(m, "ge"))


def form_fields() -> dict[str, int]:
    """TenantLimits field -> the form input's least value, from LIMIT_GROUPS."""
    groups = FORM[FORM.index("export const LIMIT_GROUPS"):FORM.index("const LIMITS =")]
    rows = re.findall(r'\["(\w+)", "[^"]+", "[^"]+", (\d+)\]', groups)
    return {name: int(least) for name, least in rows}


TEXT = {"slo_class"}  # limits that are a name, not a number: TEXT_LIMITS


def test_every_tenant_limit_has_an_input_with_the_apis_least_value():
    wanted = {name: least_value(TenantLimits, name) for name in TenantLimits.model_fields
              if name != "models" and name not in TEXT}
    assert form_fields() == wanted


def test_every_text_limit_has_a_text_input():
    listed = FORM[FORM.index("export const TEXT_LIMITS"):]
    listed = listed[:listed.index("];")]
    assert set(re.findall(r'\["(\w+)", "', listed)) == TEXT
    assert all(TenantLimits.model_fields[name].annotation != int for name in TEXT)


def test_every_per_base_limit_has_an_input():
    listed = re.search(r"export const BASE_LIMITS = .*?\[([^\]]+)\]\.includes", FORM, re.S).group(1)
    assert set(re.findall(r'"(\w+)"', listed)) == set(BaseLimits.model_fields)
    for name in BaseLimits.model_fields:  # the same least value as the tenant-wide field it reuses
        assert form_fields()[name] == least_value(BaseLimits, name)
