"""The console's static files: served by the ingress at /console with no token and locked-down
headers, in the wheel, and the vendored Chart.js is the file its README pins."""

import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ingress"))
from platform_app import build_platform_app  # noqa: E402

from loraplex.console import STATIC_DIR  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
VENDOR = STATIC_DIR / "vendor"


@pytest.fixture
def client(tmp_path):
    platform = build_platform_app(tmp_path, lambda *a: iter(()))
    yield TestClient(platform.app, raise_server_exceptions=False)
    platform.close()


def test_vendored_chart_js_is_the_pinned_file_with_its_license():
    readme = (VENDOR / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `chart.umd.min.js`"))
    version, sha256 = re.search(r"\| ([\d.]+) \| MIT.*`([0-9a-f]{64})`", row).groups()
    data = (VENDOR / "chart.umd.min.js").read_bytes()
    assert hashlib.sha256(data).hexdigest() == sha256
    assert f"Chart.js v{version}".encode() in data[:200]
    assert "MIT License" in (VENDOR / "chart.js.LICENSE.md").read_text()


def test_console_is_served_without_a_token_and_with_locked_down_headers(client):
    page = client.get("/console/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "Sign in with your API key" in page.text
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["referrer-policy"] == "no-referrer"
    admin = client.get("/console/admin.html")
    assert admin.status_code == 200 and "Sign in with the admin token" in admin.text
    assert client.get("/console", follow_redirects=False).status_code in (301, 302, 307, 308)
    chart = client.get("/console/vendor/chart.umd.min.js")
    assert chart.status_code == 200 and chart.content == (VENDOR / "chart.umd.min.js").read_bytes()
    missing = client.get("/console/nope.js")
    assert missing.status_code == 404 and missing.json()["error"]["message"]
    assert client.get("/console/../config.py").status_code == 404


def test_pages_load_only_their_own_files():
    # The CSP allows only 'self'; a page that reached for a CDN would break offline, so none does.
    for page in STATIC_DIR.glob("*.html"):
        refs = re.findall(r'(?:src|href)="([^"]+)"', page.read_text())
        assert refs and all(not re.match(r"^[a-z]+://|^//", ref) for ref in refs), (page.name, refs)
        for ref in refs:
            if not ref.startswith(("#", "data:")) and ref != "./":
                assert (STATIC_DIR / ref).is_file(), f"{page.name} links {ref}, which is not in the package"
    for script in STATIC_DIR.glob("*.js"):
        for imported in re.findall(r'from "\./([^"]+)"', script.read_text()):
            assert (STATIC_DIR / imported).is_file(), f"{script.name} imports {imported}"


def test_the_wheel_carries_every_console_file(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True, timeout=240)
    [wheel] = tmp_path.glob("loraplex-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"loraplex/console/{p.relative_to(STATIC_DIR.parent)}" for p in STATIC_DIR.rglob("*") if p.is_file()}
    assert wanted and wanted <= names, sorted(wanted - names)
