"""Property tests for the stack loader (outside input): any file text, any value under any key, any quantity or
cron text ends in a result or one ConfigError/ValueError, never another exception."""

from __future__ import annotations

import copy
import ipaddress
import string
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity

from components.config import ConfigError, LiqoProvider, expand_node_names, parse_config
from components.config.base import INT32_MAX, check_cron, check_quantity
from components.config.loading import read_stack_file
from components.config.observability import SIGNAL_NAMES
from components.mockrt import RecordingMocks, RecordingMonitor, raw_from_stack, run_program
from tests.conftest import raw_stack

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@SETTINGS
@given(text=st.text(max_size=300))
def test_any_text_is_a_config_or_a_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "Pulumi.fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        config, secrets = read_stack_file(path)
    except ConfigError as error:
        assert str(error).startswith("invalid stack configuration in Pulumi.fuzz.yaml:")
        return
    assert all(isinstance(key, str) and ":" in key for key in config)
    assert secrets <= set(config)


@SETTINGS
@given(body=st.dictionaries(st.text(alphabet=string.ascii_letters, min_size=1, max_size=12), json_values, max_size=5))
def test_a_mapping_reads_back_as_written(tmp_path: Path, body: dict[str, Any]) -> None:
    body = {k: v for k, v in body.items() if not (isinstance(v, dict) and "secure" in v)}
    path = tmp_path / "Pulumi.fuzz.yaml"
    path.write_text(yaml.safe_dump({"config": body}))
    config, secrets = read_stack_file(path)
    assert secrets == set()
    assert config == {f"gpu-cluster:{k}": v for k, v in body.items()}


def test_a_duplicate_key_is_named_with_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.dup.yaml"
    path.write_text("config:\n  gpu-cluster:burst: {}\n  gpu-cluster:burst: {}\n")
    with pytest.raises(ConfigError, match=r"line 3, column 3: not valid YAML: duplicate key 'gpu-cluster:burst' "
                                          r"\(first on line 2\)"):
        read_stack_file(path)


LOCAL = raw_from_stack("local")


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaves(v, (*path, k))] or [path]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))] or [path]
    return [path]


LEAVES = _leaves(LOCAL)


@SETTINGS
@given(where=st.sampled_from(LEAVES), value=json_values | st.just(float("nan")))
def test_any_value_at_any_key_validates_or_is_one_config_error(where: tuple[Any, ...], value: Any) -> None:
    raw = copy.deepcopy(LOCAL)
    node: Any = raw
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    try:
        cfg = parse_config(raw, "Pulumi.local.yaml")
    except ConfigError as error:
        assert error.problems and str(error).startswith("invalid stack configuration in Pulumi.local.yaml:")
        return
    assert cfg.onprem_gpus > 0


@SETTINGS
@given(number=st.integers(min_value=INT32_MAX + 1) | st.integers(max_value=-INT32_MAX - 1))
def test_numbers_kubernetes_cannot_hold_are_refused(number: int) -> None:
    raw = copy.deepcopy(LOCAL)
    raw["inference"]["services"][0]["maxReplicas"] = number
    with pytest.raises(ConfigError, match=r"inference\.services\[0\]\.maxReplicas: is beyond what Kubernetes"):
        parse_config(raw, "Pulumi.local.yaml")


quantities = st.from_regex(r"\A([0-9]{1,6}(\.[0-9]{0,3})?|\.[0-9]{1,3})(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?\Z")


@SETTINGS
@given(text=quantities | st.text(max_size=12))
def test_an_accepted_quantity_parses_as_kubernetes_does(text: str) -> None:
    try:
        check_quantity(text)
    except ValueError:
        return
    assert parse_quantity(text) > 0  # type: ignore[no-untyped-call]


cron_field = st.one_of(st.just("*"), st.integers(0, 70).map(str), st.text(alphabet="*/-,0123456789abcxyz", max_size=6))


@SETTINGS
@given(fields=st.lists(cron_field, min_size=1, max_size=7))
def test_cron_is_accepted_or_refused_with_a_reason(fields: list[str]) -> None:
    text = " ".join(fields)
    try:
        check_cron(text)
    except ValueError as error:
        assert str(error)
        return
    assert len(text.split()) == 5


@SETTINGS
@given(lo=st.integers(0, 10**9), span=st.integers(5000, 10**9))
def test_a_huge_node_range_is_refused_without_expanding_it(lo: int, span: int) -> None:
    with pytest.raises(ValueError, match="would create"):
        expand_node_names([f"gpu-[{lo}-{lo + span}]"])


#: Edge values an operator types by mistake: zero, negatives, the int32 edge, empty and long text, a boolean.
EDGE_VALUES = [0, -1, 1, 2**31 - 1, 10**6, "", "x" * 70, "0", True, False, None, 0.5, [], {}]


