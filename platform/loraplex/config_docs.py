"""docs/config.md, generated from PlatformConfig's fields: `python -m loraplex.config_docs > docs/config.md`.

Walks the models through pydantic's `model_fields` (never by module path, so a model may move
between files): one section per model, at the first place it is reached, with a table of field,
type, default and description. tests/unit/test_config_docs.py fails when the committed file differs."""
import inspect
import json
import re
import typing
from typing import Any, Literal, Union

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from loraplex.config import PlatformConfig

COMMAND = "python -m loraplex.config_docs > docs/config.md"
HEADER = f"""# Configuration reference

The `args:` block of a serve config (`serve_config*.yaml`) is `PlatformConfig`; unknown keys are
refused. Generated from the models' field descriptions by `{COMMAND}`: do not edit by hand.
Replica counts and other Ray Serve deployment options go in the application's `deployments:` list
(`name: Engine`, `name: Ingress`); `args` changes redeploy every replica.
"""


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation names, inside Optional, list, dict, ... too."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _sections(root: type[BaseModel]) -> dict[type[BaseModel], str]:
    """Each model -> the dotted path where it is first reached, depth first in field order."""
    paths: dict[type[BaseModel], str] = {root: ""}

    def walk(model: type[BaseModel], path: str) -> None:
        for name, field in model.model_fields.items():
            origin = typing.get_origin(field.annotation)
            if origin is Union:
                origin = next((typing.get_origin(a) for a in typing.get_args(field.annotation)
                               if typing.get_origin(a)), None)
            step = f"{path}.{name}" if path else name
            step += "[]" if origin is list else ".<name>" if origin is dict else ""
            for sub in _models(field.annotation):
                if sub not in paths:
                    paths[sub] = step
                    walk(sub, step)

    walk(root, "")
    return paths


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _title(path: str, model: type[BaseModel]) -> str:
    return f"{path or 'top level'} ({model.__name__})"


def _type(annotation: Any, links: dict[type[BaseModel], str]) -> str:
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{links[annotation]})"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Union:
        return " or ".join(_type(a, links) for a in args)
    if origin is Literal:
        return " or ".join(f"`{json.dumps(a)}`" for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type(a, links) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(its section)"
    if value is PydanticUndefined:
        return ""
    text = json.dumps(value, default=lambda v: v.model_dump(mode="json") if isinstance(v, BaseModel) else str(v))
    return f"`{text}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(root: type[BaseModel] = PlatformConfig) -> str:
    paths = _sections(root)
    links = {m: _anchor(_title(p, m)) for m, p in paths.items()}
    out = [HEADER, "| section | model |", "|---|---|"]
    out += [f"| `{p or '(top level)'}` | [{m.__name__}](#{links[m]}) |" for m, p in paths.items()]
    for model, path in paths.items():
        out += ["", f"## {_title(path, model)}", ""]
        if model.__doc__:
            out += [" ".join(inspect.cleandoc(model.__doc__).split()), ""]
        out += ["| field | type | default | description |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            subs = _models(field.annotation)
            about = field.description or (inspect.cleandoc(subs[0].__doc__ or "") if subs else "")
            out.append(f"| `{name}` | {_cell(_type(field.annotation, links))} | {_cell(_default(field))} | "
                       f"{_cell(about)} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
