"""Plain renderers shared by reports, statements and exports."""
import csv
import io


def csv_text(header: list[str], rows: list[list]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def text_table(header: list[str], rows: list[list], footer: list | None = None) -> str:
    """Fixed-width table for the CLI: text left-aligned, numbers right-aligned."""
    body = [[str(c) for c in r] for r in rows]
    foot = [str(c) for c in footer] if footer else None
    widths = [max(len(x) for x in col) for col in zip(header, *body, *([foot] if foot else []))]
    numeric = [i > 0 and all(_is_number(r[i]) for r in body) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric)).rstrip()

    sep = "  ".join("-" * w for w in widths)
    out = [line(header), sep, *(line(r) for r in body)]
    if foot:
        out += [sep, line(foot)]
    return "\n".join(out) + "\n"


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False
