"""The web console at /console in a real headless Chromium, against the shared platform (real
vLLM engine): a tenant signs in, sees a usage chart whose totals are /v1/usage's, uploads a good
adapter (drag and drop) and a bad one (the validator's message as it is), streams replies from
the base model and the adapter side by side and deletes the adapter after confirming; another
tenant sees none of it; an admin creates a tenant with a limit, edits a limit, issues a key and
suspends the tenant; a tenant key opens no admin page and no admin route. Screenshots of both
views go to LORAPLEX_SCREENSHOTS (docs/img refreshes docs/console.md's), else var/screenshots."""

import io
import sys
import tarfile
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from browser import chromium, full_page_screenshot, screenshot_dir  # noqa: E402
from demo_adapters import trained_adapter  # noqa: E402
from tenant_keys import ADMIN_TOKEN, new_tenant_key  # noqa: E402
from waiting import wait_until  # noqa: E402

from loraplex.tenancy.config import KeyCacheConfig  # noqa: E402

pytestmark = pytest.mark.integration
WAIT_S = 60
KEY_REFRESH_S = KeyCacheConfig().refresh_s  # the platform under test keeps the default
STREAM_WAIT_S = 120  # two streams at once on a CPU engine shared with the other tests' leftovers


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def tenant_client(base_url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def by_css(driver, selector):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def all_css(driver, selector):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def sign_out_of_tab(driver, base_url: str) -> None:
    """Forget the tab's token from a page of the same origin that runs no script: clearing it on a
    console page races the page's own sign-in with the stored token (its next call would go out
    with no token and get a 401)."""
    driver.get(f"{base_url}/console/console.css")
    driver.execute_script("sessionStorage.clear()")


def sign_in(driver, base_url: str, page: str, token: str) -> None:
    sign_out_of_tab(driver, base_url)
    driver.get(f"{base_url}/console/{page}")
    field = wait_until(lambda: by_css(driver, "#token").is_displayed() and by_css(driver, "#token"), WAIT_S, "sign-in")
    field.send_keys(token)
    by_css(driver, "#signin-form button[type=submit]").click()


def wait_ready(driver, view: str) -> None:
    wait_until(lambda: driver.execute_script("return document.body.dataset.ready") == view, WAIT_S,
               f"the {view} view to load")


def month_range() -> dict:
    """The console's default range: this UTC month's first day to today, inclusive."""
    today = datetime.now(timezone.utc).date()
    return {"start": today.replace(day=1).isoformat(), "end": (today + timedelta(days=1)).isoformat(),
            "group_by": "day"}


def chart_totals(driver) -> dict:
    return driver.execute_script("""
        const chart = Chart.getChart(document.getElementById('usage-chart'));
        const sum = (i) => chart.data.datasets[i].data.reduce((a, b) => a + b, 0);
        return {labels: chart.data.datasets.map((d) => d.label), prompt: sum(0), cached: sum(1),
                completion: sum(2), cost: sum(3)};""")


def drop_file(driver, zone: str, path: Path) -> None:
    """Drag and drop of a real file: Selenium puts it in a scratch file input (as the OS's file
    dialog would), then the page gets the `drop` event carrying it, as from a file manager."""
    scratch = driver.execute_script("""
        const input = document.createElement('input');
        input.type = 'file'; input.id = 'scratch-drop'; document.body.append(input); return input;""")
    scratch.send_keys(str(path))
    driver.execute_script("""
        const input = document.getElementById('scratch-drop');
        const data = new DataTransfer(); data.items.add(input.files[0]);
        for (const type of ['dragenter', 'dragover', 'drop']) {
          document.querySelector(arguments[0]).dispatchEvent(
            new DragEvent(type, {dataTransfer: data, bubbles: true, cancelable: true}));
        }
        input.remove();""", zone)


def unlabelled_controls(driver) -> list[str]:
    """Form controls and buttons a screen reader could not name (no <label>, aria-label or text)."""
    return driver.execute_script("""
        return [...document.querySelectorAll('input, select, textarea, button, [role=button]')]
          .filter((el) => el.type !== 'hidden' && el.id !== 'scratch-drop')
          .filter((el) => !((el.labels && el.labels.length) || el.getAttribute('aria-label') || el.textContent.trim()))
          .map((el) => el.outerHTML.slice(0, 80));""")


def bad_archive(tmp_path: Path) -> Path:
    """A .tar.gz with no adapter in it: the validator refuses it with a 4xx naming the fix."""
    path = tmp_path / "not-an-adapter.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        data = b"just notes\n"
        info = tarfile.TarInfo("notes.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def reply_done(driver, pane: str):
    state = by_css(driver, f"#reply-{pane}").get_attribute("data-state")
    if state == "error":
        raise AssertionError(by_css(driver, f"#meta-{pane}").text)
    return state == "done" and by_css(driver, f"#reply-{pane}").text.strip()


def test_tenant_console(browser, base_url, admin, model_name, tmp_path):
    key = new_tenant_key(admin, "console-tenant")
    other_key = new_tenant_key(admin, "console-other")
    pirate = trained_adapter("pirate")
    with tenant_client(base_url, key) as me, tenant_client(base_url, other_key) as other:
        # Some usage first, so the chart has something to add up.
        r = me.post("/v1/chat/completions", json={"model": model_name, "max_tokens": 8,
                                                  "messages": [{"role": "user", "content": "Hello!"}]})
        assert r.status_code == 200, r.text
        wait_until(lambda: me.get("/v1/usage").json()["total"]["requests"] >= 1, WAIT_S, "the usage record")

        sign_out_of_tab(browser, base_url)
        browser.get(f"{base_url}/console/")
        wait_until(lambda: browser.execute_script("return document.activeElement.id") == "token", WAIT_S,
                   "the key field to have the keyboard focus")
        sign_in(browser, base_url, "", key)
        wait_ready(browser, "tenant")
        assert unlabelled_controls(browser) == []
        usage = me.get("/v1/usage", params=month_range()).json()
        totals = chart_totals(browser)
        assert totals["labels"][:3] == ["Prompt tokens", "Cached prompt tokens", "Completion tokens"]
        assert (totals["prompt"], totals["cached"], totals["completion"]) == (
            usage["total"]["prompt_tokens"], usage["total"]["cached_prompt_tokens"],
            usage["total"]["completion_tokens"])
        assert usage["total"]["prompt_tokens"] > 0
        assert totals["cost"] == pytest.approx(float(Decimal(usage["total"]["cost"])), abs=1e-9)
        assert by_css(browser, "#total-prompt").text == f"{usage['total']['prompt_tokens']:,}"
        assert by_css(browser, "#total-cost").text == usage["total"]["cost"]

        # A good adapter, dropped on the drop zone: listed with the served model's name.
        by_css(browser, "#adapter-name").send_keys("pirate")
        drop_file(browser, "#dropzone", pirate)
        row = wait_until(lambda: all_css(browser, '#adapters-table tr[data-ref="pirate@1"]'), WAIT_S,
                         "pirate@1 in the adapter list")[0]
        cells = [td.text for td in row.find_elements("css selector", "th, td")]
        listed = me.get("/v1/adapters").json()["data"][0]["versions"][0]
        assert cells[:5] == ["pirate", "1", listed["sha256"][:12], str(listed["rank"]), model_name]
        assert "Uploaded pirate@1" in by_css(browser, "#upload-message").text

        # A bad one, through the file chooser: the validator's message exactly as the API says it.
        bad = bad_archive(tmp_path)
        with open(bad, "rb") as f:
            refused = me.post("/v1/adapters", data={"name": "broken"}, files={"file": (bad.name, f, "application/gzip")})
        assert 400 <= refused.status_code < 500
        by_css(browser, "#adapter-name").clear()
        by_css(browser, "#adapter-name").send_keys("broken")
        by_css(browser, "#adapter-file").send_keys(str(bad))
        message = wait_until(lambda: by_css(browser, "#upload-message").get_attribute("data-kind") == "error"
                             and by_css(browser, "#upload-message"), WAIT_S, "the refusal")
        assert message.text == refused.json()["error"]["message"]
        assert message.get_attribute("role") == "alert"
        assert message.get_attribute("data-status") == str(refused.status_code)

        # The playground: the base model and the adapter, streamed side by side.
        from selenium.webdriver.support.ui import Select

        Select(by_css(browser, "#model-a")).select_by_value(model_name)
        Select(by_css(browser, "#model-b")).select_by_value("pirate")
        by_css(browser, "#max-tokens").clear()
        by_css(browser, "#max-tokens").send_keys("12")
        by_css(browser, "#send").click()
        for pane in ("a", "b"):
            wait_until(lambda: reply_done(browser, pane), STREAM_WAIT_S, f"the {pane} reply")
        assert "first token after" in by_css(browser, "#meta-a").text and model_name in by_css(browser, "#meta-a").text
        assert by_css(browser, "#meta-b").text.startswith("pirate:")
        # The right pane really ran on the adapter: its request is billed to it.
        wait_until(lambda: any((r["adapter"] or "").startswith("pirate") for r in
                               me.get("/v1/usage", params={"group_by": "adapter"}).json()["rows"]),
                   WAIT_S, "the adapter's stream in the usage by adapter")
        full_page_screenshot(browser, screenshot_dir() / "console-tenant.png")

        # Another tenant sees none of it: its own (empty) usage, no adapters, no pirate to pick.
        by_css(browser, "#sign-out").click()
        assert by_css(browser, "#token").is_displayed()
        assert browser.execute_script("return sessionStorage.length") == 0
        sign_in(browser, base_url, "", other_key)
        wait_ready(browser, "tenant")
        assert other.get("/v1/usage", params=month_range()).json()["total"]["requests"] == 0
        assert chart_totals(browser)["prompt"] == 0 and by_css(browser, "#total-requests").text == "0"
        assert not all_css(browser, "#adapters-table tr[data-ref]")
        options = [o.get_attribute("value") for o in all_css(browser, "#model-b option")]
        assert options == [model_name]

        # Delete, after a confirmation: Cancel keeps it, Delete removes it.
        sign_in(browser, base_url, "", key)
        wait_ready(browser, "tenant")
        by_css(browser, '#adapters-table tr[data-ref="pirate@1"] button').click()
        assert by_css(browser, "#confirm").is_displayed() and "pirate@1" in by_css(browser, "#confirm-text").text
        by_css(browser, "#confirm-no").click()
        assert me.get("/v1/adapters").json()["data"]
        by_css(browser, '#adapters-table tr[data-ref="pirate@1"] button').click()
        by_css(browser, "#confirm-yes").click()
        wait_until(lambda: not all_css(browser, '#adapters-table tr[data-ref="pirate@1"]'), WAIT_S, "the row to go")
        assert me.get("/v1/adapters").json()["data"] == []
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "/v1/adapters" not in e["message"]
            and "favicon" not in e["message"]] == []


def test_admin_console(browser, base_url, admin):
    sign_in(browser, base_url, "admin.html", ADMIN_TOKEN)
    wait_ready(browser, "admin")
    assert unlabelled_controls(browser) == []

    # Create a tenant with a limit.
    by_css(browser, "#create-box summary").click()
    by_css(browser, "#create-name").send_keys("console-made")
    by_css(browser, "#create-requests_per_minute").send_keys("30")
    by_css(browser, "#create-batch_tokens_per_day").send_keys("9000")
    by_css(browser, "#create-form button[type=submit]").click()
    row = wait_until(lambda: all_css(browser, '#tenants-table tr[data-name="console-made"]'), WAIT_S, "the new tenant")[0]
    tenant_id = row.get_attribute("data-tenant")
    stored = admin.get(f"/admin/tenants/{tenant_id}").json()
    assert stored["name"] == "console-made" and stored["limits"]["requests_per_minute"] == 30
    assert stored["limits"]["batch_tokens_per_day"] == 9000
    assert "rpm 30" in row.text and tenant_id in row.text

    # Edit a limit.
    by_css(browser, f'#tenants-table tr[data-tenant="{tenant_id}"] button[aria-label="Edit console-made"]').click()
    by_css(browser, "#edit-tokens_per_minute").send_keys("5000")
    by_css(browser, "#edit-form button[type=submit]").click()
    wait_until(lambda: admin.get(f"/admin/tenants/{tenant_id}").json()["limits"]["tokens_per_minute"] == 5000,
               WAIT_S, "the edited limit")
    assert admin.get(f"/admin/tenants/{tenant_id}").json()["limits"]["requests_per_minute"] == 30

    # Issue a key: shown once, and it works.
    wait_until(lambda: "tpm 5,000" in by_css(browser, f'#tenants-table tr[data-tenant="{tenant_id}"]').text,
               WAIT_S, "the table to show the new limit")
    by_css(browser, f'#tenants-table tr[data-tenant="{tenant_id}"] button[aria-label="Keys of console-made"]').click()
    wait_until(lambda: by_css(browser, "#keys").is_displayed(), WAIT_S, "the keys dialog")
    by_css(browser, "#issue-key").click()
    key = wait_until(lambda: by_css(browser, "#new-key").get_attribute("value"), WAIT_S, "the new key")
    assert key.startswith("lpx-")
    with tenant_client(base_url, key) as new:
        assert new.get("/v1/models").status_code == 200
        listed = admin.get(f"/admin/tenants/{tenant_id}/keys").json()["data"]
        assert len(listed) == 1 and key.startswith(listed[0]["prefix"])
        wait_until(lambda: len(all_css(browser, "#keys-table tr[data-key]")) == 1, WAIT_S, "the key in the list")
        by_css(browser, "#keys-close").click()
        assert by_css(browser, "#new-key").get_attribute("value") == ""

        # The other panels: month-to-date usage, latency against the SLO, replicas, billing.
        latency = admin.get("/admin/latency").json()
        wait_until(lambda: len(all_css(browser, "#latency-table tr[data-metric]")) == 2, WAIT_S, "the latency rows")
        caption = by_css(browser, "#latency-caption").text
        assert ("Prometheus" if latency["source"] == "prometheus" else "usage ledger") in caption
        slo_cell = by_css(browser, '#latency-table tr[data-metric="ttft"] td:nth-of-type(2)').text
        assert slo_cell == (f"{latency['slo']['ttft_p95_s']:.2f} s" if latency["slo"]["ttft_p95_s"] >= 1
                            else f"{latency['slo']['ttft_p95_s'] * 1000:.0f} ms")
        replicas = admin.get("/admin/replicas")
        state = by_css(browser, "#replicas-list").get_attribute("data-state")
        if replicas.status_code == 404:
            assert state == "unavailable" and "Not available" in by_css(browser, "#replicas-message").text
        else:
            assert replicas.status_code == 200 and state == "shown"
            cards = [c.get_attribute("data-replica") for c in all_css(browser, "#replicas-list article.card")]
            assert sorted(cards) == sorted(r["replica_id"] for r in replicas.json()["data"])
        dedicated = admin.get("/admin/dedicated").json()
        entries = sorted(e["adapter"] for e in dedicated["data"] + dedicated["pending"])
        rows = wait_until(lambda: all_css(browser, "#dedicated-table tbody tr"), WAIT_S, "the dedicated table")
        if entries:
            assert sorted(r.get_attribute("data-adapter") for r in rows) == entries
        else:
            assert len(rows) == 1 and "No adapter is dedicated" in rows[0].text
        period = datetime.now(timezone.utc).strftime("%Y-%m")
        export = admin.get("/admin/billing/export", params={"period": period})
        month = by_css(browser, f'#billing-table tr[data-period="{period}"]').text
        assert ("complete" if export.headers["X-LoRAPlex-Export-Complete"] == "true" else "open") in month
        assert len(all_css(browser, "#billing-table tr[data-period]")) == 3
        full_page_screenshot(browser, screenshot_dir() / "console-admin.png")

        # Suspend, after a confirmation: its key gets 403 on every ingress replica within the key
        # cache's refresh_s (at once on the replica that served the PATCH; there are two).
        by_css(browser, f'#tenants-table tr[data-tenant="{tenant_id}"] button[aria-label="Suspend console-made"]').click()
        by_css(browser, "#confirm-yes").click()
        wait_until(lambda: admin.get(f"/admin/tenants/{tenant_id}").json()["status"] == "suspended", WAIT_S,
                   "the suspension")
        suspended_at = time.monotonic()  # the PATCH was committed before this
        wait_until(lambda: new.get("/v1/models").status_code == 403, KEY_REFRESH_S + 5, "the key's 403")
        # refresh_s after the commit, no replica serves the key any more (1 s for clock slack).
        time.sleep(max(suspended_at + KEY_REFRESH_S + 1.0 - time.monotonic(), 0.0))
        assert all(new.get("/v1/models").status_code == 403 for _ in range(6)), "a replica still serves the key"


def admin_calls(tenant_id: str) -> list[tuple[str, str, dict]]:
    """Every /admin route of the ingress (loraplex/ingress/admin_routes.py, usage_routes.py,
    latency_routes.py, admin_adapter_routes.py, dedicated_routes.py; GET /admin/replicas where the server has it)."""
    period = datetime.now(timezone.utc).strftime("%Y-%m")
    return [
        ("GET", "/admin/tenants", {}), ("POST", "/admin/tenants", {"json": {"name": "sneaky"}}),
        ("GET", f"/admin/tenants/{tenant_id}", {}), ("PATCH", f"/admin/tenants/{tenant_id}", {"json": {"plan": "x"}}),
        ("POST", f"/admin/tenants/{tenant_id}/keys", {}), ("GET", f"/admin/tenants/{tenant_id}/keys", {}),
        ("DELETE", "/admin/keys/key_0", {}), ("GET", "/admin/usage", {}),
        ("GET", "/admin/billing/export", {"params": {"period": period}}),
        ("GET", f"/admin/tenants/{tenant_id}/statement", {"params": {"period": period}}),
        ("GET", "/admin/cost-model", {}), ("GET", "/admin/latency", {}), ("GET", "/admin/replicas", {}),
        ("GET", "/admin/dedicated", {}), ("PUT", f"/admin/tenants/{tenant_id}/adapters/any@1/dedicated", {}),
        ("DELETE", f"/admin/tenants/{tenant_id}/adapters/any@1/dedicated", {}),
        ("GET", "/admin/adapters", {}), ("POST", f"/admin/tenants/{tenant_id}/adapters/any@1/pin", {}),
        ("DELETE", f"/admin/tenants/{tenant_id}/adapters/any@1/pin", {}),
    ]


def test_a_tenant_key_opens_no_admin_page_and_no_admin_route(browser, base_url, admin):
    key = new_tenant_key(admin, "console-intruder")
    sign_in(browser, base_url, "admin.html", key)
    message = wait_until(lambda: by_css(browser, "#signin-message").text, WAIT_S, "the refusal")
    assert message.startswith("401") and "not an admin token" in message
    assert not by_css(browser, "#app").is_displayed()
    assert browser.execute_script("return sessionStorage.length") == 0  # a refused token is not kept
    tenant_id = admin.get("/admin/tenants").json()["data"][0]["id"]
    has_replicas = admin.get("/admin/replicas").status_code != 404
    with tenant_client(base_url, key) as intruder:
        for method, path, kwargs in admin_calls(tenant_id):
            if path == "/admin/replicas" and not has_replicas:
                continue
            status = intruder.request(method, path, **kwargs).status_code
            assert status in (401, 403), f"{method} {path} with a tenant key: {status}"
    assert [t["name"] for t in admin.get("/admin/tenants").json()["data"]].count("sneaky") == 0