@settings(max_examples=25, deadline=None)
@given(where=st.sampled_from(LEAVES), value=st.sampled_from(EDGE_VALUES))
def test_an_accepted_edit_renders_and_a_refused_one_registers_nothing(where: tuple[Any, ...], value: Any) -> None:
    """The whole program, not only the schema: an edge value at any key is refused before any registration, or
    the program renders without a late error."""
    config, secrets = raw_stack("local")
    node: Any = config[f"gpu-cluster:{where[0]}"]
    if len(where) == 1:
        config[f"gpu-cluster:{where[0]}"] = value
    else:
        for part in where[1:-1]:
            node = node[part]
        node[where[-1]] = value
    monitor = RecordingMonitor(RecordingMocks())
    try:
        run_program("local", config, secrets, monitor=monitor)
    except ConfigError:
        assert monitor.records == []
        return
    assert monitor.records


# --- Outside text in the keys that parse it: CIDRs, provider flags, signal names -------------------------------

PROD = raw_from_stack("prod")


def _only_problem_at(error: ConfigError, path: str) -> None:
    assert [p.path for p in error.problems] == [path], error


cidr_like = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="0123456789./:abcdef%", max_size=24),
    st.tuples(st.ip_addresses(), st.integers(-3, 140)).map(lambda t: f"{t[0]}/{t[1]}"),
    st.tuples(st.integers(0, 300), st.integers(0, 300), st.integers(0, 40)).map(lambda t: f"10.{t[0]}.{t[1]}.0/{t[2]}"),
)


@SETTINGS
@given(text=cidr_like)
def test_any_pod_cidr_text_is_an_ipv4_network_or_one_error_at_its_key(text: str) -> None:
    raw = copy.deepcopy(PROD)
    raw["providers"][1]["localPodCidr"] = text
    try:
        cfg = parse_config(raw, "Pulumi.prod.yaml")
    except ConfigError as error:
        _only_problem_at(error, "providers[1].localPodCidr")
        return
    network, provider = ipaddress.ip_network(text, strict=True), cfg.providers[1]
    assert isinstance(provider, LiqoProvider) and provider.local_pod_cidr == text
    assert network.version == 4 and str(network) == text


@SETTINGS
@given(texts=st.lists(cidr_like, min_size=1, max_size=3))
def test_any_api_server_cidr_text_is_a_network_or_one_error_at_its_entry(texts: list[str]) -> None:
    raw = copy.deepcopy(LOCAL)
    raw["apiServerCidrs"] = texts
    try:
        parse_config(raw, "Pulumi.local.yaml")
    except ConfigError as error:
        assert {p.path for p in error.problems} <= {f"apiServerCidrs[{i}]" for i in range(len(texts))}, error
        return
    assert all("/" in t and ipaddress.ip_network(t, strict=True) for t in texts)


@SETTINGS
@given(network=st.ip_addresses(v=4).flatmap(
    lambda ip: st.integers(0, 32).map(lambda bits: ipaddress.ip_network(f"{ip}/{bits}", strict=False))))
def test_every_ipv4_network_is_a_pod_cidr(network: ipaddress.IPv4Network) -> None:
    raw = copy.deepcopy(PROD)
    raw["providers"][1]["localPodCidr"] = str(network)
    provider = parse_config(raw, "Pulumi.prod.yaml").providers[1]
    assert isinstance(provider, LiqoProvider) and provider.local_pod_cidr == str(network)


flag_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["--node-taints", "--taint", "--taint-effect", "-t", "--enable-storage"]),
    st.tuples(st.sampled_from(["--node-taints", "--taint", "--x"]), st.sampled_from(["=", " ", "= "]),
              st.text(alphabet="ab=:,/.-", max_size=8),
              st.sampled_from(["NoExecute", "noexecute", "NoSchedule", "PreferNoSchedule", ""]))
    .map(lambda t: "".join(t)),
)


@SETTINGS
@given(args=st.lists(flag_text, max_size=4))
def test_any_provider_args_pass_only_without_noexecute(args: list[str]) -> None:
    raw = copy.deepcopy(PROD)
    raw["providers"][1]["extraArgs"] = args
    try:
        cfg = parse_config(raw, "Pulumi.prod.yaml")
    except ConfigError as error:
        _only_problem_at(error, "providers[1].extraArgs")
        if any("noexecute" in a.lower() for a in args):
            assert "sets a NoExecute taint on the virtual node of provider 'dr-cluster'" in str(error)
        return
    assert all(a.startswith("--") for a in cfg.providers[1].extra_args)
    assert not any("noexecute" in a.lower() for a in args)


@SETTINGS
@given(names=st.lists(st.text(max_size=20) | st.sampled_from(["gpu-temperature", "xid-fatal", "nvlink-errors"]),
                      max_size=3))
def test_any_signal_class_name_is_known_or_one_error_at_its_key(names: list[str]) -> None:
    raw = copy.deepcopy(LOCAL)
    raw["observability"] = {"health": {"signalClasses": dict.fromkeys(names, "degraded")}}
    try:
        parse_config(raw, "Pulumi.local.yaml")
    except ConfigError as error:
        _only_problem_at(error, "observability.health.signalClasses")
        assert "the signals are " in str(error)
        return
    assert set(names) <= set(SIGNAL_NAMES)
