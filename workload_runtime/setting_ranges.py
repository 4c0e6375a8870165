"""Settings a person types (a launchpad's steps, batch size, mask fraction, folds, ...).

Pydantic reports an out-of-range number by the one bound it broke ("Input should be less
than 1"). A setting built on `RangedSettings` says instead which setting, the value given,
and the whole range it must lie in, with the setting's own description:

    mask_fraction = 1.5 is out of range: it must be more than 0 and less than 1 (Share of
    each cell's genes hidden and predicted back). Set a value in that range.

The error is still a pydantic ValidationError located at the field, so code that reads
`errors()` (the workload's start-up check, the launchpad) keeps working.
"""

from __future__ import annotations

from typing import Any

import annotated_types as at
from pydantic import (
    BaseModel,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

BOUND_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")
_WORDS = ((at.Ge, "ge", "at least"), (at.Gt, "gt", "more than"), (at.Le, "le", "at most"), (at.Lt, "lt", "less than"))


def allowed_range(field: FieldInfo) -> str:
    """'more than 0 and less than 1', from the bounds declared on the field ('' if none)."""
    parts = []
    for constraint in field.metadata:
        for kind, attr, words in _WORDS:
            if isinstance(constraint, kind):
                parts.append(f"{words} {getattr(constraint, attr)}")
    return " and ".join(parts)


def out_of_range_message(name: str, value: Any, field: FieldInfo) -> str:
    what = f" ({field.description.rstrip('.')})" if field.description else ""
    return f"{name} = {value!r} is out of range: it must be {allowed_range(field)}{what}. Set a value in that range."


class RangedSettings(BaseModel):
    """Base of the settings models a person fills in: out-of-range values name their whole range."""

    @field_validator("*", mode="wrap")
    @classmethod
    def _name_the_range(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            field = cls.model_fields.get(info.field_name or "")
            if field is None or not allowed_range(field) or not any(e["type"] in BOUND_ERRORS for e in exc.errors()):
                raise
            raise PydanticCustomError("out_of_range", out_of_range_message(info.field_name, value, field)) from None
