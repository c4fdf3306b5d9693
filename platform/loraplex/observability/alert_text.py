"""Expand an alert annotation as Prometheus does, for the few template forms rules.py uses
({{ $value }}, {{ $value | humanizePercentage }}, {{ $value | humanizeDuration }},
{{ $labels.x }}): rule_tests.py states the exact text an alert must carry."""
import re

_FIELD = re.compile(r"\{\{ \$(value|labels\.(\w+))(?: \| (\w+))? \}\}")


def expand(template: str, value: float, labels: dict[str, str]) -> str:
    def field(m: re.Match) -> str:
        if m.group(2):
            return labels[m.group(2)]
        return {None: _plain, "humanizePercentage": _percentage, "humanizeDuration": _duration}[m.group(3)](value)
    return _FIELD.sub(field, template)


def _plain(v: float) -> str:  # Go's %v of a float64
    return str(int(v)) if v == int(v) else repr(v)


def _percentage(v: float) -> str:
    return f"{v * 100:.4g}%"


def _duration(v: float) -> str:
    if v == 0:
        return "0s"
    if abs(v) >= 1:
        sign, v = ("-", -v) if v < 0 else ("", v)
        s = int(v)
        days, hours, minutes, seconds = s // 86400, s // 3600 % 24, s // 60 % 60, s % 60
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{v:.4g}s"
    prefix = ""
    for p in ("m", "u", "n", "p"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return f"{v:.4g}{prefix}s"
