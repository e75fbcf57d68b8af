"""Rule parameters: each rule declares its allowed values once, and they are checked once, at the boundary.

A rule's ``parameter_constraints`` maps every constructor parameter to a :class:`Param` (scikit-learn's
``_parameter_constraints`` in spirit). :func:`check_params` runs when an audit builds its rules (run.toml's
``[detect.<rule>]`` tables, ``--set detect.<rule>.<param>=v``) and raises one :class:`~forensics.errors.ForensicsError`
naming the rule, the parameter and what is allowed, so a typo or a negative window never reaches a computation.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar


@dataclass(frozen=True)
class Param:
    """The values one parameter may take.

    ``kind``: ``"int"``, ``"real"`` (ints accepted), ``"bool"``, ``"str"`` or ``"any"``; ``low``/``high``: bounds
    (``low_open``/``high_open`` exclude them); ``none``: ``None`` is allowed too; ``choices``: the only values allowed.
    """

    kind: str = "real"
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    none: bool = False
    choices: tuple[Any, ...] | None = None

    def allows(self, value: Any) -> bool:
        if value is None:
            return self.none
        if self.choices is not None:
            return value in self.choices
        if self.kind == "any":
            return True
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "str":
            return isinstance(value, str)
        if isinstance(value, bool) or not isinstance(value, Integral if self.kind == "int" else Real):
            return False
        v = float(value)
        if math.isnan(v):
            return False
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            return False
        return not (self.high is not None and (v > self.high or (self.high_open and v == self.high)))

    def describe(self) -> str:
        if self.choices is not None:
            text = "one of " + ", ".join(map(repr, self.choices))
        elif self.kind in ("bool", "str", "any"):
            text = {"bool": "true or false", "str": "a string", "any": "any value"}[self.kind]
        else:
            text = "an integer" if self.kind == "int" else "a number"
            if self.low is not None:
                text += f" {'>' if self.low_open else '>='} {self.low:g}"
            if self.high is not None:
                text += f"{' and' if self.low is not None else ''} {'<' if self.high_open else '<='} {self.high:g}"
        return text + (", or none" if self.none else "")


def positive(kind: str = "real", none: bool = False) -> Param:
    """A number above 0."""
    return Param(kind, low=0, low_open=True, none=none)


def at_least(low: float, kind: str = "real", none: bool = False) -> Param:
    """A number at or above ``low``."""
    return Param(kind, low=low, none=none)


def fraction(none: bool = False) -> Param:
    """A share in (0, 1]."""
    return Param("real", low=0, low_open=True, high=1, none=none)


def check_params(owner: str, constraints: Mapping[str, Param], values: Mapping[str, Any]) -> None:
    """Raise a :class:`~forensics.errors.ForensicsError` for the first value its constraint does not allow.

    ``owner`` names where the parameter lives (``detect.spikes``); a parameter without a declared constraint takes
    any value (every built-in rule declares all of its own: a test holds them to it).
    """
    from forensics.errors import ForensicsError

    for name, value in values.items():
        if name in constraints and not constraints[name].allows(value):
            raise ForensicsError(f"{owner}: '{name}' must be {constraints[name].describe()}; got {value!r}")


class ParamsMixin:
    """Parameters declared once, scikit-learn style: the constructor's keyword arguments are the parameters (it only
    stores each under its own name), ``parameter_constraints`` says what each may be, and :meth:`validate` checks
    them together at the boundary. Every rule and every detector takes its parameters from here, so introspection,
    copying and the error message are written once.
    """

    parameter_constraints: ClassVar[Mapping[str, Param]] = {}

    @classmethod
    def parameter_defaults(cls) -> dict[str, Any]:
        """The parameters and their defaults (the constructor's keyword arguments, in signature order)."""
        sig = inspect.signature(cls.__init__)
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return {n: p.default for n, p in sig.parameters.items() if n != "self" and p.kind in kinds}

    def get_params(self) -> dict[str, Any]:
        """The parameters and their current values (what the constructor stored)."""
        return {name: getattr(self, name) for name in self.parameter_defaults()}

    def clone(self) -> Any:
        """A fresh object of the same class with the same parameters and no state."""
        return type(self)(**self.get_params())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.get_params().items())})"

    def param_owner(self) -> str:
        """How an error names where these parameters live (a rule: ``detect.<name>``)."""
        return type(self).__name__

    def validate(self) -> None:
        """Check every parameter against its declared constraint; one error naming the owner, the parameter and
        what is allowed. A class whose parameters also constrain each other extends this."""
        check_params(self.param_owner(), self.parameter_constraints, self.get_params())
