"""What loading a kubeconfig costs the agent with each candidate library: the import time of
the module that loads it (best of N fresh interpreters), and the resident memory (VmRSS) and
module count of a fresh interpreter that has loaded a token kubeconfig with it, against one that
has only imported what corepin's transport needs anyway (ssl, http.client, json, yaml).

Candidates (each measured only where it is installed; `--python` picks the interpreter, so a
scratch environment holding all three can be measured):
- `corepin`    corepin.kube.config as it stands (whatever library it uses, if any)
- `kubernetes` the official client: kubernetes.config.kube_config.KubeConfigLoader
- `lightkube`  lightkube.config.kubeconfig.KubeConfig
- `kr8s`       kr8s (its KubeAuth loads kubeconfigs)

Usage: .venv/bin/python benchmarks/bench_kubeconfig.py [--python PY] [--runs 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "http://127.0.0.1:6443"}
users:
- name: u
  user: {token: abc}
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
"""

#: What each candidate runs to load the file at argv[1] (after that base).
LOADERS = {
    "none": "pass",
    "corepin": (
        "from corepin.kube.config import load_config\n"
        "load_config(sys.argv[1], env={}).bearer_token()"
    ),
    "kubernetes": (
        "from kubernetes.client import Configuration\n"
        "from kubernetes.config import load_kube_config\n"
        "load_kube_config(sys.argv[1], client_configuration=Configuration())"
    ),
    "lightkube": (
        "from lightkube.config.kubeconfig import KubeConfig\n"
        "KubeConfig.from_file(sys.argv[1]).get()"
    ),
    "kr8s": (
        "import asyncio\nfrom kr8s._auth import KubeAuth\n"
        "async def load():\n    await KubeAuth(kubeconfig=sys.argv[1])\n"
        "asyncio.run(load())"
    ),
}
IMPORTS = {
    "corepin": "corepin.kube.config",
    "kubernetes": "kubernetes.config",
    "lightkube": "lightkube.config.kubeconfig",
    "kr8s": "kr8s",
}
RSS = (
    "import sys, ssl, http.client, json, yaml\nimport corepin.core.errors\n{loader}\n"
    "import re\nprint(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read())[1],"
    " len(sys.modules))"
)


def available(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def import_ms(python: str, module: str, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([python, "-c", f"import {module}"], check=True)
        best = min(best, time.perf_counter() - start)
    return best * 1000


def rss_kb(python: str, candidate: str, config: Path) -> tuple[int, int]:
    code = RSS.format(loader=LOADERS[candidate])
    out = subprocess.run(
        [python, "-c", code, str(config)], check=True, capture_output=True, text=True
    ).stdout.split()
    return int(out[0]), int(out[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config"
        config.write_text(KUBECONFIG)
        bare = import_ms(args.python, "sys", args.runs)
        base_rss, base_modules = rss_kb(args.python, "none", config)
        print(
            f"interpreter start: {bare:.0f} ms; ssl, http.client, yaml and corepin's errors: "
            f"RSS {base_rss / 1024:.1f} MiB, {base_modules} modules"
        )
        heads = ("import ms", "+ms", "RSS MiB", "+MiB", "+mods")
        print(f"{'candidate':<12} " + " ".join(f"{h:>{max(6, len(h))}}" for h in heads))
        for name, module in IMPORTS.items():
            if not available(args.python, module):
                print(f"{name:<12} (not installed)")
                continue
            took = import_ms(args.python, module, args.runs)
            rss, modules = rss_kb(args.python, name, config)
            print(
                f"{name:<12} {took:>10.0f} {took - bare:>6.0f} {rss / 1024:>8.1f} "
                f"{(rss - base_rss) / 1024:>6.1f} {modules - base_modules:>6}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
