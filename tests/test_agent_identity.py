"""The local agents run as their own ServiceAccounts (tools/localcluster/agent_identity.py), never as admin.

Without a control plane: the kubeconfig an agent gets authenticates with its token alone, and ``start_agents``
hands each agent the kubeconfig of its own account in the stack's system namespace (or does not start it,
saying why). ``make e2e`` then runs the scenarios with those identities against the real API server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from tools.localcluster import agent_identity, control, stackup
from tools.localcluster.plan import Layout


def test_the_kubeconfig_holds_the_token_and_no_client_certificate(tmp_path: Path) -> None:
    text = agent_identity.kubeconfig_text("https://127.0.0.1:6443", tmp_path / "ca.crt",
                                          "system:serviceaccount:gpu-system:health-guard", "tok.en")
    doc = yaml.safe_load(text)
    assert doc["users"] == [{"name": "system:serviceaccount:gpu-system:health-guard", "user": {"token": "tok.en"}}]
    (tmp_path / "ca.crt").write_text("")
    (tmp_path / "kubeconfig").write_text(text)
    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(tmp_path / "kubeconfig"), client_configuration=configuration)
    assert configuration.host == "https://127.0.0.1:6443"
    assert configuration.api_key == {"BearerToken": "Bearer tok.en"}
    assert configuration.cert_file is None and configuration.key_file is None


@pytest.fixture
def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Layout, dict[str, list[str]],
                                                                      list[tuple[str, str]]]:
    lay = Layout(tmp_path)
    processes: dict[str, list[str]] = {}
    minted: list[tuple[str, str]] = []

    def kubeconfig(_lay: Layout, namespace: str, account: str) -> Path | None:
        minted.append((namespace, account))
        return None if account == "descheduler" else lay.state / f"{account}.kubeconfig"

    monkeypatch.setattr(agent_identity, "agent_kubeconfig", kubeconfig)
    monkeypatch.setattr(control, "start_process", lambda _lay, name, argv, **_: processes.__setitem__(name, argv))
    monkeypatch.setattr(control, "load_ports", lambda _lay: {"descheduler": 10258, "apiserver": 6443})
    monkeypatch.setattr(stackup, "deployed_burst_settings", lambda _lay: "{}\n")
    monkeypatch.setattr(stackup, "deployed_guard_settings", lambda _lay, _overrides: "{}\n")
    monkeypatch.setattr(stackup, "deployed_pool_settings", lambda _lay: "{}\n")
    monkeypatch.setattr(stackup, "deployed_descheduler_policy", lambda _lay: "kind: DeschedulerPolicy\n")
    monkeypatch.setattr(stackup, "_console_script", lambda name: f"/venv/bin/{name}")
    return lay, processes, minted


def _kubeconfig_arg(argv: list[str]) -> str:
    return next(a.split("=", 1)[1] if a.startswith("--kubeconfig=") else argv[i + 1]
                for i, a in enumerate(argv) if a.startswith("--kubeconfig"))


def test_each_agent_gets_its_own_service_account(started: Any) -> None:
    lay, processes, minted = started
    notes = stackup.start_agents(lay, "local")
    assert minted == [("gpu-system", "burst-controller"), ("gpu-system", "health-guard"), ("gpu-system", "node-pools"),
                      ("gpu-system", "descheduler")]
    assert {name: _kubeconfig_arg(argv) for name, argv in processes.items()} == {
        "burst-controller": str(lay.state / "burst-controller.kubeconfig"),
        "health-guard": str(lay.state / "health-guard.kubeconfig"),
        "node-pools": str(lay.state / "node-pools.kubeconfig"),
    }
    assert all(str(lay.kubeconfig) not in argv for argv in processes.values())
    # An account the stack did not deploy: that agent does not start (never falls back to admin), and says so.
    assert notes == ["descheduler: the stack deployed no ServiceAccount gpu-system/descheduler; not started"]
