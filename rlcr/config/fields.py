"""The building blocks of the config sections: each field carries whether it can change a run's results.

A field is declared with :func:`changes` (it can change a run's results: a resume must keep it) or
:func:`operational` (it cannot: where the run is stored, how long, how failures are retried, what is displayed;
a resume may change it). The marking lives on the field (``json_schema_extra={"results": …}``), next to its
docstring; :func:`rlcr.config.result_changing_diff`, ``rlcr config show`` and docs/configuration.md read it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

RESULTS_KEY = "results"
"""The key of a field's ``json_schema_extra`` that says whether it can change results."""


def changes(default: Any = ..., **kwargs: Any) -> Any:
    """A field that can change a run's results (a resume with another value is refused)."""
    return Field(default, json_schema_extra={RESULTS_KEY: True}, **kwargs)


def operational(default: Any = ..., **kwargs: Any) -> Any:
    """A field that cannot change a run's results (a resume may change it)."""
    return Field(default, json_schema_extra={RESULTS_KEY: False}, **kwargs)


def changes_results(field: FieldInfo) -> bool:
    """Whether ``field`` is marked as able to change results (:func:`changes`); a field without a marking is
    treated as result-changing (conservative; a test requires every field to carry one)."""
    extra = field.json_schema_extra
    return not isinstance(extra, dict) or extra.get(RESULTS_KEY, True) is not False


def is_marked(field: FieldInfo) -> bool:
    """Whether ``field`` carries an explicit results marking."""
    return isinstance(field.json_schema_extra, dict) and RESULTS_KEY in field.json_schema_extra


class Section(BaseModel):
    """One section of :class:`rlcr.config.RLCRConfig`: unknown fields are refused, floats must be finite, every
    field is documented by the docstring under it."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True,
                              allow_inf_nan=False)
