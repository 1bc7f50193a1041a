"""A kubeconfig that does not load is one line naming the file and why, exit 2, for both
commands that read the API server (mesh.kube_source.api_client), never a traceback."""
import asyncio

import pytest

from mcp26.mesh.kube_source import KubeConfigError, api_client

BAD = {
    "truncated yaml": ("clusters: [\n", "line 2"),
    "no current context": ("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n", "current-context"),
    "wrong type": ("- just\n- a list\n", "Kubernetes configuration"),
}


@pytest.mark.adversarial
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_kubeconfig_is_a_config_error_naming_the_file(tmp_path, case):
    text, says = BAD[case]
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(KubeConfigError) as e:
        asyncio.run(api_client(str(path)))
    assert str(path) in str(e.value) and says in str(e.value), str(e.value)


@pytest.mark.adversarial
@pytest.mark.parametrize("argv", [["epp", "serve", "--pool", "a/b"], ["xds", "serve"]])
def test_both_commands_say_so_and_exit_2(mcpctl, tmp_path, argv):
    path = tmp_path / "kubeconfig"
    path.write_text(BAD["truncated yaml"][0])
    out = mcpctl(*argv, "--kubeconfig", str(path))
    assert out.returncode == 2 and f"Kubernetes configuration {path}" in out.stderr, out
    assert "Traceback" not in out.stderr
