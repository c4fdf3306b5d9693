"""The tenant and admin consoles with two base models (issue 35), in a real headless Chromium
against the real ingress app over two fake Engine pools (no Ray, no vLLM): the upload sends the
base model chosen (the archive names neither base, so without it the server refuses), the
adapters table shows each version's base, the playground offers every base and every adapter
grouped by base and runs each on its base's pool, usage shows per base model, and the admin view
has the month per base model, each replica's base, and a tenant's limits per base model (set,
shown again, cleared). Screenshots go to LORAPLEX_SCREENSHOTS, else var/screenshots."""

import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ingress"))
from browser import chromium, full_page_screenshot, screenshot_dir  # noqa: E402
from live_server import serving  # noqa: E402
from two_bases import ADMIN_TOKEN, SMALL, TINY, build_two_bases  # noqa: E402
from waiting import wait_until  # noqa: E402

WAIT_S = 20


@pytest.fixture
def platform(tmp_path):
    setup = build_two_bases(tmp_path)
    setup.add_usage(SMALL, 10, 2)
    setup.add_usage(TINY, 7, 3)
    try:
        with serving(setup.app) as url:
            yield setup, url
    finally:
        setup.close()


def css(driver, selector):
    return driver.find_elements("css selector", selector)


def sign_in(driver, url: str, page: str, token: str, view: str) -> None:
    driver.get(f"{url}/console/console.css")  # a page of the origin that runs no script
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{url}/console/{page}")
    wait_until(lambda: css(driver, "#token")[0].is_displayed(), WAIT_S, "the sign-in form")
    css(driver, "#token")[0].send_keys(token)
    css(driver, "#signin-form button[type=submit]")[0].click()
    wait_until(lambda: driver.execute_script("return document.body.dataset.ready") == view, WAIT_S, f"the {view} view")


def grouped_options(driver, select: str) -> dict:
    return driver.execute_script("""
        return Object.fromEntries([...document.querySelectorAll(arguments[0] + ' optgroup')]
          .map((g) => [g.label, [...g.querySelectorAll('option')].map((o) => o.value)]));""", select)


def table_rows(driver, table: str) -> list[list[str]]:
    return [[c.text for c in row.find_elements("css selector", "th, td")] for row in css(driver, f"{table} tbody tr")]


