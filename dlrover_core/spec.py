"""The one validated input: a job spec, from YAML or JSON, with ``--set`` overrides.

Quantities are typed the Kubernetes way ("4Gi", "500m", 2) and stored with their unit in the
name (``cpu_millicores``, ``memory_mib``). As in Kubernetes, a bare memory number is bytes
(``2147483648`` is 2 GiB) and a bare CPU number cores. Every field is honoured by the runtime or
rejected here: models other than DLRM, ``training.steps`` and settings that do not apply to the
data source are refused with one line saying what to do; numbers must be finite and sizes
stay under named upper bounds (:data:`LIMITS`). Every validation problem becomes one line naming the
field and the fix; :func:`load_spec` raises a single :class:`SpecError` holding all of them.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dlrover_core.errors import InputError, SpecError
from dlrover_core.types import NodeResources
from dlrover_core.units import cpu_millicores, format_cpu, format_memory, memory_quantity_mib

LIMITS = {
    "rows": 2**40,  # synthetic held-out rows start at 2**40
    "eval_rows": 5_000_000,  # held out in one process's memory
    "shards": 10_000_000,  # rows x epochs / shard size: one shards.db row each
    "batch_size": 1 << 20,
    "epochs": 10_000,
    "num_embeddings": 2**63 - 1,  # int64 ids
    "embedding_dim": 4096,
    "dense_features": 4096,
    "tables": 1024,
    "layer_width": 65_536,
    "layers": 64,
}
"""Upper bounds on sizes (a spec beyond them is rejected at validation, naming the bound)."""


def _cpu(v: Any) -> Any:
    if v is None:  # a bool is not a quantity: cpu_millicores says so (pydantic would take 1)
        return v
    try:
        return cpu_millicores(v)
    except InputError as e:
        raise ValueError(e.message) from None


def _mem(v: Any) -> Any:
    if v is None:
        return v
    try:
        return memory_quantity_mib(v)  # Kubernetes semantics: a bare number is bytes
    except InputError as e:
        raise ValueError(e.message) from None


# JSON dumps write CPU as a quantity ("10", "1500m"): a bare number would read back as cores.
Millicores = Annotated[
    int,
    BeforeValidator(_cpu),
    Field(ge=0),
    PlainSerializer(format_cpu, return_type=str, when_used="json"),
]
# ... and memory as a quantity ("6Gi", "1536Mi"): a bare number would read back as bytes.
MiB = Annotated[
    int,
    BeforeValidator(_mem),
    Field(ge=0),
    PlainSerializer(format_memory, return_type=str, when_used="json"),
]


def _numeric_only(annotation: Any) -> bool:
    """Whether a field's type takes numbers (int or float) and no boolean (an ``Annotated``
    type has validators of its own, which say more)."""
    import typing

    if typing.get_origin(annotation) is Annotated:
        return False
    args = typing.get_args(annotation)
    kinds = {k for k in (args or (annotation,)) if k is not type(None)}
    return bool(kinds & {int, float}) and bool not in kinds


class _Strict(BaseModel):
    # allow_inf_nan=False: `lr: .inf` or a NaN pacing interval is an error, not a silent run
    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, frozen=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        """``epochs: true`` is a mistake, not 1: a boolean where the field takes a number
        (and no boolean) is refused."""
        f = cls.model_fields.get(info.field_name or "")
        own = f is not None and any(isinstance(m, BeforeValidator) for m in f.metadata)
        if isinstance(v, bool) and f is not None and not own and _numeric_only(f.annotation):
            raise ValueError(f"must be a number, not {str(v).lower()}")
        return v


class Architecture(StrEnum):
    DLRM = "dlrm"
    DCN = "dcn"
    DEEPFM = "deepfm"
    WIDE_DEEP = "wide_deep"


IMPLEMENTED_ARCHITECTURES = frozenset({Architecture.DLRM})
"""What the runtime can build and train; the others are named so the error can say so."""


class EmbeddingTable(_Strict):
    name: str = Field(min_length=1)
    num_embeddings: int | Literal["dynamic"] = Field(
        description="rows, or 'dynamic' for a table that grows as new IDs arrive"
    )
    embedding_dim: int | None = Field(
        default=None, gt=0, le=LIMITS["embedding_dim"], description="defaults to model's"
    )

    @field_validator("num_embeddings", mode="before")
    @classmethod
    def _rows_or_dynamic(cls, v: Any) -> Any:
        # one message for a bad value (the union alone would report one per member)
        if v == "dynamic" or (isinstance(v, int) and not isinstance(v, bool)):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, str) and v.strip().isdigit():
            return int(v)
        raise ValueError(f"must be a positive number of rows, or 'dynamic'; got {v!r}")

    @field_validator("num_embeddings")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v <= 0:
            raise ValueError("must be a positive number of rows, or 'dynamic'")
        if isinstance(v, int) and v > LIMITS["num_embeddings"]:
            raise ValueError(
                f"{v} rows is more than ids can address (at most 2^63 - 1); lower it, or use "
                "'dynamic' for a table that grows with the ids it sees"
            )
        return v


Width = Annotated[int, Field(gt=0, le=LIMITS["layer_width"])]


class ModelSpec(_Strict):
    architecture: Architecture = Architecture.DLRM
    embedding_dim: int = Field(default=16, gt=0, le=LIMITS["embedding_dim"])
    dense_features: int = Field(default=13, ge=0, le=LIMITS["dense_features"])
    embedding_tables: tuple[EmbeddingTable, ...]
    dense_arch: tuple[Width, ...] = Field(default=(64, 16), max_length=LIMITS["layers"])
    over_arch: tuple[Width, ...] = Field(default=(64, 1), max_length=LIMITS["layers"])

    @field_validator("architecture")
    @classmethod
    def _implemented(cls, v: Architecture) -> Architecture:
        if v not in IMPLEMENTED_ARCHITECTURES:
            raise ValueError(
                f"{v.value!r} is not implemented by the runtime (only "
                f"{', '.join(sorted(a.value for a in IMPLEMENTED_ARCHITECTURES))}); use "
                "architecture: dlrm"
            )
        return v

    @field_validator("embedding_tables")
    @classmethod
    def _some_tables(cls, v: tuple[EmbeddingTable, ...]) -> tuple[EmbeddingTable, ...]:
        # not Field(min_length=1): that also fires when the only table is invalid
        if not v:
            raise ValueError("needs at least 1 embedding table; add one under embedding_tables")
        if len(v) > LIMITS["tables"]:
            raise ValueError(f"has {len(v)} tables; at most {LIMITS['tables']} are supported")
        return v

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        names = [t.name for t in self.embedding_tables]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"embedding table names must be unique; repeated: {', '.join(dup)}")
        if not self.dense_arch or self.dense_arch[-1] != self.embedding_dim:
            raise ValueError(
                f"dense_arch must end in embedding_dim ({self.embedding_dim}) so dense and sparse "
                f"features can interact; got {list(self.dense_arch)}"
            )
        # what DLRM (the one implemented architecture) needs, checked here, not at worker start
        if self.dense_features <= 0:
            raise ValueError("dense_features must be positive (DLRM's bottom MLP needs input)")
        if len(self.over_arch) < 2 or self.over_arch[-1] != 1:
            raise ValueError(
                f"over_arch must have at least 2 layers and end in 1 (the logit); got "
                f"{list(self.over_arch)}"
            )
        odd = [t.name for t in self.embedding_tables if self.table_dim(t) != self.embedding_dim]
        if odd:
            raise ValueError(
                f"DLRM needs every table at embedding_dim {self.embedding_dim}; remove "
                f"embedding_dim from table(s) {', '.join(odd)}"
            )
        return self

    def table_dim(self, t: EmbeddingTable) -> int:
        return t.embedding_dim or self.embedding_dim

    @property
    def dense_params(self) -> int:
        """Parameters of the dense (MLP) part, the way DLRM wires it."""
        n = 0
        prev = self.dense_features
        for h in self.dense_arch:
            n += prev * h + h
            prev = h
        k = len(self.embedding_tables) + 1
        prev = self.embedding_dim + k * (k - 1) // 2
        for h in self.over_arch:
            n += prev * h + h
            prev = h
        return n


class IdDistribution(_Strict):
    kind: Literal["zipf", "uniform"] = "zipf"
    alpha: float = Field(default=1.1, gt=0)
    new_id_rate: float = Field(default=0.01, ge=0, le=1, description="fraction of fresh IDs")


FILE_SOURCES = ("criteo_tsv", "parquet")


class DataSpec(_Strict):
    source: Literal["synthetic", "criteo_tsv", "parquet"] = "synthetic"
    path: str | None = Field(
        default=None, description="a local path or an fsspec URL (s3://, gs://, ...)"
    )
    rows: int = Field(
        default=100_000,
        gt=0,
        le=LIMITS["rows"],
        description="synthetic: rows generated; a file source: at most this many training rows",
    )
    eval_rows: int = Field(default=10_000, ge=0, le=LIMITS["eval_rows"])
    ids: IdDistribution = IdDistribution()
    shard_batches: int = Field(default=10, gt=0, le=1_000_000, description="batches per data shard")
    seed: int = Field(default=0, ge=0, lt=2**62)
    snapshot: bool = Field(
        default=False,
        description="a file source: copy the inputs into the run directory when the job starts "
        "and train on the copy (else a change to an input fails the job)",
    )

    @model_validator(mode="after")
    def _check(self) -> DataSpec:
        if self.source in FILE_SOURCES:
            what = (
                "a Criteo-format TSV file"
                if self.source == "criteo_tsv"
                else ("a Parquet file or folder")
            )
            if not self.path:
                raise ValueError(f"source {self.source!r} needs data.path ({what})")
            _check_data_path(self.path, what)
            ignored = sorted(set(SYNTHETIC_ONLY) & self.model_fields_set)
            if ignored:
                raise ValueError(
                    f"data.{', data.'.join(ignored)} only apply to source 'synthetic' (a file's "
                    f"records are what they are); remove {'them' if len(ignored) > 1 else 'it'}"
                )
        elif self.path is not None:
            raise ValueError(
                "data.path is read only by sources criteo_tsv and parquet; set data.source, or "
                "remove data.path"
            )
        elif self.snapshot:
            raise ValueError(
                "data.snapshot copies input files; source 'synthetic' has none: remove it"
            )
        return self


def _check_data_path(path: str, what: str) -> None:
    """A local path must exist; a URL must name a protocol fsspec can open (not fetched here:
    the job checks the data when it starts)."""
    head, sep, _ = path.partition("://")
    if sep and head not in ("file", "local"):
        try:
            import fsspec
        except ImportError:
            raise ValueError(
                f"data.path {_redact(path)!r} is a URL; reading URLs needs fsspec (install "
                "dlrover-rm[data])"
            ) from None
        try:
            fsspec.get_filesystem_class(head)
        except (ValueError, ImportError) as e:
            raise ValueError(
                f"data.path {_redact(path)!r}: protocol {head!r} cannot be opened ({e}); use a "
                "local path, or install its fsspec backend (s3fs for s3://, gcsfs for gs://)"
            ) from None
        return
    local = os.path.expanduser(path.removeprefix("file://"))
    if not Path(local).exists():
        raise ValueError(
            f"data.path {path!r} does not exist; give an existing {what} (or an fsspec URL), "
            "or use source 'synthetic'"
        )


def _redact(url: str) -> str:
    from dlrover_core.history.redact import redact_url

    return redact_url(url)


class OptimizerSpec(_Strict):
    name: Literal["adagrad", "sgd", "adam"] = "adagrad"
    lr: float = Field(default=0.05, gt=0)

    @property
    def slots(self) -> int:
        """Optimizer state per parameter (PS memory multiplier)."""
        return {"sgd": 0, "adagrad": 1, "adam": 2}[self.name]


class TrainingSpec(_Strict):
    batch_size: int = Field(default=512, gt=0, le=LIMITS["batch_size"])
    epochs: int | None = Field(default=1, gt=0, le=LIMITS["epochs"])
    steps: int | None = Field(
        default=None, gt=0, description="not supported: the runtime trains whole epochs"
    )
    optimizer: OptimizerSpec = OptimizerSpec()
    # PS data plane: a step's rows are read `staleness` steps ahead of it (prefetch, 0: none)
    staleness: int = Field(default=1, ge=0, le=8, description="PS prefetch depth in steps")
    transfer: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32", description="precision of embedding rows and gradients on the wire"
    )
    seed: int | None = Field(
        default=None,
        ge=0,
        le=2**32 - 1,
        description="seed of the dense parameters' initial values (null: a random start)",
    )
    init_from: str | None = Field(
        default=None,
        description="start from an earlier run's exported model (a model directory or an "
        "fsspec URL of one: model.pt + model_card.json), PS or all-reduce alike; ids it never "
        "saw start fresh, the optimizer state starts afresh",
    )
    threads: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="compute threads of each worker or rank (torch intra-op, OMP, MKL); null: "
        "the node's whole cores (1.5 CPU: 1). Small models often train fastest on 1",
    )
    # the first `dense_warmup` updates of a dense parameter (PS) or steps of a fresh group
    # (all-reduce) ramp its lr up linearly (Adagrad's first steps are lr·sign(g) on every
    # weight; without it they switch the bottom MLP's ReLU outputs off for good in a few runs
    # in a hundred: docs/decisions.md)
    dense_warmup: int = Field(
        default=100,
        ge=0,
        le=1_000_000,
        description="dense updates (PS, adagrad/adam) or steps of a fresh all-reduce group "
        "over which the dense lr ramps up linearly (0: none)",
    )

    @field_validator("steps")
    @classmethod
    def _no_steps(cls, v: int | None) -> int | None:
        if v is not None:
            raise ValueError(
                "is not supported: the runtime trains whole epochs over the data's rows; use "
                "training.epochs (and data.rows for synthetic data) instead"
            )
        return v


class RoleConstraints(_Strict):
    """Bounds and pins for one role. A pinned value (count/cpu/memory) is never changed."""

    min: int = Field(default=1, ge=0)
    max: int = Field(default=64, ge=1)
    count: int | None = Field(default=None, ge=0, description="pin the node count")
    cpu_millicores: Millicores | None = Field(default=None, alias="cpu", description="pin CPU")
    memory_mib: MiB | None = Field(default=None, alias="memory", description="pin memory")
    max_cpu_millicores: Millicores = Field(default=32_000, alias="max_cpu")
    max_memory_mib: MiB = Field(default=65_536, alias="max_memory")

    @model_validator(mode="after")
    def _check(self) -> RoleConstraints:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is larger than max ({self.max}); swap them")
        if self.count is not None and not self.min <= self.count <= self.max:
            raise ValueError(f"count {self.count} is outside [min, max] = [{self.min}, {self.max}]")
        return self


class PSConstraints(RoleConstraints):
    """PS bounds: at most 15 PS unless the spec says otherwise (DLRover's cap), also when
    the spec gives a ``ps:`` section without ``max``."""

    max: int = Field(default=15, ge=1)


class Constraints(_Strict):
    workers: RoleConstraints = RoleConstraints()
    ps: PSConstraints = PSConstraints()


class QuotaSpec(_Strict):
    cpu_millicores: Millicores = Field(alias="cpu")
    memory_mib: MiB = Field(alias="memory")

    @property
    def resources(self) -> NodeResources:
        return NodeResources(self.cpu_millicores, self.memory_mib)


class PacingSpec(_Strict):
    """When the planner may act. Defaults are DLRover's production values (DOMAIN.md)."""

    replan_interval_s: float = Field(default=300, ge=0)
    worker_stable_s: float = Field(default=60, ge=0)
    min_speed_samples: int = Field(default=5, ge=1)
    ps_change_interval_s: float = Field(default=3600, ge=0)
    sample_window_s: float = Field(default=30, gt=0, description="steady window per sample")
    hot_window: int = Field(default=3, ge=1, description="consecutive hot samples before acting")
    heartbeat_interval_s: float = Field(default=15, gt=0)
    dead_after_s: float = Field(default=600, gt=0)
    pending_timeout_s: float = Field(default=900, gt=0)
    history_window_s: float = Field(default=7 * 86400, gt=0)
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="the master's Prometheus /metrics port; null: off, 0: any free port",
    )


