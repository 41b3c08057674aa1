"""A bad stack config fails before any resource is registered, naming key path, value, expectation, file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from components.config import ConfigError, expand_node_names, parse_config
from components.mockrt import RecordingMocks, RecordingMonitor, raw_from_stack, run_program
from tests.conftest import raw_stack

ROOT = Path(__file__).resolve().parent.parent

P = "gpu-cluster:"


def fails(stack: str, edit: Callable[[dict[str, Any]], None]) -> str:
    """Run the real program with an edited stack; assert it stops before registering anything."""
    config, secrets = raw_stack(stack)
    edit(config)
    monitor = RecordingMonitor(RecordingMocks())
    with pytest.raises(ConfigError) as caught:
        run_program(stack, config, secrets, monitor=monitor)
    assert monitor.records == [], "resources were registered before the config was rejected"
    message = str(caught.value)
    assert message.startswith(f"invalid stack configuration in Pulumi.{stack}.yaml:")
    return message


def test_prod_and_local_are_valid() -> None:
    prod = parse_config(raw_from_stack("prod"), "Pulumi.prod.yaml")
    assert prod.onprem_gpus == 2048
    assert [p.name for p in prod.pools] == ["h100-a", "h200-b"]
    local = parse_config(raw_from_stack("local"), "Pulumi.local.yaml")
    assert local.onprem_gpus == 32


def test_unknown_key_is_named() -> None:
    msg = fails("local", lambda c: c[P + "burst"].update({"openBelowFreeGpu": 3}))
    assert "burst.openBelowFreeGpu: unknown key" in msg
    assert "configuration reference in docs/configuration.md" in msg
    assert "(got 3)" in msg


def test_unknown_top_level_key() -> None:
    msg = fails("local", lambda c: c.update({P + "gpuPools": []}))
    assert "gpuPools: unknown key" in msg


def test_wrong_type() -> None:
    msg = fails("local", lambda c: c[P + "pools"][0].update({"gpusPerNode": "eight"}))
    assert "pools[0].gpusPerNode: Input should be a valid integer" in msg
    assert '(got "eight")' in msg


@pytest.mark.parametrize(
    ("field", "value"),
    [("gpusPerNode", 0), ("gpusPerNode", -8)],
)
def test_zero_or_negative_counts(field: str, value: int) -> None:
    msg = fails("local", lambda c: c[P + "pools"][0].update({field: value}))
    assert f"pools[0].{field}: Input should be greater than 0 (got {value})" in msg


def test_zero_provider_gpus() -> None:
    msg = fails("local", lambda c: c[P + "providers"][0].update({"gpus": 0}))
    assert "providers[0].gpus: Input should be greater than 0 (got 0)" in msg


def test_duplicate_pool_names() -> None:
    def edit(c: dict[str, Any]) -> None:
        c[P + "pools"].append({"name": "local-gpu", "nodes": ["gpu-extra-01"]})

    msg = fails("local", edit)
    assert 'pools[1].name: duplicate pool name; first used at index 0 (got "local-gpu")' in msg


def test_node_in_two_pools() -> None:
    def edit(c: dict[str, Any]) -> None:
        c[P + "pools"].append({"name": "second", "nodes": ["gpu-local-03"]})

    msg = fails("local", edit)
    assert "pools[1].nodes: node is already in pool 'local-gpu' (got \"gpu-local-03\")" in msg


def test_node_listed_twice_in_one_pool() -> None:
    msg = fails("local", lambda c: c[P + "pools"][0].update({"nodes": ["gpu-local-[01-04]", "gpu-local-02"]}))
    assert "pools[0].nodes: node listed twice in the pool (got \"gpu-local-02\")" in msg


def test_system_node_in_gpu_pool() -> None:
    msg = fails("local", lambda c: c[P + "systemPool"].update({"nodes": ["gpu-local-01"]}))
    assert "systemPool.nodes: node is already in GPU pool 'local-gpu'" in msg


def test_inference_outranking_training() -> None:
    inference = {"name": "gpu-inference", "value": 5_000_000}
    msg = fails("local", lambda c: c.update({P + "priorities": {"inference": inference}}))
    assert "priorities: training.value (1000000) must be greater than inference.value (5000000)" in msg


def test_priority_above_api_limit() -> None:
    msg = fails("local", lambda c: c.update({P + "priorities": {"system": {"name": "x", "value": 2_000_000_000}}}))
    assert "priorities.system.value: Input should be less than or equal to 1000000000" in msg


def test_training_as_global_default_refused() -> None:
    msg = fails("local", lambda c: c.update({P + "priorities": {"globalDefault": "training"}}))
    assert "globalDefault 'training' would give every unlabelled pod the power to preempt" in msg


def test_thermal_threshold_above_hardware_limit() -> None:
    msg = fails("local", lambda c: c.update({P + "observability": {"thermalThresholdCelsius": 90}}))
    assert (
        "observability.thermalThresholdCelsius: must be below the hardware slowdown limit of pool 'local-gpu' "
        "(H100-SXM5-80GB: 87 °C, pools[0])" in msg
    )
    assert "(got 90)" in msg


def test_kube_batch_refused_on_modern_kubernetes() -> None:
    msg = fails("local", lambda c: c[P + "scheduling"].update({"engine": "kube-batch"}))
    assert "scheduling.engine: 'kube-batch' supports Kubernetes 1.13–1.24, but kubernetesVersion is 1.35" in msg
    assert "policy/v1beta1" in msg


def test_kube_batch_accepted_on_old_kubernetes() -> None:
    raw = raw_from_stack("local")
    raw["kubernetesVersion"] = "1.24"
    raw["scheduling"] = {"engine": "kube-batch", "install": False}
    cfg = parse_config(raw, "Pulumi.local.yaml")
    assert cfg.scheduling.scheduler_name == "kube-batch"


def test_training_queue_per_pool_defaults_to_more_than_one_pool() -> None:
    prod = parse_config(raw_from_stack("prod"), "Pulumi.prod.yaml")
    assert prod.scheduling.training_queue_per_pool is None
    assert prod.scheduling.training_queue_names(p.name for p in prod.pools) == {
        "h100-a": "training-h100-a", "h200-b": "training-h200-b"}
    local = parse_config(raw_from_stack("local"), "Pulumi.local.yaml")
    assert local.scheduling.training_queue_names(["local-gpu"]) == {"local-gpu": "training"}
    raw = raw_from_stack("prod")
    raw["scheduling"]["trainingQueuePerPool"] = False
    shared = parse_config(raw, "Pulumi.prod.yaml")
    assert shared.scheduling.training_queue_names(["h100-a", "h200-b"]) == {"h100-a": "training", "h200-b": "training"}


def test_per_pool_training_queue_colliding_with_the_inference_queue() -> None:
    msg = fails("prod", lambda c: c[P + "scheduling"].update({"inferenceQueue": {"name": "training-h200-b"}}))
    assert ("scheduling.inferenceQueue.name: collides with the training queue of pool 'h200-b'; choose another "
            'name (got "training-h200-b")') in msg


def test_burst_band_must_be_a_band() -> None:
    msg = fails("local", lambda c: c[P + "burst"].update({"openBelowFreeGpus": 8, "closeAtFreeGpus": 8}))
    assert "burst: closeAtFreeGpus: must exceed openBelowFreeGpus (8) or the taint flaps, got 8" in msg


def test_unpinned_image() -> None:
    msg = fails("local", lambda c: c[P + "inference"]["services"][0].update({"image": "sdxl:latest"}))
    assert "inference.services[0].image: must not use the 'latest' tag" in msg


def test_every_problem_reported_at_once() -> None:
    def edit(c: dict[str, Any]) -> None:
        c[P + "pools"][0]["gpusPerNode"] = 0
        c[P + "burst"]["bogus"] = 1

    msg = fails("local", edit)
    assert "pools[0].gpusPerNode" in msg and "burst.bogus: unknown key" in msg


def test_missing_required_key() -> None:
    msg = fails("local", lambda c: c.pop(P + "pools"))
    assert "pools: required key is missing" in msg


def test_plain_text_credentials_refused() -> None:
    config, secrets = raw_stack("local")
    secrets.discard(P + "localCloudToken")
    with pytest.raises(ConfigError, match=r"providers\[0\].credentialsSecret: config key 'localCloudToken' "
                                          r"holds credentials in plain text"):
        run_program("local", config, secrets)


def test_missing_credentials_named() -> None:
    config, secrets = raw_stack("local")
    config.pop(P + "localCloudToken")
    with pytest.raises(ConfigError, match=r"names config key 'localCloudToken', which is not set; run "
                                          r"`pulumi config set --secret localCloudToken <value>`"):
        run_program("local", config, secrets)


@pytest.mark.parametrize(
    ("patterns", "expected"),
    [
        (["gpu-[001-003]"], ["gpu-001", "gpu-002", "gpu-003"]),
        (["n[8-10].dc1"], ["n8.dc1", "n9.dc1", "n10.dc1"]),
        (["a", "b-[1-2]"], ["a", "b-1", "b-2"]),
    ],
)
def test_node_ranges(patterns: list[str], expected: list[str]) -> None:
    assert expand_node_names(patterns) == expected


def test_backwards_range() -> None:
    msg = fails("local", lambda c: c[P + "pools"][0].update({"nodes": ["gpu-[09-01]"]}))
    assert "range 'gpu-[09-01]' runs backwards (9 > 1)" in msg


def test_configuration_reference_matches_the_schema() -> None:
    from tools.config_doc import DOC, render

    assert DOC.read_text() == render(), "docs/configuration.md is stale: run `python -m tools.config_doc`"


def test_the_reference_says_what_applies_when_a_section_is_left_out() -> None:
    """A section whose default is a whole object applies that object's values when left out, and the fields'
    own defaults when written: the reference says both wherever they differ, and matches the models."""
    from components.config.scheduling import Queue, Scheduling
    from tools.config_doc import render

    text = render()
    left_out = Scheduling().training_queue.weight
    written = Queue.model_fields["weight"].default
    assert left_out != written
    assert (f"- `scheduling.trainingQueue.weight` · integer (> 0) · default `{left_out}` when the section is left "
            f"out, `{written}` when it is written without this key") in text
    assert "- `priorities.training.name` · string · default `gpu-training` when the section is left out; required " \
           "when it is written" in text


def _undescribed(schema: Any, model: str) -> list[str]:
    """``Model.field`` for every property without a description in ``schema`` and the objects nested in it."""
    if isinstance(schema, list):
        return [found for item in schema for found in _undescribed(item, model)]
    if not isinstance(schema, dict):
        return []
    model = schema.get("title", model) if "properties" in schema else model
    missing = [f"{model}.{key}" for key, field in schema.get("properties", {}).items()
               if not str(field.get("description", "")).strip()]
    # Defaults and constants are data: a default PriorityTier's "description" is a value, not a schema.
    return missing + [found for key, value in schema.items() if key not in ("default", "const", "enum", "examples")
                      for found in _undescribed(value, model)]


def test_every_field_of_the_schema_has_a_description() -> None:
    """The docstring under each field is what the reference and editors show; a field without one is a blank."""
    from components.config import ClusterConfig

    schema = ClusterConfig.model_json_schema(by_alias=True)
    missing = _undescribed({k: v for k, v in schema.items() if k != "$defs"}, "ClusterConfig")
    missing += [found for name, model in schema.get("$defs", {}).items() for found in _undescribed(model, name)]
    assert not missing, f"fields without a description (a docstring under the field in components/config/): {missing}"


def test_the_published_stack_schema_matches_the_models_and_accepts_the_committed_stacks() -> None:
    import jsonschema
    import yaml

    from tools.config_doc import SCHEMA, schema_text, stack_schema

    assert SCHEMA.read_text() == schema_text(), "docs/stack-config.schema.json is stale: `python -m tools.config_doc`"
    validator = jsonschema.Draft202012Validator(stack_schema())
    for stack in ("prod", "local"):
        document = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
        assert [e.message for e in validator.iter_errors(document)] == [], stack


@pytest.mark.parametrize(("key", "value", "why"), [
    ("gpu-clustr:burst", {"openBelowFreeGpus": 2}, "secure"),  # a misspelled namespace is no secret either
    ("gpu-cluster:burst", {"replicas": 9}, "greater than the maximum of 5"),
    ("gpu-cluster:burst", {"openBelowFreeGpu": 2}, "Additional properties"),
])
def test_the_published_stack_schema_refuses_what_the_loader_refuses(key: str, value: Any, why: str) -> None:
    import jsonschema
    import yaml

    from tools.config_doc import stack_schema

    document = yaml.safe_load((ROOT / "Pulumi.local.yaml").read_text())
    document["config"][key] = value
    errors = [e.message for e in jsonschema.Draft202012Validator(stack_schema()).iter_errors(document)]
    assert any(why in e for e in errors), errors


# --- Acceptance findings: refused at load, naming the key path and what is wrong ------------------------------


def test_misspelt_signal_class_is_refused_at_load_with_the_valid_names() -> None:
    msg = fails("local", lambda c: c.update({P + "observability": {"health": {"signalClasses": {
        "gpu-temprature": "fatal", "nvlink-errors": "off"}}}}))
    assert ("observability.health.signalClasses: unknown signal(s) gpu-temprature (did you mean 'gpu-temperature' "
            "for 'gpu-temprature'?); the signals are ecc-correctable-storm, ecc-uncorrectable, gpu-temperature, "
            "ib-link-errors, ib-port-down, nvlink-errors, nvlink-recovery, row-remap-failure, xid-degraded, "
            "xid-fatal") in msg


@pytest.mark.parametrize(("cidr", "why"), [
    ("10.64.0.0/33", "prefix length /33 is beyond /32, the longest an IPv4 network has"),
    ("10.64.0.1/12", "has host bits set: the network is '10.64.0.0/12'"),
    ("10.64.0.0", "must end in a prefix length in plain digits"),
    ("10.64.0.0/012", "must end in a prefix length in plain digits"),
    ("10.64.0.0/-1", "must end in a prefix length in plain digits"),
    ("10.640.0.0/12", "is not a network in CIDR notation such as '10.64.0.0/12': '10.640.0.0' is not an IP address"),
    ("fd00::/48", "must be an IPv4 network"),
])
def test_liqo_pod_cidr_is_a_real_ipv4_network(cidr: str, why: str) -> None:
    msg = fails("prod", lambda c: c[P + "providers"][1].update({"localPodCidr": cidr}))
    assert f"providers[1].localPodCidr: {why}" in msg and f'(got "{cidr}")' in msg


@pytest.mark.parametrize(("key", "cidr", "why"), [
    ("apiServerCidrs", "10.0.0.0/33", "prefix length /33 is beyond /32"),
    ("apiServerCidrs", "2001:db8::/129", "prefix length /129 is beyond /128"),
    ("dnsCidrs", "fe80::%eth0/64", "must not carry an IPv6 zone"),
    ("dnsCidrs", "169.254.20.10", "must end in a prefix length"),
])
def test_every_cidr_key_takes_the_one_check(key: str, cidr: str, why: str) -> None:
    msg = fails("local", lambda c: c.update({P + key: ["10.0.0.0/8", cidr]}))
    assert f"{key}[1]: {why}" in msg


def test_ipv6_networks_pass_where_the_key_takes_them() -> None:
    raw = raw_from_stack("local")
    raw["apiServerCidrs"] = ["2001:db8::/32", "10.0.0.0/8"]
    assert parse_config(raw, "Pulumi.local.yaml").api_server_cidrs == ["2001:db8::/32", "10.0.0.0/8"]


def test_a_shared_node_name_names_both_providers() -> None:
    msg = fails("local", lambda c: c[P + "providers"][1].update({"nodeName": "vk-local-cloud"}))
    assert ("providers[1].nodeName: provider 'backup-cloud' (providers[1]) and provider 'local-cloud' (providers[0]) "
            "both name virtual node 'vk-local-cloud'; each provider needs its own nodeName") in msg


def test_a_warm_pool_beyond_the_providers_is_refused_with_both_numbers() -> None:
    # prod: ceil(1.0 x maxReplicas) x gpusPerReplica = 256 + 48 x 4 + 64 = 512 GPUs; providers 256 + 128.
    msg = fails("prod", lambda c: c[P + "burst"].update({"warmPoolShare": 1.0}))
    assert ("burst.warmPoolShare: the warm pool would hold up to 512 GPUs (ceil(warmPoolShare × maxReplicas) × "
            "gpusPerReplica over the inference services), more than the 384 GPUs of the providers it can run on "
            "(lambda-east, dr-cluster)") in msg


def test_a_warm_pool_that_fits_exactly_is_accepted_and_off_without_handover() -> None:
    raw = raw_from_stack("local")
    raw["burst"]["warmPoolShare"] = 1.0  # 24 replicas x 1 GPU on 16 + 8 provider GPUs
    assert parse_config(raw, "Pulumi.local.yaml").burst.warm_pool_share == 1.0
    raw = raw_from_stack("prod")
    raw["burst"].update(warmPoolShare=1.0, handover={"enabled": False})  # no handover: no warm pool is kept
    parse_config(raw, "Pulumi.prod.yaml")


def test_a_gateway_service_warm_pool_counts_only_routable_providers() -> None:
    raw = raw_from_stack("prod")
    raw["inference"]["services"] = [raw["inference"]["services"][1]]  # llama-70b-chat: gateway, 48 x 4 GPUs
    raw["burst"]["warmPoolShare"] = 1.0
    with pytest.raises(ConfigError, match=r"up to 192 GPUs .* the 128 GPUs of the providers it can run on "
                                          r"\(dr-cluster\)"):
        parse_config(raw, "Pulumi.prod.yaml")


@pytest.mark.parametrize("args", [
    ["--node-taints=virtual-node.liqo.io/not-allowed=true:NoExecute"],
    ["--node-taints", "virtual-node.liqo.io/not-allowed=true:NoExecute"],
    ["--node-taints virtual-node.liqo.io/not-allowed=true:NoExecute"],
    ["--enable-storage", "--taint=a:NoSchedule,b=c:NoExecute"],
    ["--taint-effect", "NoExecute"],
    ["-t", "x:noexecute"],
])
def test_provider_args_never_set_a_noexecute_taint(args: list[str]) -> None:
    msg = fails("prod", lambda c: c[P + "providers"][1].update({"extraArgs": args}))
    assert "providers[1].extraArgs: '--" in msg or "providers[1].extraArgs: '-t x:noexecute'" in msg
    assert "sets a NoExecute taint on the virtual node of provider 'dr-cluster'" in msg


def test_provider_args_with_noschedule_taints_pass() -> None:
    raw = raw_from_stack("prod")
    raw["providers"][1]["extraArgs"] = ["--node-taints=team=llm:NoSchedule", "--enable-storage"]
    assert parse_config(raw, "Pulumi.prod.yaml").providers[1].extra_args[0] == "--node-taints=team=llm:NoSchedule"