def test_tenant_console_with_two_bases(platform):
    setup, url = platform
    from selenium.webdriver.support.ui import Select

    with chromium() as driver, httpx.Client(base_url=url, headers={"Authorization": f"Bearer {setup.key}"}) as api:
        sign_in(driver, url, "", setup.key, "tenant")

        # Upload for the base chosen: it is the version's base, in the table and on the server.
        base_select = css(driver, "#adapter-base")[0]
        assert base_select.is_displayed()
        assert [o.get_attribute("value") for o in Select(base_select).options] == ["", SMALL, TINY]
        Select(base_select).select_by_value(TINY)
        css(driver, "#adapter-name")[0].send_keys("writer")
        css(driver, "#adapter-file")[0].send_keys(str(setup.archives[TINY]))
        message = css(driver, "#upload-message")[0]
        wait_until(lambda: message.get_attribute("data-kind") in ("ok", "error"), WAIT_S, "the upload's answer")
        assert message.get_attribute("data-kind") == "ok", message.text
        row = wait_until(lambda: css(driver, '#adapters-table tr[data-ref="writer@1"]'), WAIT_S, "writer@1 listed")[0]
        assert [c.text for c in row.find_elements("css selector", "th, td")][4] == TINY
        assert api.get("/v1/adapters").json()["data"][0]["versions"][0]["base_model"] == TINY
        assert f"for {TINY}" in message.text

        # The playground: each base with the adapters on it; each runs on its own base's pool.
        for select in ("#model-a", "#model-b"):
            assert grouped_options(driver, select) == {f"{SMALL} and its adapters": [SMALL],
                                                       f"{TINY} and its adapters": [TINY, "writer", "writer@1"]}
        assert (Select(css(driver, "#model-a")[0]).first_selected_option.get_attribute("value"),
                Select(css(driver, "#model-b")[0]).first_selected_option.get_attribute("value")) == (SMALL, "writer")
        assert Select(css(driver, "#model-b")[0]).first_selected_option.text == f"writer (on {TINY})"
        css(driver, "#send")[0].click()
        for pane, base in (("a", SMALL), ("b", TINY)):
            wait_until(lambda: css(driver, f"#reply-{pane}")[0].get_attribute("data-state") == "done", WAIT_S,
                       f"the {pane} reply ({css(driver, f'#meta-{pane}')[0].text})")
            assert css(driver, f"#reply-{pane}")[0].text == f"{base} says hi"
        [(_, call, _)] = setup.pools[TINY].requests
        assert call.adapter.lora_name.split("/")[1].startswith("writer@1")

        # Usage per base model: the table and the chart are /v1/usage?group_by=model's rows.
        Select(css(driver, "#usage-group")[0]).select_by_value("model")
        report = api.get("/v1/usage", params={"group_by": "model"}).json()
        expected = [[r["model"], f"{r['prompt_tokens']:,}", f"{r['cached_prompt_tokens']:,}",
                     f"{r['completion_tokens']:,}", f"{r['requests']:,}", r["cost"]] for r in report["rows"]]
        assert [r[0] for r in expected] == [SMALL, TINY]
        wait_until(lambda: table_rows(driver, "#usage-table") == expected, WAIT_S, "the usage per base model")
        assert css(driver, "#usage-key-h")[0].text == "Base model"
        assert driver.execute_script("return Chart.getChart(document.getElementById('usage-chart')).data.labels") \
            == [SMALL, TINY]
        full_page_screenshot(driver, screenshot_dir() / "console-tenant-two-bases.png")

        # The admin view: this month per base model, every tenant's.
        sign_in(driver, url, "admin.html", ADMIN_TOKEN, "admin")
        assert [r[:2] for r in table_rows(driver, "#models-table")] == [[SMALL, "10"], [TINY, "7"]]
        card = wait_until(lambda: css(driver, f'#replicas-list article[data-replica="{SMALL}#0"] h3'), WAIT_S,
                          "the replica card")[0]
        assert card.text == f"Replica {SMALL}#0 of {SMALL}"

        # Limits: a tenant-wide one the form had no field for before, and one per base model.
        admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})

        def limits():
            return admin.get(f"/admin/tenants/{setup.tenant_id}").json()["limits"]

        css(driver, '#tenants-table button[aria-label="Edit acme"]')[0].click()
        assert [g.get_attribute("data-base") for g in css(driver, "#edit-base-limits fieldset")] == [SMALL, TINY]
        css(driver, "#edit-batch_tokens_per_day")[0].send_keys("9000")
        css(driver, f'#edit-base-limits input[data-base="{TINY}"][data-limit="requests_per_minute"]')[0].send_keys("7")
        css(driver, "#edit-form button[type=submit]")[0].click()
        wait_until(lambda: limits()["batch_tokens_per_day"] == 9000, WAIT_S, "the edited limits")
        assert limits()["models"] == {TINY: {"requests_per_minute": 7, "tokens_per_minute": None,
                                             "max_concurrent_requests": None, "monthly_token_budget": None}}
        row = f'#tenants-table tr[data-tenant="{setup.tenant_id}"]'
        wait_until(lambda: f"on {TINY}: rpm 7" in css(driver, row)[0].text, WAIT_S, "the table to show them")
        assert "batch tokens/day 9,000" in css(driver, row)[0].text
        # Shown again on the next edit; emptied, the base's limits are cleared.
        css(driver, '#tenants-table button[aria-label="Edit acme"]')[0].click()
        tiny_rpm = css(driver, f'#edit-base-limits input[data-base="{TINY}"][data-limit="requests_per_minute"]')[0]
        assert tiny_rpm.get_attribute("value") == "7"
        assert css(driver, "#edit-batch_tokens_per_day")[0].get_attribute("value") == "9000"
        tiny_rpm.clear()
        css(driver, "#edit-form button[type=submit]")[0].click()
        wait_until(lambda: limits()["models"] is None, WAIT_S, "the per-base limits cleared")
        assert limits()["batch_tokens_per_day"] == 9000
        admin.close()
        full_page_screenshot(driver, screenshot_dir() / "console-admin-two-bases.png")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]]
        assert errors == []


def test_with_one_base_there_is_no_base_to_choose(tmp_path):
    """One base: the upload's base select stays hidden (nothing is sent: the server takes the
    only base) and the playground offers the base alone, as before issue 35."""
    from platform_app import BASE, build_platform_app

    setup = build_platform_app(tmp_path, lambda *a: iter(()))
    setup.add_tenant("solo")
    try:
        with serving(setup.app) as url, chromium() as driver:
            sign_in(driver, url, "", setup.keys["solo"].removeprefix("Bearer "), "tenant")
            assert not css(driver, "#adapter-base")[0].is_displayed()
            assert grouped_options(driver, "#model-b") == {f"{BASE} and its adapters": [BASE]}
    finally:
        setup.close()