class BackendSpec(_Strict):
    """Where nodes run: local processes, or pods (``kind: kubernetes``; the other fields are
    read only then). Durable state on Kubernetes lives on ``state_pvc`` (a ReadWriteMany claim
    mounted in every pod) or at ``state_url`` (fsspec), never in a container's filesystem;
    ``dlrover-rm submit`` creates a claim for a job that names neither, ``train`` in a pod
    refuses to start without one."""

    kind: Literal["local", "kubernetes"] = "local"
    cpu_limit: Literal["pin", "quota"] = Field(
        default="pin",
        description="local nodes' CPU: 'pin' to ceil(cores) CPUs, or 'quota', a CFS quota of "
        "cores x the period as a pod's CPU limit (needs a writable cgroup cpu controller)",
    )
    namespace: str = "default"
    image: str = "dlrover-rm:latest"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    service_account: str | None = Field(
        default="dlrover-rm-node", description="the node pods' ServiceAccount (no API access)"
    )
    state_pvc: str | None = None
    state_mount_path: str = "/var/lib/dlrover-rm"
    state_url: str | None = None
    resize: bool = Field(default=True, description="in-place CPU resize (pods/resize, k8s 1.33+)")
    termination_grace_s: int = Field(default=30, ge=0)
    resync_s: float = Field(default=10, gt=0, description="relist period of the pod watch")
    api_retry_initial_s: float = Field(default=0.2, gt=0)
    api_retry_max_s: float = Field(default=10, gt=0)
    api_outage_s: float = Field(
        default=300, gt=0, description="how long the API may fail before the job fails"
    )

    @model_validator(mode="after")
    def _check_kubernetes(self) -> BackendSpec:
        if self.kind != "kubernetes":
            return self
        problems = []
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", self.namespace):
            problems.append(
                f"backend.namespace {self.namespace!r} is not a namespace name: use a-z, 0-9 "
                "and '-', at most 63 characters"
            )
        if not self.image.strip():
            problems.append("backend.image is empty: give the image that holds dlrover-rm")
        if self.state_url and "://" not in self.state_url:
            problems.append(
                f"backend.state_url {self.state_url!r} has no scheme: write e.g. "
                "s3://bucket/prefix or file:///mnt/shared"
            )
        if not self.state_mount_path.startswith("/"):
            problems.append(
                f"backend.state_mount_path {self.state_mount_path!r}: use an absolute path"
            )
        if self.api_retry_max_s < self.api_retry_initial_s:
            problems.append(
                "backend.api_retry_max_s must be >= backend.api_retry_initial_s "
                f"({self.api_retry_max_s} < {self.api_retry_initial_s})"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class AllReduceSpec(_Strict):
    """Options of ``strategy: allreduce`` (ignored by PS jobs): the sharding types torchrec's
    planner may choose from (default: every CPU-capable type), per-table overrides, the
    collective backend, and how often the group checkpoints (a shard counts as done once a
    checkpoint holding it is complete). Unknown types or tables are refused when the job
    starts, naming them."""

    sharding: list[str] | None = Field(
        default=None, description="table_wise, column_wise, table_column_wise, data_parallel, ..."
    )
    table_sharding: dict[str, list[str]] = Field(default_factory=dict)
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    checkpoint_interval_s: float = Field(default=10, gt=0)
    keep_checkpoints: int = Field(default=2, ge=1)


class HistorySpec(_Strict):
    url: str | None = Field(default=None, description="SQLAlchemy URL; default a SQLite file")
    on_error: Literal["fail", "cold_start"] = Field(
        default="fail",
        description=(
            "a history store that cannot be read (down, unknown driver, malformed URL): 'fail' "
            "stops plan/profile/train with one line naming the URL (exit 2), 'cold_start' "
            "plans without history and says so"
        ),
    )


class QualitySpec(_Strict):
    """The gate a trained model passes before anything uses it (the next pipeline step, the
    next run's warm start and init_from): a run that misses it ends ``rejected``."""

    min_auc: float | None = Field(
        default=None, gt=0, le=1, description="held-out AUC the model must reach (null: none)"
    )
    max_auc_drop: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="how far below the previous good model of the signature its held-out AUC "
        "may fall (null: no comparison)",
    )


