"""Where corepin finds the API: --kubeconfig, $KUBECONFIG (merged), $HOME/.kube/config, the
in-cluster service account, --context; what each kubeconfig field turns into (read by the
Kubernetes client library's loaders: exec plugins, auth providers, basic auth, proxy-url);
clear errors for what is unusable."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
from pathlib import Path

import pytest
import yaml

from corepin.core.errors import KubeConfigError
from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.kube.resources import PODS
from corepin.testing.fakeapi import FakeApiServer, TLSMaterial


def kubeconfig(
    path: Path,
    *,
    current: str = "one",
    contexts: dict[str, dict[str, str]] | None = None,
    clusters: dict[str, dict[str, object]] | None = None,
    users: dict[str, dict[str, object]] | None = None,
) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "contexts": [
            {"name": k, "context": v}
            for k, v in (contexts or {"one": {"cluster": "c1", "user": "u1"}}).items()
        ],
        "clusters": [
            {"name": k, "cluster": v}
            for k, v in (clusters or {"c1": {"server": "https://one.example:6443"}}).items()
        ],
        "users": [{"name": k, "user": v} for k, v in (users or {"u1": {"token": "t1"}}).items()],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_explicit_kubeconfig_wins_over_the_environment(tmp_path: Path) -> None:
    explicit = kubeconfig(tmp_path / "explicit")
    other = kubeconfig(tmp_path / "other", clusters={"c1": {"server": "http://other:80"}})
    config = load_config(explicit, env={"KUBECONFIG": str(other)})
    assert config.server == "https://one.example:6443" and config.bearer_token() == "t1"
    assert config.context == "one" and config.namespace == "default"


def test_kubeconfig_list_is_merged_first_file_wins(tmp_path: Path) -> None:
    first = kubeconfig(
        tmp_path / "a",
        current="two",
        contexts={"two": {"cluster": "c2", "user": "u1", "namespace": "team"}},
        clusters={"c1": {"server": "https://first:1"}},
    )
    second = kubeconfig(
        tmp_path / "b",
        current="one",
        clusters={"c1": {"server": "https://second:2"}, "c2": {"server": "https://two:2"}},
    )
    env = {"KUBECONFIG": os.pathsep.join([str(first), str(tmp_path / "absent"), str(second)])}
    config = load_config(None, env=env)
    assert config.context == "two" and config.server == "https://two:2"
    assert config.namespace == "team" and config.bearer_token() == "t1"
    chosen = load_config(None, env=env, context="one")
    assert chosen.server == "https://first:1"


def test_relative_paths_resolve_against_the_kubeconfig_and_data_is_decoded(tmp_path: Path) -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_bytes(pem)
    (tmp_path / "pki" / "key.pem").write_text("key")
    (tmp_path / "token").write_text("from-file\n")
    config_path = kubeconfig(
        tmp_path / "kc",
        clusters={
            "c1": {
                "server": "https://x:1",
                "certificate-authority": "pki/ca.crt",
                "tls-server-name": "kubernetes",
            }
        },
        users={
            "u1": {
                "client-certificate-data": base64.b64encode(pem).decode(),
                "client-key": "pki/key.pem",
                "tokenFile": "token",
            }
        },
    )
    config = load_config(config_path, env={})
    assert config.ca_file == tmp_path / "pki" / "ca.crt"
    presented = config.client_certificate()
    assert presented is not None
    cert, key = presented
    assert cert.read_bytes() == pem, "the -data, decoded into a file the library wrote"
    assert key == tmp_path / "pki" / "key.pem"
    assert config.token_file == tmp_path / "token"
    assert config.bearer_token() == "from-file"
    (tmp_path / "token").write_text("rotated\n")
    assert config.bearer_token() == "rotated", "a token file is read on every request"
    assert config.tls_server_name == "kubernetes"


def test_in_cluster_service_account(tmp_path: Path) -> None:
    root = tmp_path / "sa"
    root.mkdir()
    (root / "token").write_text("sa-token\n")
    (root / "namespace").write_text("corepin-system")
    (root / "ca.crt").write_text("ca")
    config = load_config(
        None,
        env={"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
        service_account_root=root,
    )
    assert config.server == "https://10.96.0.1:443" and config.source == "in-cluster"
    assert config.bearer_token() == "sa-token" and config.namespace == "corepin-system"
    assert config.ca_file == root / "ca.crt"
    (root / "token").write_text("rotated")
    assert config.refresh_credentials(), "after a 401 the token file is read again"
    assert config.bearer_token() == "rotated"
    ipv6 = load_config(
        None,
        env={"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"},
        service_account_root=root,
    )
    assert ipv6.server == "https://[fd00::1]:443"


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: p.write_text(": : :"), "not valid YAML"),
        (lambda p: kubeconfig(p, current="missing"), "context 'missing' is not defined"),
        (
            lambda p: kubeconfig(p, clusters={"c1": {"server": "one.example:6443"}}),
            "has no http(s) server",
        ),
        (
            lambda p: kubeconfig(
                p,
                users={
                    "u1": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1",
                            "command": "sh",
                            "args": ["-c", "echo 'token expired, log in again' >&2; exit 3"],
                        }
                    }
                },
            ),
            "exec: process returned 3. token expired, log in again",
        ),
        (
            lambda p: kubeconfig(p, users={"u1": {"client-key-data": "!!"}}),
            "client-key-data is not valid base64",
        ),
        (
            lambda p: kubeconfig(p, contexts={"one": {"cluster": "nope", "user": "u1"}}),
            "names cluster 'nope'",
        ),
    ],
    ids=[
        "broken YAML",
        "unknown context",
        "server without scheme",
        "failing exec plugin",
        "bad base64",
        "unknown cluster",
    ],
)
def test_unusable_kubeconfigs_are_named_errors(tmp_path: Path, setup: object, message: str) -> None:
    path = tmp_path / "kc"
    setup(path)  # type: ignore[operator]
    with pytest.raises(KubeConfigError) as problem:
        load_config(path, env={})
    assert message in str(problem.value) and str(path) in str(problem.value)
    assert problem.value.exit_code == 4


def test_no_configuration_at_all_says_what_was_tried(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError) as problem:
        load_config(None, env={"HOME": str(tmp_path)}, service_account_root=tmp_path)
    assert str(problem.value) == (
        f"kubeconfig: none found: no --kubeconfig, no $KUBECONFIG, no {tmp_path}/.kube/config, "
        "and not in a pod (KUBERNETES_SERVICE_HOST/PORT unset)"
    )
    assert problem.value.exit_code == 4


def test_home_kubeconfig_is_the_default_without_kubeconfig_variable(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    kubeconfig(home / ".kube" / "config", clusters={"c1": {"server": "https://home:6443"}})
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    config = load_config(None, env={"HOME": str(home), **in_pod}, service_account_root=tmp_path)
    assert config.server == "https://home:6443" and config.source == str(home / ".kube/config")
    listed = kubeconfig(tmp_path / "listed", clusters={"c1": {"server": "https://listed:1"}})
    assert load_config(None, env={"HOME": str(home), "KUBECONFIG": str(listed)}).server == (
        "https://listed:1"
    ), "$KUBECONFIG wins over the home file"


def test_context_chooses_among_the_contexts(tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path / "kc",
        current="one",
        contexts={
            "one": {"cluster": "c1", "user": "u1"},
            "two": {"cluster": "c2", "user": "u2", "namespace": "team"},
        },
        clusters={"c1": {"server": "https://one:1"}, "c2": {"server": "https://two:2"}},
        users={"u1": {"token": "t1"}, "u2": {"token": "t2"}},
    )
    one, two = load_config(path, env={}), load_config(path, env={}, context="two")
    assert (one.context, one.server, one.bearer_token()) == ("one", "https://one:1", "t1")
    assert (two.context, two.server, two.bearer_token(), two.namespace) == (
        "two",
        "https://two:2",
        "t2",
        "team",
    )
    with pytest.raises(KubeConfigError, match="context 'three' is not defined"):
        load_config(path, env={}, context="three")


def test_exec_plugin_token_and_its_environment(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.sh"
    plugin.write_text(
        "#!/bin/sh\n"
        'printf \'{"apiVersion": "client.authentication.k8s.io/v1beta1", '
        '"kind": "ExecCredential", "status": {"token": "%s"}}\' "$PLUGIN_TOKEN"\n'
    )
    plugin.chmod(0o755)
    path = kubeconfig(
        tmp_path / "kc",
        users={
            "u1": {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1beta1",
                    "command": str(plugin),
                    "env": [{"name": "PLUGIN_TOKEN", "value": "from-plugin"}],
                }
            }
        },
    )
    config = load_config(path, env={})
    assert config.bearer_token() == "from-plugin"
    assert config.authorization() == "Bearer from-plugin"


def jwt(claims: dict[str, object]) -> str:
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}.c2ln"


def test_oidc_auth_provider_sends_its_id_token(tmp_path: Path) -> None:
    token = jwt({"sub": "alice", "exp": int(time.time()) + 86400})
    provider = {
        "name": "oidc",
        "config": {"client-id": "kubectl", "id-token": token, "idp-issuer-url": "https://x"},
    }
    path = kubeconfig(tmp_path / "kc", users={"u1": {"auth-provider": provider}})
    assert load_config(path, env={}).bearer_token() == token


def test_basic_auth_and_proxy_url(tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path / "kc",
        clusters={"c1": {"server": "http://one:80", "proxy-url": "http://proxy:3128"}},
        users={"u1": {"username": "admin", "password": "secret"}},
    )
    config = load_config(path, env={})
    assert config.proxy_url == "http://proxy:3128"
    expected = base64.b64encode(b"admin:secret").decode()
    assert config.authorization() == f"Basic {expected}" and config.bearer_token() is None


def test_a_client_built_from_kubeconfig_env_reaches_the_server(
    fake_api: FakeApiServer, tmp_path: Path
) -> None:
    path = fake_api.write_kubeconfig(tmp_path / "kc")
    client = KubeClient.from_config(load_config(None, env={"KUBECONFIG": str(path)}))
    with contextlib.closing(client):
        assert client.list(PODS, "default")["items"] == []


def test_ca_data_in_kubeconfig_verifies_the_server(
    tls_material: TLSMaterial, tmp_path: Path
) -> None:
    with FakeApiServer(tls=tls_material, tokens={"t": "u"}) as api:
        path = api.write_kubeconfig(tmp_path / "kc", token="t", embed=True)
        assert "certificate-authority-data" in path.read_text()
        client = KubeClient.from_config(load_config(path, env={}))
        with contextlib.closing(client):
            assert client.check()["major"] == "1"
