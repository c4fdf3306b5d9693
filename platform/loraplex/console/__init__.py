"""The web console: static HTML/JS modules the ingress serves at /console (no build step).

Every action in it is a call to a documented REST route (the CLI's), made by the browser with
the bearer token the user typed in, which stays in that tab's sessionStorage."""

from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"