class Signature(_Strict):
    pipeline: str = "default"
    model: str | None = None
    dataset: str | None = None


class PlannerSpec(_Strict):
    """The planner's tunable numbers (``PlannerConfig``), each optional: a field left out keeps
    the planner's default. What a scaling step costs and when one is worth it; the defaults
    were measured in the simulator (issue 10), the pauses should be what your cluster shows."""

    worker_change_pause_s: float | None = Field(
        default=None, ge=0, description="seconds a worker add/resize pauses the job (30)"
    )
    ps_change_pause_s: float | None = Field(
        default=None, ge=0, description="seconds a PS change or migration pauses the job (120)"
    )
    min_remaining_to_sample_s: float | None = Field(
        default=None, ge=0, description="no sampling move with less time left than this (1800)"
    )
    min_saved_fraction: float | None = Field(
        default=None, ge=0, le=1, description="a move must save this share of the time left"
    )
    min_saved_pause_multiple: float | None = Field(
        default=None, ge=0, description="... and at least this many of its pauses (6)"
    )
    min_gain: float | None = Field(
        default=None, ge=0, le=1, description="objective gain below which no move is made"
    )
    min_elasticity: float | None = Field(
        default=None, ge=0, le=1, description="θ: 1 % more cost must buy θ % more throughput"
    )
    memory_gib_per_core: float | None = Field(
        default=None, gt=0, description="GiB of memory that cost as much as one core (4)"
    )
    max_worker_step: int | None = Field(
        default=None, ge=1, le=256, description="most workers added in one step (8)"
    )
    max_worker_growth: float | None = Field(
        default=None, ge=0, le=16, description="... or this share of the current count (3)"
    )
    max_sampling_configs: int | None = Field(
        default=None, ge=0, le=64, description="configurations sampled before the model (4)"
    )
    max_trust_rel_error: float | None = Field(
        default=None, gt=0, le=10, description="model error beyond which it is not used"
    )
    recheck_fraction: float | None = Field(
        default=None, ge=0, le=1, description="no move worth it: re-check after this share"
    )
    recheck_max_s: float | None = Field(
        default=None, gt=0, description="... but at most this many seconds later (1800)"
    )
    hot_ps_cpu_util: float | None = Field(
        default=None, gt=0, le=1, description="a PS this busy is hot (0.9)"
    )
    idle_ps_cpu_util: float | None = Field(
        default=None, ge=0, lt=1, description="PS below this busy are idle (0.4)"
    )

    idle_worker_cpu_util: float | None = Field(
        default=None, ge=0, lt=1,
        description="workers all below this busy get less CPU, once a run (0.6; 0: never)",
    )  # fmt: skip
    ps_memory_defer_s: float | None = Field(
        default=None, ge=0,
        description="a PS OOM predicted this far ahead waits for the next move (1800; 0: never)",
    )  # fmt: skip
    cold_start: Literal["prior", "dlrover"] | None = Field(
        default=None,
        description=(
            "a PS job's first run: 'prior' (counts and CPUs from the bottleneck model's "
            "priors) or 'dlrover' (1 worker + min PS) (prior)"
        ),
    )
    prior_start_elasticity: float | None = Field(
        default=None, gt=0, le=4,
        description="the objective's θ for the 'prior' first run (0.8)",
    )  # fmt: skip
    prior_start_worker_memory_mib: int | None = Field(
        default=None, ge=256,
        description="worker memory (MiB) of the 'prior' first run, at most the cold start's (6144)",
    )  # fmt: skip
    memory_shrink_below: float | None = Field(
        default=None, ge=0, lt=1,
        description="memory measured under this share of the allocation is shrunk (0.7; 0: never)",
    )  # fmt: skip
    throughput_form: Literal["bottleneck", "linear"] | None = Field(
        default=None,
        description=(
            "PS throughput model: 'bottleneck' (priors, predicts from one configuration) "
            "or 'linear' (the paper's form; samples every input first) (bottleneck)"
        ),
    )

    @model_validator(mode="after")
    def _check_utils(self) -> PlannerSpec:
        hot, idle = self.hot_ps_cpu_util, self.idle_ps_cpu_util
        if hot is not None and idle is not None and idle >= hot:
            raise ValueError(
                f"idle_ps_cpu_util ({idle:g}) must be below hot_ps_cpu_util ({hot:g}); "
                "lower idle_ps_cpu_util or raise hot_ps_cpu_util"
            )
        return self

    def overrides(self) -> dict[str, float | int | str]:
        """The fields the spec sets, by ``PlannerConfig`` field name."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


@dataclass(frozen=True)
class StrategyKind:
    """What the spec and the planner know of a training strategy (the runtime's strategies are
    picked in ``runtime/strategies``): whether parameter servers hold the model (PS-set sizes,
    PS memory, the PS throughput models apply) or ranks do."""

    name: str
    has_ps: bool


STRATEGY_KINDS: dict[str, StrategyKind] = {
    "ps": StrategyKind("ps", has_ps=True),
    "allreduce": StrategyKind("allreduce", has_ps=False),
}


class JobSpec(_Strict):
    name: str = Field(min_length=1, pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")
    signature: Signature = Signature()
    model: ModelSpec
    data: DataSpec = DataSpec()
    training: TrainingSpec = TrainingSpec()
    strategy: Literal["ps", "allreduce"] = "ps"
    allreduce: AllReduceSpec = AllReduceSpec()
    quota: QuotaSpec
    constraints: Constraints = Constraints()
    pacing: PacingSpec = PacingSpec()
    backend: BackendSpec = BackendSpec()
    history: HistorySpec = HistorySpec()
    planner: PlannerSpec = PlannerSpec()
    quality: QualitySpec = QualitySpec()

    @model_validator(mode="after")
    def _check_sizes(self) -> JobSpec:
        d, m = self.data, self.model
        if d.source == "synthetic":
            shards = -(-d.rows // self.shard_size) * (self.training.epochs or 1)
            if shards > LIMITS["shards"]:
                raise ValueError(
                    f"data.rows {d.rows:,} x {self.training.epochs or 1} epoch(s) makes "
                    f"{shards:,} shards, more than {LIMITS['shards']:,}; lower data.rows or "
                    "training.epochs, or raise training.batch_size / data.shard_batches"
                )
        if d.source == "criteo_tsv" and (m.dense_features > 13 or len(m.embedding_tables) > 26):
            raise ValueError(
                f"a Criteo TSV has 13 integer and 26 categorical columns; the model asks for "
                f"{m.dense_features} dense features and {len(m.embedding_tables)} tables: lower "
                "model.dense_features or use fewer embedding tables"
            )
        return self

    @model_validator(mode="after")
    def _check_quota(self) -> JobSpec:
        need = self.minimum_job
        q = self.quota.resources
        if not need.fits_in(q):
            raise ValueError(
                f"quota ({q}) is smaller than the minimum job ({need}: "
                f"{self.constraints.workers.min} worker(s) + {self.min_ps} PS at the smallest "
                "node size); raise quota.cpu/quota.memory or lower constraints.*.min"
            )
        return self

    # --- derived values -----------------------------------------------------------------
    @property
    def strategy_kind(self) -> StrategyKind:
        return STRATEGY_KINDS[self.strategy]

    @property
    def min_ps(self) -> int:
        if not self.strategy_kind.has_ps:
            return 0
        return max(self.constraints.ps.min, 1)

    @property
    def minimum_job(self) -> NodeResources:
        w, p = self.constraints.workers, self.constraints.ps
        wmin = NodeResources(
            w.cpu_millicores or MIN_NODE.cpu_millicores, w.memory_mib or MIN_NODE.memory_mib
        )
        pmin = NodeResources(
            p.cpu_millicores or MIN_NODE.cpu_millicores, p.memory_mib or MIN_NODE.memory_mib
        )
        return wmin * max(w.count or w.min, 1) + pmin * (
            p.count if p.count is not None else self.min_ps
        )

    @property
    def samples_total(self) -> int:
        t = self.training
        if t.steps is not None:
            return t.steps * t.batch_size
        return self.data.rows * (t.epochs or 1)

    @property
    def shard_size(self) -> int:
        return self.training.batch_size * self.data.shard_batches

    @property
    def signature_key(self) -> str:
        s = self.signature
        model = s.model or f"{self.model.architecture.value}-{len(self.model.embedding_tables)}t"
        dataset = s.dataset or f"{self.data.source}"
        return f"{s.pipeline}/{model}/{dataset}"

    @property
    def embedding_rows(self) -> int | None:
        """Total static rows, or None when any table is dynamic."""
        total = 0
        for t in self.model.embedding_tables:
            if t.num_embeddings == "dynamic":
                return None
            total += int(t.num_embeddings)
        return total


MIN_NODE = NodeResources(cpu_millicores=500, memory_mib=512)
"""The smallest node the planner will propose (half a core, 512 MiB)."""


# --- loading ---------------------------------------------------------------------------


def _format_loc(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(spec)"


_FIXES = {
    "extra_forbidden": "unknown field; remove it or check its spelling against the example specs",
    "missing": "required; add it",
}


def _problems(err: ValidationError) -> list[str]:
    out = []
    for e in err.errors():
        loc = [p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        msg = _FIXES.get(e["type"]) or str(e["msg"]).removeprefix("Value error, ")
        if (
            e["type"]
            in (
                "greater_than",
                "greater_than_equal",
                "less_than",
                "less_than_equal",
                "finite_number",
                "too_long",
            )
            and "input" in e
        ):
            msg = f"{msg} (got {e['input']!r})"
        out.append(f"{_format_loc(loc)}: {msg}" if loc else msg)
    return out


def _coerce_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``path.to.field=value`` overrides (values parsed as YAML scalars).

    Integer path parts index lists: ``model.embedding_tables.0.num_embeddings=5000``."""
    problems: list[str] = []
    for ov in overrides:
        if "=" not in ov:
            problems.append(f"--set {ov!r}: write it as path.to.field=value")
            continue
        path, _, raw = ov.partition("=")
        keys = [k for k in path.strip().split(".") if k]
        if not keys:
            problems.append(f"--set {ov!r}: the field path is empty")
            continue
        node: Any = data
        ok = True
        for i, k in enumerate(keys[:-1]):
            if isinstance(node, list):
                if not k.isdigit() or int(k) >= len(node):
                    problems.append(f"--set {ov!r}: {'.'.join(keys[: i + 1])} is not a list index")
                    ok = False
                    break
                node = node[int(k)]
            elif isinstance(node, dict):
                node = node.setdefault(k, {})
                if not isinstance(node, (dict, list)):
                    problems.append(f"--set {ov!r}: {'.'.join(keys[: i + 1])} is not a section")
                    ok = False
                    break
            else:
                ok = False
                problems.append(f"--set {ov!r}: {'.'.join(keys[:i])} is not a section")
                break
        if not ok:
            continue
        last = keys[-1]
        if isinstance(node, list):
            if not last.isdigit() or int(last) >= len(node):
                problems.append(f"--set {ov!r}: {path} is not a list index")
                continue
            node[int(last)] = _coerce_scalar(raw)
        else:
            node[last] = _coerce_scalar(raw)
    if problems:
        raise SpecError("invalid --set override(s):", problems=problems)
    return data


