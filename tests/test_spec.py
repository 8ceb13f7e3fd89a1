"""The job spec: validation messages (one per problem, naming the field), ``--set`` overrides,
derived values, and the round trip spec -> dict -> spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlrover_core.errors import SpecError
from dlrover_core.spec import (
    MIN_NODE,
    JobSpec,
    apply_overrides,
    load_spec,
    parse_spec,
    read_spec_file,
    spec_to_dict,
)
from dlrover_core.types import NodeResources
from tests.factories import BASE_SPEC, make_spec, make_spec_dict

REPO = Path(__file__).resolve().parent.parent


def problems_of(data: dict[str, Any], overrides: tuple[str, ...] = ()) -> list[str]:
    with pytest.raises(SpecError) as ei:
        load_spec(data, overrides)
    assert ei.value.problems, "a SpecError must list its problems"
    # the rendered error holds every problem on its own line
    for p in ei.value.problems:
        assert f"  - {p}" in str(ei.value)
    return ei.value.problems


# --- a valid spec ---------------------------------------------------------------------------


def test_base_spec_is_valid_with_units_parsed() -> None:
    spec = make_spec()
    assert spec.quota.cpu_millicores == 10_000
    assert spec.quota.memory_mib == 40 * 1024
    assert spec.pacing.replan_interval_s == 10
    # defaults from DOMAIN.md where the base spec says nothing
    assert spec.constraints.ps.max == 15
    assert spec.data.ids.new_id_rate == 0.01


def test_example_small_spec_loads() -> None:
    spec = load_spec(REPO / "pipelines" / "specs" / "small.yaml")
    assert spec.name == "small"
    assert spec.quota.resources == NodeResources(2000, 6144)
    assert spec.embedding_rows is None  # it has dynamic tables


@pytest.mark.parametrize(
    ("overrides", "attr", "expected"),
    [
        # 13·64+64 + 64·16+16 + (16 + C(3,2))·64+64 + 64·1+1 = 896+1040+1280+65
        ({}, "model.dense_params", 3281),
        ({}, "min_ps", 1),
        ({"strategy": "allreduce"}, "min_ps", 0),
        ({"constraints__ps__min": 3}, "min_ps", 3),
        ({}, "constraints.ps.max", 15),  # DLRover's PS cap ...
        ({"constraints__ps__min": 2}, "constraints.ps.max", 15),  # ... also with a ps: section
        ({"constraints__workers__min": 2}, "constraints.workers.max", 64),
        ({}, "embedding_rows", 2000),
        ({}, "samples_total", 100_000),  # data.rows × epochs
        ({"training__epochs": 3}, "samples_total", 300_000),
        ({}, "shard_size", 512 * 10),
        ({}, "signature_key", "test/dlrm-2t/synthetic"),
        (
            {"signature": {"pipeline": "p", "model": "m", "dataset": "d"}},
            "signature_key",
            "p/m/d",
        ),
        # 1 worker + 1 PS at the smallest node
        ({}, "minimum_job", NodeResources(1000, 1024)),
        # pins count: 3 workers × 2 CPU / 1 GiB + 2 PS × 0.5 CPU / 512 MiB
        (
            {
                "constraints__workers": {"count": 3, "cpu": 2, "memory": "1Gi"},
                "constraints__ps": {"min": 2},
            },
            "minimum_job",
            NodeResources(3 * 2000 + 2 * 500, 3 * 1024 + 2 * 512),
        ),
    ],
)
def test_derived_values(overrides: dict[str, Any], attr: str, expected: object) -> None:
    obj: Any = make_spec(**overrides)
    for part in attr.split("."):
        obj = getattr(obj, part)
    assert obj == expected


def test_min_node_is_half_a_core_and_512_mib() -> None:
    assert NodeResources(500, 512) == MIN_NODE


# --- invalid input: one message per problem, naming the field ------------------------------


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"bogus": 1}, "bogus", "unknown field"),
        ({"quota__gpu": 1}, "quota.gpu", "unknown field"),
        ({"training__batch_size": -1}, "training.batch_size", "greater than 0 (got -1)"),
        ({"data__rows": 0}, "data.rows", "greater than 0"),
        ({"quota__cpu": -1}, "quota.cpu", ">= 0"),
        ({"constraints__workers__memory": -5}, "constraints.workers.memory", ">= 0"),
        ({"constraints__workers__cpu": -2}, "constraints.workers.cpu", ">= 0"),
        ({"quota__memory": "-1Gi"}, "quota.memory", "write e.g. '4Gi'"),
        ({"quota__memory": "4Gx"}, "quota.memory", "'4Gx' is not a quantity"),
        ({"quota__cpu": "2 cores"}, "quota.cpu", "write e.g. '500m'"),
        ({"quota__cpu": True}, "quota.cpu", "not a quantity"),
        ({"constraints__workers__memory": "yes"}, "constraints.workers.memory", "not a quantity"),
        (
            {"model__embedding_tables": [{"name": "a", "num_embeddings": -5}]},
            "model.embedding_tables[0].num_embeddings",
            "positive number of rows",
        ),
        (
            {"model__embedding_tables": [{"name": "a", "num_embeddings": "lots"}]},
            "model.embedding_tables[0].num_embeddings",
            "'dynamic'",
        ),
        (
            {"model__embedding_tables": [{"name": "a", "num_embeddings": 5, "embedding_dim": 0}]},
            "model.embedding_tables[0].embedding_dim",
            "greater than 0",
        ),
        ({"model__embedding_tables": []}, "model.embedding_tables", "at least 1"),
        (
            {
                "model__embedding_tables": [
                    {"name": "a", "num_embeddings": 5},
                    {"name": "a", "num_embeddings": 6},
                ]
            },
            "model",
            "repeated: a",
        ),
        ({"model__dense_arch": [64, 8]}, "model", "dense_arch must end in embedding_dim (16)"),
        ({"constraints__workers": {"min": 5, "max": 2}}, "constraints.workers", "swap them"),
        ({"constraints__ps": {"count": 20}}, "constraints.ps", "outside [min, max] = [1, 15]"),
        ({"data": {"source": "criteo_tsv"}}, "data", "needs data.path"),
        (
            {"data": {"source": "criteo_tsv", "path": "/nonexistent/day_0.tsv"}},
            "data",
            "'/nonexistent/day_0.tsv' does not exist",
        ),
        ({"name": "Bad Name"}, "name", "pattern"),
        ({"strategy": "horovod"}, "strategy", "'ps' or 'allreduce'"),
        ({"pacing__hot_window": 0}, "pacing.hot_window", "greater than or equal to 1"),
        ({"data__ids__new_id_rate": 2}, "data.ids.new_id_rate", "less than or equal to 1"),
    ],
)
def test_each_invalid_input_gives_one_message_naming_the_field(
    overrides: dict[str, Any], field: str, words: str
) -> None:
    problems = problems_of(make_spec_dict(**overrides))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{field}: "), problems
    assert words in problems[0]


def test_missing_required_sections_each_get_a_message() -> None:
    data = make_spec_dict()
    del data["quota"]
    del data["model"]
    problems = problems_of(data)
    assert sorted(problems) == ["model: required; add it", "quota: required; add it"]


def test_several_problems_give_one_message_each() -> None:
    data = make_spec_dict(
        bogus=1,
        quota__memory="4Gx",
        training__batch_size=-1,
        constraints__workers={"min": 5, "max": 2},
        data={"source": "criteo_tsv", "path": "/nonexistent/day_0.tsv"},
    )
    problems = problems_of(data)
    fields = sorted(p.split(": ", 1)[0] for p in problems)
    assert fields == [
        "bogus",
        "constraints.workers",
        "data",
        "quota.memory",
        "training.batch_size",
    ]


def test_quota_smaller_than_the_minimum_job() -> None:
    # Alone: pydantic runs the model-level check only when every field is valid.
    problems = problems_of(make_spec_dict(quota={"cpu": "900m", "memory": "4Gi"}))
    assert len(problems) == 1
    msg = problems[0]
    assert "quota (900m CPU / 4Gi) is smaller than the minimum job (1 CPU / 1Gi" in msg
    assert "raise quota.cpu/quota.memory or lower constraints.*.min" in msg


@pytest.mark.parametrize(
    ("quota", "constraints", "ok"),
    [
        ({"cpu": 1, "memory": "1Gi"}, {}, True),  # exactly the minimum job
        ({"cpu": 1, "memory": "1023Mi"}, {}, False),
        ({"cpu": 3, "memory": "4Gi"}, {"workers": {"min": 4}}, True),  # 5 × 500m, 5 × 512Mi
        ({"cpu": 2, "memory": "4Gi"}, {"workers": {"min": 4}}, False),
        ({"cpu": 8, "memory": "4Gi"}, {"workers": {"count": 2, "cpu": 4}}, False),  # 8.5 CPU
        ({"cpu": 9, "memory": "4Gi"}, {"workers": {"count": 2, "cpu": 4}}, True),
    ],
)
def test_quota_check_counts_pins_and_minimums(
    quota: dict[str, Any], constraints: dict[str, Any], ok: bool
) -> None:
    data = make_spec_dict(quota=quota, constraints=constraints)
    if ok:
        assert load_spec(data).quota.cpu_millicores == int(float(quota["cpu"]) * 1000)
    else:
        assert "minimum job" in problems_of(data)[0]


def test_existing_criteo_file_is_accepted(tmp_path: Path) -> None:
    tsv = tmp_path / "day_0.tsv"
    tsv.write_text("0\t1\t2\n")
    spec = make_spec(data={"source": "criteo_tsv", "path": str(tsv)})
    assert spec.data.path == str(tsv)


# --- files -----------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_load_from_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"job{suffix}"
    text = json.dumps(BASE_SPEC) if suffix == ".json" else yaml.safe_dump(BASE_SPEC)
    path.write_text(text)
    assert load_spec(path) == make_spec()
    assert load_spec(str(path), ["quota.cpu=20"]).quota.cpu_millicores == 20_000


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("missing.yaml", None, "does not exist"),
        ("bad.yaml", "name: [unclosed", "is not valid YAML"),
        ("bad.json", "{name: 1", "is not valid JSON"),
        ("list.yaml", "- 1\n- 2\n", "mapping at the top level"),
    ],
)
def test_unreadable_spec_files(tmp_path: Path, name: str, text: str | None, words: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(SpecError) as ei:
        read_spec_file(path)
    assert words in ei.value.message
    assert name in ei.value.message


def test_file_problems_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(make_spec_dict(bogus=1)))
    with pytest.raises(SpecError) as ei:
        load_spec(path)
    assert str(path) in ei.value.message
    assert ei.value.problems == [
        "bogus: unknown field; remove it or check its spelling against the example specs"
    ]


# --- --set overrides -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "attr", "expected"),
    [
        ("training.batch_size=1024", "training.batch_size", 1024),
        ("quota.memory=8Gi", "quota.memory_mib", 8192),
        ("quota.cpu=12500m", "quota.cpu_millicores", 12_500),
        ("data.ids.alpha=1.5", "data.ids.alpha", 1.5),
        ("strategy=allreduce", "strategy", "allreduce"),
        ("constraints.workers.count=3", "constraints.workers.count", 3),  # creates sections
        ("model.embedding_tables.1.num_embeddings=5000", "embedding_rows", 6000),
        ("model.embedding_tables.0.num_embeddings=dynamic", "embedding_rows", None),
        ("name = spaced ", "name", "spaced"),  # the YAML scalar is stripped
    ],
)
def test_set_override(override: str, attr: str, expected: object) -> None:
    obj: Any = load_spec(make_spec_dict(), [override])
    for part in attr.split("."):
        obj = getattr(obj, part)
    assert obj == expected


def test_overrides_apply_in_order_and_do_not_touch_the_input() -> None:
    data = make_spec_dict()
    spec = load_spec(data, ["quota.cpu=4", "quota.cpu=6"])
    assert spec.quota.cpu_millicores == 6000
    assert data == make_spec_dict()  # load_spec copied the mapping


def test_override_values_still_go_through_validation() -> None:
    problems = problems_of(make_spec_dict(), ("training.batch_size=-3", "quota.cpu=abc"))
    assert [p.split(":")[0] for p in problems] == ["training.batch_size", "quota.cpu"]


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("noequals", "write it as path.to.field=value"),
        ("=3", "the field path is empty"),
        ("name.x=1", "name is not a section"),
        ("model.embedding_tables.5.num_embeddings=1", "model.embedding_tables.5 is not a list"),
        ("model.embedding_tables.x.name=q", "model.embedding_tables.x is not a list index"),
        ("model.embedding_tables.9=1", "is not a list index"),
        ("model.embedding_tables.0.name.deep=1", "is not a section"),
    ],
)
def test_malformed_override(override: str, words: str) -> None:
    with pytest.raises(SpecError) as ei:
        apply_overrides(make_spec_dict(), [override])
    assert ei.value.problems == [f"--set {override!r}: {words}"] or (
        len(ei.value.problems) == 1 and words in ei.value.problems[0]
    )


def test_every_malformed_override_is_reported() -> None:
    with pytest.raises(SpecError) as ei:
        apply_overrides(make_spec_dict(), ["a", "quota.cpu=2", "=1", "name.x=1"])
    assert len(ei.value.problems) == 3


# --- round trip ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "constraints__workers": {
                "min": 2,
                "max": 8,
                "count": 4,
                "cpu": "1500m",
                "memory": 3000 * 2**20,  # bytes, as in Kubernetes
            },
            "constraints__ps": {"max": 3, "max_cpu": 6, "max_memory": "16Gi"},
            "model__embedding_tables": [
                {"name": "a", "num_embeddings": "dynamic"},
                {"name": "b", "num_embeddings": 77, "embedding_dim": 16},
            ],
            "model__architecture": "dlrm",
            "training": {"batch_size": 128, "epochs": 2, "optimizer": {"name": "adam"}},
            "strategy": "allreduce",
            "backend": {"kind": "kubernetes", "namespace": "ml"},
            "history": {"url": "sqlite:///h.db"},
        },
    ],
)
def test_spec_round_trip(overrides: dict[str, Any]) -> None:
    spec = make_spec(**overrides)
    dumped = spec_to_dict(spec)
    assert json.loads(json.dumps(dumped)) == dumped  # JSON-able
    assert "cpu" in dumped["quota"]  # aliases, the form a user writes
    again = load_spec(dumped)
    assert again == spec
    assert spec_to_dict(again) == dumped


def test_parse_spec_labels_its_source() -> None:
    with pytest.raises(SpecError) as ei:
        parse_spec(make_spec_dict(bogus=1), source="job.yaml")
    assert ei.value.message == "job.yaml is invalid:"


def test_spec_is_frozen() -> None:
    spec = make_spec()
    with pytest.raises(ValueError):
        spec.name = "other"  # type: ignore[misc]
    assert isinstance(spec, JobSpec)


@pytest.mark.parametrize(
    ("value", "mib"),
    [
        (2147483648, 2048),  # a bare number is bytes (Kubernetes)
        ("2147483648", 2048),
        (1, 1),  # one byte still needs a whole MiB
        (0, 0),
        ("1536Mi", 1536),
        ("2Gi", 2048),
        ("1G", 954),  # 10^9 bytes, rounded up
    ],
)
def test_memory_quantities_at_the_boundary(value: Any, mib: int) -> None:
    from dlrover_core.units import memory_quantity_mib

    assert memory_quantity_mib(value) == mib


@pytest.mark.parametrize("value", [True, -1, float("inf"), "4Gx", "lots"])
def test_bad_memory_quantities_are_refused(value: Any) -> None:
    from dlrover_core.errors import InputError
    from dlrover_core.units import memory_quantity_mib

    with pytest.raises(InputError):
        memory_quantity_mib(value)


def test_spec_memory_round_trips_as_a_quantity() -> None:
    spec = make_spec(quota={"cpu": 10, "memory": 3 * 2**30})
    assert spec.quota.memory_mib == 3072
    assert spec_to_dict(spec)["quota"]["memory"] == "3Gi"
    assert load_spec(spec_to_dict(spec)) == spec


def test_training_seed_is_a_non_negative_int_or_null() -> None:
    from dlrover_core.errors import SpecError
    from dlrover_core.spec import load_spec
    from tests.factories import make_spec_dict

    assert load_spec(make_spec_dict()).training.seed is None
    assert load_spec(make_spec_dict(training__seed=7)).training.seed == 7
    with pytest.raises(SpecError, match=r"training\.seed"):
        load_spec(make_spec_dict(training__seed=-1))


@pytest.mark.parametrize("override", ["training.epochs=true", "data.rows=false"])
def test_a_boolean_is_not_a_number(override: str) -> None:
    with pytest.raises(SpecError, match=r"must be a number, not (true|false)"):
        load_spec(make_spec_dict(), [override])


def test_a_yaml_error_names_the_file_and_the_line(tmp_path: Path) -> None:
    p = tmp_path / "job.yaml"
    p.write_text("name: x\nmodel:\n  bad: [\n")
    with pytest.raises(SpecError) as ei:
        load_spec(str(p))
    msg = str(ei.value)
    assert f"spec file '{p}' is not valid YAML (line 4, column 1)" in msg
    assert "unicode string" not in msg
