from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkpoint.config import Config, load_config, parse_overrides, read_job_file
from sparkpoint.errors import ConfigError


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_yaml_flattens_to_dotted_keys(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "job.yaml",
        "job:\n  name: j\nsystems:\n  fl:\n    factory: filelog\n"
        "task:\n  inputs: [fl.a, fl.b]\n  commit.ms: 100\n",
    )
    values = read_job_file(p)
    assert values["job.name"] == "j"
    assert values["systems.fl.factory"] == "filelog"
    assert values["task.inputs"] == "fl.a,fl.b"
    assert values["task.commit.ms"] == "100"


def test_properties_file(tmp_path: Path) -> None:
    p = write(tmp_path, "job.properties", "# c\njob.name=j\nsystems.fl.factory: filelog\n")
    assert read_job_file(p) == {"job.name": "j", "systems.fl.factory": "filelog"}


def test_overrides_win_and_paths_derive_from_data_dir(tmp_path: Path) -> None:
    p = write(tmp_path, "job.yaml", "job: {name: j}\nsystems: {fl: {factory: filelog}}\n")
    c = load_config(p, parse_overrides([f"job.data.dir={tmp_path / 'd'}", "task.commit.ms=7"]))
    assert c.get_int("task.commit.ms") == 7
    assert c.data_dir == (tmp_path / "d").resolve()
    assert c.store_base_dir == c.data_dir / "state"
    assert c["systems.fl.path"] == str(c.data_dir / "streams" / "fl")


def test_default_data_dir_is_under_dot_sparkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    c = load_config(None, {"job.name": "abc"})
    assert c.data_dir == tmp_path.resolve() / ".sparkpoint" / "abc"


def test_invalid_value_names_key_and_allowed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"task.commit.ms='soon' is invalid; allowed: an integer"):
        load_config(None, {"job.name": "j", "task.commit.ms": "soon"})
    with pytest.raises(ConfigError, match="oldest | upcoming"):
        Config(
            {
                "job.name": "j",
                "systems.s.factory": "filelog",
                "systems.s.default.stream.samza.offset.default": "newest",
            }
        )


def test_unknown_key_suggests_the_right_one() -> None:
    with pytest.raises(ConfigError, match="did you mean task.commit.ms"):
        Config({"job.name": "j", "task.comit.ms": "5"})


def test_input_on_unconfigured_system_is_an_error() -> None:
    with pytest.raises(ConfigError, match="system 'kafka' of 'kafka.x' is not configured"):
        Config({"job.name": "j", "systems.fl.factory": "filelog", "task.inputs": "kafka.x"})


def test_missing_required_key() -> None:
    c = Config({"job.name": "j"})
    with pytest.raises(ConfigError, match="missing required config key task.class"):
        c.require("task.class")
    with pytest.raises(ConfigError, match="missing required config key job.name"):
        load_config(None, {})


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_job_file(write(tmp_path, "a.yaml", "job: [unclosed\n"))
    with pytest.raises(ConfigError, match="must be a mapping"):
        read_job_file(write(tmp_path, "b.yaml", "- 1\n"))
    with pytest.raises(ConfigError, match="cannot read job file"):
        read_job_file(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_overrides(["novalue"])


def test_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    """Issue 11: the last of two values won silently (a store became in-memory)."""
    twice = "job:\n  name: x\nstores:\n  s:\n    factory: rocksdb\n  s:\n    factory: in-memory\n"
    with pytest.raises(ConfigError, match=r"line 6: key 's' is given twice .*first on line 4"):
        read_job_file(write(tmp_path, "a.yaml", twice))
    mixed = "stores:\n  s:\n    factory: rocksdb\nstores.s.factory: in-memory\n"
    with pytest.raises(ConfigError, match="key stores.s.factory is given twice"):
        read_job_file(write(tmp_path, "b.yaml", mixed))
    with pytest.raises(ConfigError, match="line 2: key task.commit.ms is given twice"):
        read_job_file(write(tmp_path, "c.properties", "task.commit.ms=1\ntask.commit.ms=2\n"))


def test_a_binary_job_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"job:\n  name: \xff\xfe\x00")
    with pytest.raises(ConfigError, match=r"not a text job file \(byte 13 is not UTF-8\)"):
        read_job_file(path)


def test_a_store_without_a_factory_is_refused_before_the_job_starts() -> None:
    with pytest.raises(ConfigError, match=r"stores.s.key.serde names store s, which has no"):
        Config({"job.name": "j", "systems.fl.factory": "filelog", "stores.s.key.serde": "string"})


def test_a_plugin_declares_its_own_keys() -> None:
    """Issue 14: a backend named as module:Class (or installed by entry point) declares keys
    that are validated like the built-in ones, with their defaults."""
    base = {
        "job.name": "j",
        "systems.fl.factory": "filelog",
        "stores.s.factory": "rocksdb",
        "stores.s.copy.compression": "zstd",
        "job.copy.region": "eu",
    }
    with pytest.raises(ConfigError, match="unknown config key stores.s.copy.compression"):
        Config(base)  # no backend declares it
    keyed = {**base, "stores.s.backup.factories": "keyed_backend:KeyedCopyFactory"}
    config = Config(keyed)
    assert config.get_str("stores.s.copy.compression") == "zstd"
    assert (
        Config({**keyed, "stores.s.copy.compression": ""}).get_str("stores.s.copy.compression")
        == "none"
    )  # the plugin's default
    with pytest.raises(ConfigError, match=r"stores.s.copy.compression='lz4' is invalid; allowed"):
        Config({**keyed, "stores.s.copy.compression": "lz4"})