def parse_spec(data: Mapping[str, Any], *, source: str = "spec") -> JobSpec:
    try:
        return JobSpec.model_validate(dict(data))
    except ValidationError as e:
        raise SpecError(f"{source} is invalid:", problems=_problems(e)) from None


def read_spec_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise SpecError(f"spec file {str(p)!r} does not exist; pass an existing YAML or JSON file")
    if p.is_dir():
        raise SpecError(f"spec {str(p)!r} is a folder; pass a YAML or JSON file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(
            f"spec file {str(p)!r} is not UTF-8 text (byte {e.start}: {e.reason}); save it as "
            "UTF-8 YAML or JSON"
        ) from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise SpecError(
            f"spec file {str(p)!r} is not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}"
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"spec file {str(p)!r} is not valid YAML{where}: {what}") from None
    if not isinstance(data, dict):
        raise SpecError(
            f"spec file {str(p)!r} must hold a mapping at the top level (name:, model:, quota: ...)"
        )
    return data


def load_spec(
    source: str | os.PathLike[str] | Mapping[str, Any], overrides: Iterable[str] = ()
) -> JobSpec:
    """Load a spec from a file path or a mapping, apply ``--set`` overrides, validate."""
    if isinstance(source, Mapping):
        data = json.loads(json.dumps(dict(source)))  # deep copy, JSON-able only
        label = "spec"
    else:
        data = read_spec_file(source)
        label = f"spec {str(source)!r}"
    data = apply_overrides(data, overrides)
    return parse_spec(data, source=label)


