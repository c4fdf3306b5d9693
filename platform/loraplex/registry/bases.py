"""Which base model an uploaded adapter is bound to, and the validator of each base.

An adapter only runs on the base it was trained on: its tensors' shapes are that base's, and even
where two bases share shapes (a quantized build of the same model) its weights were fitted to one.
So every version is bound to one base at upload, in this order: the upload's explicit `base_model`
field; else the base the archive's `base_model_name_or_path` names (a base's name, its model dir or
HF id, or the last part of either: trainers write paths of their own disk); else the base of the
name's earlier versions; else, with one base, that one. With several bases and none of these, the
upload is refused with the bases to choose from: a guess by shapes alone would bind a shared-shape
adapter to whichever base came first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Optional

from loraplex.errors import StatusError
from loraplex.registry.validator import AdapterValidator


class UnknownBase(StatusError):
    """An upload names a base model the platform does not serve (400)."""

    status = 400


class BaseMismatch(StatusError):
    """A name's new version is bound to another base than its earlier ones (409)."""

    status = 409


@dataclass(frozen=True)
class ServedBase:
    name: str  # what clients send as `model`
    model: str  # the engine's model dir or HF id
    validator: AdapterValidator

    def is_named_by(self, claim: str) -> bool:
        """The adapter's `base_model_name_or_path` names this base (its name, dir or HF id, or their
        last path part)."""
        claim = claim.strip().rstrip("/")
        if not claim:
            return False
        tail = PurePosixPath(claim).name
        ours = {self.name, self.model.rstrip("/"), PurePosixPath(self.name).name, PurePosixPath(self.model).name}
        return claim in ours or tail in ours


class ServedBases:
    """The platform's base models, the first (the default) first."""

    def __init__(self, bases: list[ServedBase]):
        if not bases:
            raise ValueError("at least one base model")
        self.bases = {b.name: b for b in bases}

    @classmethod
    def one(cls, validator: AdapterValidator, model: str = "") -> "ServedBases":
        """A single base, named as its validator's spec."""
        return cls([ServedBase(validator.base.model_id, model or validator.base.model_id, validator)])

    @property
    def names(self) -> list[str]:
        return list(self.bases)

    @property
    def default(self) -> ServedBase:
        return next(iter(self.bases.values()))

    def named(self, name: str) -> ServedBase:
        base = self.bases.get(name)
        if base is None:
            raise UnknownBase(f"`base_model` {name!r} is not a base model of this platform; the bases are "
                              f"{', '.join(self.names)} (GET /v1/models lists them).", param="base_model")
        return base

    def named_by(self, claim: Optional[str]) -> Optional[ServedBase]:
        """The base an adapter's base_model_name_or_path names (the one it was trained on), if any."""
        return next((b for b in self.bases.values() if claim and b.is_named_by(claim)), None)

    def choose(self, explicit: Optional[str], claim: Optional[str], earlier: Optional[str], name: str) -> ServedBase:
        """The base a new version of `name` is bound to (see the module docstring). `earlier`: the
        base of the name's live versions, if it has any; a version may not move to another base."""
        if explicit:
            base = self.named(explicit)
        elif claim and (named := [b for b in self.bases.values() if b.is_named_by(claim)]):
            base = named[0]
        elif earlier is not None and earlier in self.bases:
            base = self.bases[earlier]
        elif len(self.bases) == 1:
            base = self.default
        else:
            said = f"its adapter_config.json says base_model_name_or_path={claim!r}, which names none of them" \
                if claim else "its adapter_config.json names no base_model_name_or_path"
            raise UnknownBase(f"Say which base model `{name}` was trained on: {said}. Send the form field "
                              f"`base_model` with one of {', '.join(self.names)}.", param="base_model")
        if earlier is not None and earlier != base.name:
            raise BaseMismatch(f"The adapter `{name}` is bound to the base model {earlier}: its versions all run "
                               f"on one base, and this upload is for {base.name}. Upload it under another name, "
                               f"or delete `{name}` first.", param="base_model")
        return base
