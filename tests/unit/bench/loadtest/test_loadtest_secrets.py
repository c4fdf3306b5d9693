"""No secret in a load-test artifact: the command line recorded in results.json / summary.md
has --admin-token and --api-key values redacted, and every known secret value (the admin
token, tenant keys given or made, a started platform's token) is scrubbed from what is written."""
import shlex

from bench.loadtest.cli import REDACTED, redacted_argv, scrub


def test_the_recorded_command_has_no_token_or_key():
    argv = ["--url", "http://x", "--admin-token", "adm-SECRET", "--api-key=lpx-KEY1", "--api-key", "lpx-KEY2",
            "--concurrency", "4"]
    command = shlex.join(redacted_argv(argv))
    for secret in ("adm-SECRET", "lpx-KEY1", "lpx-KEY2"):
        assert secret not in command
    assert command == (f"--url http://x --admin-token '{REDACTED}' '--api-key={REDACTED}' --api-key '{REDACTED}' "
                       "--concurrency 4")


def test_scrub_replaces_every_known_secret_wherever_it_is():
    text = '{"command": "x --admin-token adm-SECRET", "warning": "key lpx-KEY1 refused", "n": 3}'
    out = scrub(text, ["adm-SECRET", None, "lpx-KEY1", ""])
    assert "adm-SECRET" not in out and "lpx-KEY1" not in out and '"n": 3' in out
    assert scrub("lpx-KEY1-long", ["lpx-KEY1", "lpx-KEY1-long"]) == REDACTED  # the longer first