SYNTHETIC_ONLY = ("ids", "seed")
"""``data`` fields that only the synthetic source reads (a file source rejects them)."""


def spec_to_dict(spec: JobSpec) -> dict[str, Any]:
    """JSON-able dict that :func:`load_spec` accepts back (aliases used)."""
    d = spec.model_dump(mode="json", by_alias=True)
    d["planner"] = spec.planner.overrides()  # only what the spec sets (unset: the defaults)
    if spec.data.source in FILE_SOURCES:
        for k in SYNTHETIC_ONLY:
            d["data"].pop(k, None)
        if "rows" not in spec.data.model_fields_set:
            d["data"].pop("rows", None)  # unset: all of the file's rows (set: a cap)
    return d


def use_data_file(data: dict[str, Any], source: str, path: str) -> dict[str, Any]:
    """``data`` (a spec mapping) switched to read ``path`` as ``source``: the synthetic-only
    settings are dropped (a file's rows are its records)."""
    out = json.loads(json.dumps(dict(data)))
    section = out.setdefault("data", {})
    for k in (*SYNTHETIC_ONLY, "rows"):
        section.pop(k, None)
    section.update(source=source, path=path)
    return out


def check_finite(x: float, what: str) -> float:
    if not math.isfinite(x):
        raise InputError(f"{what} must be a finite number, got {x!r}")
    return x
