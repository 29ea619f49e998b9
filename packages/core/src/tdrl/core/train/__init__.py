"""Training utilities and the run harness every app uses: documented config dataclasses on
Hydra's command line (:mod:`.config`), the run folder with its loggers, cadence, checkpoints
and exact resume (:class:`Run`), rank-0-only writes under ``torch.distributed``, plots and
evaluation episodes; seeds trained as one vectorised model (:mod:`.seeds`)."""

from __future__ import annotations

from tdrl.core.train.checkpoint import (
    Checkpointer,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from tdrl.core.train.config import (
    NOT_A_SETTING,
    SWEEP_FILE,
    ConfigError,
    RunConfig,
    append_sweep_line,
    check_device,
    config_help,
    field_docs,
    hydra_app,
    load_config,
    read_sweep,
)
from tdrl.core.train.distributed import (
    broadcast_object,
    init_from_env,
    is_main_process,
    main_process_first,
    rank_and_world,
)
from tdrl.core.train.evaluation import episode_returns, evaluate_episodes, evaluate_per_env
from tdrl.core.train.history import MetricHistory, truncate_csv
from tdrl.core.train.loggers import CSVLogger, Logger, TensorboardLogger, WandbLogger, generate_exp_name, get_logger
from tdrl.core.train.plots import plot_curves
from tdrl.core.train.progress import ProgressBar
from tdrl.core.train.rl import EnvRunConfig, OffPolicyConfig, OffPolicyLog, UpdateBudget, finish_env_run, mean_metrics
from tdrl.core.train.run import Run, changed_settings, crossed, run_folder
from tdrl.core.train import seeds
from tdrl.core.train.seeds import *  # noqa: F403  (the names of seeds.__all__, listed once there)
from tdrl.core.train.state import GeneratorState, StateBox
from tdrl.core.train.timing import get_available_device, timeit

__all__ = [
    "Run",
    "get_available_device",
    "timeit",
    "OffPolicyLog",
    "RunConfig",
    "EnvRunConfig",
    "OffPolicyConfig",
    "UpdateBudget",
    "GeneratorState",
    "StateBox",
    "mean_metrics",
    "finish_env_run",
    "ConfigError",
    "NOT_A_SETTING",
    "SWEEP_FILE",
    "append_sweep_line",
    "read_sweep",
    "changed_settings",
    "check_device",
    "hydra_app",
    "load_config",
    "field_docs",
    "config_help",
    "crossed",
    "run_folder",
    "plot_curves",
    "evaluate_episodes",
    "evaluate_per_env",
    *seeds.__all__,
    "episode_returns",
    "init_from_env",
    "is_main_process",
    "rank_and_world",
    "broadcast_object",
    "main_process_first",
    "Logger",
    "CSVLogger",
    "get_logger",
    "generate_exp_name",
    "TensorboardLogger",
    "WandbLogger",
    "ProgressBar",
    "Checkpointer",
    "save_checkpoint",
    "load_checkpoint",
    "rng_state",
    "set_rng_state",
    "MetricHistory",
    "truncate_csv",
]
