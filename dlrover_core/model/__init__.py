"""Resource-performance model: throughput (PS and all-reduce) and memory; fit/predict contract.

Pure: inputs in, estimates out (``samples_io`` is the one module that reads and writes files).
"""

from dlrover_core.model.memory import (
    IdGrowthModel,
    OOMPrediction,
    PSMemoryModel,
    WorkerMemoryModel,
)
from dlrover_core.model.samples_io import (
    CONFIG_COLUMNS,
    OPTIONAL_COLUMNS,
    PREDICTION_COLUMN,
    REQUIRED_COLUMNS,
    predictions_to_csv,
    read_configs_csv,
    read_samples_csv,
    samples_to_csv,
    write_predictions_csv,
    write_samples_csv,
)
from dlrover_core.model.throughput import (
    AllReduceThroughputModel,
    PSExtendedThroughputModel,
    PSOverlapThroughputModel,
    PSThroughputModel,
    ThroughputModel,
    ThroughputPrediction,
    fit_throughput_model,
    model_from_dict,
)

__all__ = [
    "CONFIG_COLUMNS",
    "OPTIONAL_COLUMNS",
    "PREDICTION_COLUMN",
    "REQUIRED_COLUMNS",
    "AllReduceThroughputModel",
    "IdGrowthModel",
    "OOMPrediction",
    "PSExtendedThroughputModel",
    "PSMemoryModel",
    "PSOverlapThroughputModel",
    "PSThroughputModel",
    "ThroughputModel",
    "ThroughputPrediction",
    "WorkerMemoryModel",
    "fit_throughput_model",
    "model_from_dict",
    "predictions_to_csv",
    "read_configs_csv",
    "read_samples_csv",
    "samples_to_csv",
    "write_predictions_csv",
    "write_samples_csv",
]
