"""``probust estimate``: score a data set with estimators of p_robust into a resumable results folder.

    settings = probust.run.RunSettings(data="fashion-mnist", model="cnn.pt", sigmas=[0.1], out="results/")
    summary = probust.run.execute(probust.run.prepare(settings))
    df = probust.run.read_results("results/")

or all at once: ``df = probust.run_estimate(...)``; in memory, without a folder (a Dataset, a
DataLoader or tensors in, the same rows out): ``df = probust.score(model, data, sigma=0.1)``
(:mod:`~probust.run.score`). Modules: :mod:`~probust.run.settings` (the
arguments and their checks), :mod:`~probust.run.indices`, :mod:`~probust.run.sources` (data,
model, hashes), :mod:`~probust.run.folder` (claiming, resuming, extending a folder),
:mod:`~probust.run.work_units`, :mod:`~probust.run.methods` (what each method needs),
:mod:`~probust.run.noise_options` (the noise beyond isotropic Gaussian),
:mod:`~probust.run.store` (the results folder and its format), :mod:`~probust.run.results_config`
(``config.json`` read typed), :mod:`~probust.run.distributed` (torchrun).
:mod:`~probust.run.certify` is ``probust certify`` (Cohen et al.'s CERTIFY over a data set) on
the same folder, work-unit and torchrun machinery.
"""

from probust.run.certify import CertifySettings, execute_certify, prepare_certify, read_certified, run_certify
from probust.run.errors import ConfigError, ConfigMismatchError, TiedPredictionError
from probust.run.indices import parse_indices
from probust.run.memory_store import MemoryStore
from probust.run.methods import ADAPTIVE_METHODS, DEFAULT_METHODS, LINEARISED_MC_METHODS, P_FAIL_METHODS
from probust.run.model_source import hash_state_dict
from probust.run.prepare import prepare, run_estimate
from probust.run.prepared import PreparedRun, RunSummary, Task
from probust.run.reading import read_config, read_results
from probust.run.results_config import ResultsConfig, is_results_folder, read_results_config
from probust.run.score import score
from probust.run.settings import MMSE_SAMPLINGS, TARGETS, RunSettings
from probust.run.store import FORMAT, FORMAT_VERSION, ResultStore
from probust.run.work_units import execute

__all__ = [
    "ADAPTIVE_METHODS",
    "DEFAULT_METHODS",
    "FORMAT",
    "FORMAT_VERSION",
    "LINEARISED_MC_METHODS",
    "MMSE_SAMPLINGS",
    "P_FAIL_METHODS",
    "TARGETS",
    "CertifySettings",
    "ConfigError",
    "ConfigMismatchError",
    "MemoryStore",
    "ResultStore",
    "ResultsConfig",
    "PreparedRun",
    "RunSettings",
    "RunSummary",
    "Task",
    "TiedPredictionError",
    "execute",
    "execute_certify",
    "hash_state_dict",
    "is_results_folder",
    "parse_indices",
    "prepare",
    "prepare_certify",
    "read_certified",
    "read_config",
    "read_results",
    "read_results_config",
    "run_certify",
    "run_estimate",
    "score",
]