def test_stream_properties_come_from_the_system_default_and_the_stream() -> None:
    """Topic properties for the system to create a stream with; sparkpoint's own stream keys
    (samza.*, partitions) are not among them."""
    from sparkpoint.model import SystemStream

    c = Config(
        {
            "job.name": "j",
            "systems.k.factory": "filelog",
            "systems.k.default.stream.retention.ms": "1000",
            "systems.k.default.stream.replication.factor": "3",
            "systems.k.default.stream.samza.offset.default": "upcoming",
            "systems.k.default.stream.partitions": "4",
            "streams.clicks.retention.ms": "5000",
            "streams.clicks.segment.bytes": "1048576",
            "streams.clicks.samza.reset.offset": "true",
            "streams.clicks.partitions": "8",
        }
    )
    assert c.stream_properties(SystemStream("k", "clicks")) == {
        "retention.ms": "5000",
        "replication.factor": "3",
        "segment.bytes": "1048576",
    }
    assert c.stream_properties(SystemStream("k", "views")) == {
        "retention.ms": "1000",
        "replication.factor": "3",
    }
    with pytest.raises(ConfigError, match="unknown config key streams.clicks.samza.rest.offset"):
        Config({"job.name": "j", "streams.clicks.samza.rest.offset": "true"})


def test_relative_paths_in_a_job_file_follow_the_job_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    job = jobs / "job.yaml"
    job.write_text("job.name: j\nsystems.fl.factory: filelog\n")
    monkeypatch.chdir(tmp_path)  # anywhere but the job file's directory
    c = load_config(job)
    assert c.data_dir == jobs.resolve() / ".sparkpoint" / "j"  # the default follows it too
    job.write_text("job.name: j\njob.data.dir: data\njob.logged.store.base.dir: local/state\n")
    c = load_config(job)
    assert c.data_dir == jobs.resolve() / "data"
    assert c.store_base_dir == jobs.resolve() / "local" / "state"
    c = load_config(Path("jobs") / "job.yaml", {"job.data.dir": "mine"})
    assert c.data_dir == tmp_path.resolve() / "mine"  # --set: the current directory


def _concrete(pattern: str) -> str:
    return pattern.replace("<s>", "name").replace("<property>", "prop")


def test_every_boolean_key_reads_its_declared_default() -> None:
    """Issue 30: get_bool ignored the declared default (job.host-affinity.enabled read False
    unless the call site repeated True), so the next true-default key read without it was
    silently off."""
    from sparkpoint.config import KEYS

    booleans = [k for k in KEYS if k.allowed.replace(" ", "") == "true|false"]
    assert len(booleans) >= 10
    true_ones = [k for k in booleans if k.default == "true"]
    assert {"job.host-affinity.enabled", "task.transactional.state.checkpoint.enabled"} <= {
        k.pattern for k in true_ones
    }
    for spec in booleans:
        assert Config({}).get_bool(_concrete(spec.pattern)) is (spec.default == "true"), spec
        key = _concrete(spec.pattern)
        values = {key: "false", "stores.name.factory": "in-memory"}
        assert Config(values).get_bool(key) is False


def test_reading_an_undeclared_key_is_an_error_in_the_suite() -> None:
    import os

    assert os.environ.get("SPARKPOINT_STRICT_KEYS") == "1"  # set by conftest for every test
    with pytest.raises(ConfigError, match="config key task.made.up is read but not declared"):
        Config({}).get_bool("task.made.up")
    with pytest.raises(ConfigError, match="is read but not declared"):
        Config({}).get_int("task.made.up.ms")


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("streams.clicks.event.time.feild", "streams.clicks.event.time.field"),
        ("streams.page.views.partitionz", "streams.page.views.partitions"),  # a dotted name
        ("streams.clicks.samza.msg.serd", "streams.clicks.samza.msg.serde"),
    ],
)
def test_a_misspelt_stream_key_is_refused_not_passed_on(key: str, meant: str) -> None:
    """Issue 72: an undeclared streams.<s>.<p> key is passed to the system as a stream
    property, so a typo of a declared one ran with exit 0 and was ignored (no event time, no
    window ever closed). One close to a declared key is refused, naming it."""
    with pytest.raises(ConfigError, match=rf"unknown config key {re.escape(key)}; did you mean "):
        load_config(None, {"job.name": "j", key: "x"})
    with pytest.raises(ConfigError, match=re.escape(meant)):
        load_config(None, {"job.name": "j", key: "x"})


@pytest.mark.parametrize(
    "key", ["retention.ms", "cleanup.policy", "segment.ms", "max.message.bytes"]
)
def test_stream_properties_for_the_system_still_pass(key: str) -> None:
    from sparkpoint.model import SystemStream

    config = load_config(None, {"job.name": "j", f"streams.clicks.{key}": "1"})
    assert config.stream_properties(SystemStream("filelog", "clicks")) == {key: "1"}
