"""One configuration model for every knob of an RLCR run, in sections (``rollout.temperature``).

Each field is documented where it is defined (the docstring under it) and marked on the field as able to change
a run's results or operational (:mod:`rlcr.config.fields`); docs/configuration.md is generated from them
(``python -m rlcr.config.docs``). Load with :meth:`RLCRConfig.from_yaml`, which applies ``section.field=value``
overrides and turns any validation failure into a :class:`ConfigError` that names the field. Every float field
must be finite (NaN and ±inf are refused).

On resume, :func:`result_changing_diff` tells which settings differ from the run's saved ones *and* can change
its results. Runs stored in the flat layout of older rlcr are read by :mod:`rlcr.config.legacy`.
"""

from rlcr.config.fields import changes_results
from rlcr.config.legacy import FLAT_NAMES, nested_from_flat
from rlcr.config.loading import MAX_CONFIG_BYTES, MAX_OVERRIDE_CHARS, ConfigError, safe_yaml
from rlcr.config.model import RLCRConfig, load_config, resolve_config, result_changing_diff
from rlcr.config.sections import MAX_SEED

__all__ = ["RLCRConfig", "ConfigError", "load_config", "resolve_config", "result_changing_diff", "changes_results",
           "MAX_SEED", "MAX_CONFIG_BYTES", "MAX_OVERRIDE_CHARS", "FLAT_NAMES", "nested_from_flat", "safe_yaml"]
